"""The dashboards inside `deploy/k8s/base/dashboards/`, for kustomize's configMapGenerator.

The sources are `specwatch/data/grafana/dashboards/*.json`.
Kustomize only loads files under the kustomization's own folder (its default load restrictor), so the base
keeps its own copies, byte for byte the files `specwatch.grafana.dashboards` writes to `grafana/dashboards/`
(rendered from the same code and settings, not copied): `python -m specwatch.k8s.dashboards` rewrites them,
`--check` exits 3 when one differs from a fresh generation or is missing or left over (a test runs the same
comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.files import EXIT_STALE, write_or_check_folder
from specwatch.grafana.dashboards import files

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "deploy" / "k8s" / "base" / "dashboards"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.k8s.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT, help="the kustomize base's dashboards folder")
    parser.add_argument("--check", action="store_true", help=f"exit {EXIT_STALE} when a copy is stale")
    args = parser.parse_args(argv)
    return write_or_check_folder(args.out, files(), args.check, "python -m specwatch.k8s.dashboards")


if __name__ == "__main__":
    sys.exit(main())
