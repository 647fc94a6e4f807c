"""Files written from code (rules, their tests): write them, or with `--check` say whether they are current."""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_STALE = 3


def write_or_check(path: Path, text: str, check: bool) -> int:
    """Write `text` to `path`; with `check`, write nothing and return EXIT_STALE when the file differs."""
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is not current: run `make generate`", file=sys.stderr)
            return EXIT_STALE
        return 0
    path.write_text(text)
    print(f"wrote {path}")
    return 0
