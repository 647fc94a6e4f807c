"""Copies of the packaged dashboards inside `deploy/k8s/base/dashboards/`, for kustomize's configMapGenerator.

The sources are `specwatch/data/grafana/dashboards/*.json`.
Kustomize only loads files under the kustomization's own folder (its default load restrictor), so the base
keeps byte-for-byte copies: `python -m specwatch.k8s.dashboards` rewrites them, `--check` exits 3 when a
copy differs from its source or one is missing or left over (a test runs the same comparison).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch import resources
from specwatch.generated import EXIT_STALE

REPO = Path(__file__).resolve().parents[2]
SOURCE = resources.DASHBOARDS
OUT = REPO / "deploy" / "k8s" / "base" / "dashboards"


def stale(source: Path = SOURCE, out: Path = OUT) -> list[str]:
    """File names whose copy is missing, different, or has no source any more."""
    wanted = {p.name: p.read_bytes() for p in source.glob("*.json")}
    have = {p.name: p.read_bytes() for p in out.glob("*.json")} if out.is_dir() else {}
    return sorted(name for name in wanted.keys() | have.keys() if wanted.get(name) != have.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.k8s.dashboards", description=__doc__)
    parser.add_argument("--check", action="store_true", help=f"exit {EXIT_STALE} when a copy is stale")
    args = parser.parse_args(argv)
    names = stale()
    if args.check:
        for name in names:
            print(f"{OUT / name} is not current: run `python -m specwatch.k8s.dashboards`", file=sys.stderr)
        return EXIT_STALE if names else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = SOURCE / name
        if source.exists():
            (OUT / name).write_bytes(source.read_bytes())
            print(f"wrote {OUT / name}")
        else:
            (OUT / name).unlink()
            print(f"removed {OUT / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
