"""The committed dashboards: `specwatch/data/grafana/dashboards/*.json` written, or checked, from Python.

`python -m specwatch.grafana.dashboards` rewrites them (`--out` another folder) and removes any left over;
`--check` exits 3 when a committed file differs from a fresh generation, is missing or is left over.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specwatch import resources
from specwatch.files import EXIT_STALE, write_or_check_folder
from specwatch.grafana import acceptance, canary, latency
from specwatch.grafana.board import render
from specwatch.grafana.panels import Json


def all_dashboards() -> dict[str, Json]:
    """File name -> dashboard JSON, for every provisioned dashboard."""
    boards = [acceptance.dashboard(), latency.dashboard(), canary.dashboard()]
    return {f"{board.uid}.json": render(board) for board in boards}


def dumps(board: Json) -> str:
    return json.dumps(board, indent=2, ensure_ascii=False) + "\n"


def files() -> dict[str, str]:
    """File name -> the JSON text of every provisioned dashboard, as written."""
    return {name: dumps(board) for name, board in all_dashboards().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.grafana.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=resources.DASHBOARDS, help="folder for the JSON files")
    parser.add_argument("--check", action="store_true", help=f"exit {EXIT_STALE} when a committed file is not current")
    args = parser.parse_args(argv)
    how = f"python -m specwatch.grafana.dashboards --out {args.out}"
    return write_or_check_folder(args.out, files(), args.check, how)


if __name__ == "__main__":
    sys.exit(main())
