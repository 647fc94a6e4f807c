"""The committed dashboards: `specwatch/data/grafana/dashboards/*.json` written, or checked, from Python.

`python -m specwatch.grafana.dashboards` rewrites them (`--out` another folder); `--check` exits 3
when a committed file differs from a fresh generation (a test runs the same comparison).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specwatch import resources
from specwatch.generated import EXIT_STALE, write_or_check
from specwatch.grafana import acceptance, canary, latency
from specwatch.grafana.board import render
from specwatch.grafana.panels import Json


def all_dashboards() -> dict[str, Json]:
    """File name -> dashboard JSON, for every provisioned dashboard."""
    boards = [acceptance.dashboard(), latency.dashboard(), canary.dashboard()]
    return {f"{board.uid}.json": render(board) for board in boards}


def dumps(board: Json) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def stale(out: Path) -> list[Path]:
    """Committed files that differ from a fresh generation, or are missing."""
    return [out / name for name, board in all_dashboards().items()
            if not (out / name).exists() or (out / name).read_text() != dumps(board)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.grafana.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=resources.DASHBOARDS, help="folder for the JSON files")
    parser.add_argument("--check", action="store_true", help=f"exit {EXIT_STALE} when a committed file is not current")
    args = parser.parse_args(argv)
    out: Path = args.out
    how = f"python -m specwatch.grafana.dashboards --out {out}"
    return max(write_or_check(out / name, dumps(board), args.check, how) for name, board in all_dashboards().items())


if __name__ == "__main__":
    sys.exit(main())
