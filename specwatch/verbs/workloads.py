"""The `specwatch workloads` verb: write the article's code.jsonl and chat.jsonl with their sha256."""

from __future__ import annotations

import argparse
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("data"))
    parser.add_argument("--lang", choices=["zh", "en"], default="zh",
                        help="zh: the article's exact prompts (default); en: their English translation, for "
                             "English-only models such as SmolLM2")


def run(home: Home, args: argparse.Namespace) -> int:
    from specwatch.workloads import write_article_workloads

    for name, digest in write_article_workloads(args.out, args.lang).items():
        print(f"{digest}  {args.out / name}")
    return EXIT_OK
