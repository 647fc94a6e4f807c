"""Files written from code (rules, their tests, dashboards, manifests): write them, or with `--check` say
whether the committed copy is current. One exit code for every generator's `--check`."""

from __future__ import annotations

import sys
from pathlib import Path

EXIT_STALE = 3


def write_or_check(path: Path, text: str, check: bool, how: str = "make generate") -> int:
    """Write `text` to `path`; with `check`, write nothing and return EXIT_STALE when the file differs.

    `how` is the command the message tells the reader to run to bring the file up to date.
    """
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is not current: run `{how}`", file=sys.stderr)
            return EXIT_STALE
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0
