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

from specwatch.generated import EXIT_STALE
from specwatch.grafana.dashboards import all_dashboards, dumps

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "deploy" / "k8s" / "base" / "dashboards"


def wanted() -> dict[str, str]:
    """File name -> the JSON text of every provisioned dashboard."""
    return {name: dumps(board) for name, board in all_dashboards().items()}


def stale(out: Path = OUT) -> list[str]:
    """File names whose copy is missing, different, or has no dashboard any more."""
    want = wanted()
    have = {p.name: p.read_text() for p in out.glob("*.json")} if out.is_dir() else {}
    return sorted(name for name in want.keys() | have.keys() if want.get(name) != have.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.k8s.dashboards", description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT, help="the kustomize base's dashboards folder")
    parser.add_argument("--check", action="store_true", help=f"exit {EXIT_STALE} when a copy is stale")
    args = parser.parse_args(argv)
    out: Path = args.out
    names = stale(out)
    if args.check:
        for name in names:
            print(f"{out / name} is not current: run `python -m specwatch.k8s.dashboards`", file=sys.stderr)
        return EXIT_STALE if names else 0
    out.mkdir(parents=True, exist_ok=True)
    want = wanted()
    for name in names:
        if name in want:
            (out / name).write_text(want[name])
            print(f"wrote {out / name}")
        else:
            (out / name).unlink()
            print(f"removed {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
