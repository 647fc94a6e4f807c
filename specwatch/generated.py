"""Files written from code (rules, their tests, dashboards, manifests): write them, or with `--check` say
whether the committed copy is current. One exit code for every generator's `--check`; one file
(`write_or_check`) or a folder of them (`write_or_check_folder`, which also removes files no generator
makes any more)."""

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


def stale_files(out: Path, files: dict[str, str], pattern: str = "*.json") -> list[str]:
    """Names in `out` (matching `pattern`) missing, different from `files`, or left over from an older set."""
    have = {p.name: p.read_text() for p in out.glob(pattern)} if out.is_dir() else {}
    return sorted(name for name in files.keys() | have.keys() if files.get(name) != have.get(name))


def write_or_check_folder(out: Path, files: dict[str, str], check: bool, how: str, pattern: str = "*.json") -> int:
    """`write_or_check` for a whole folder: with `check`, EXIT_STALE when a file is missing, different or left
    over; else write the differing files and remove the left-over ones."""
    names = stale_files(out, files, pattern)
    if check:
        for name in names:
            print(f"{out / name} is not current: run `{how}`", file=sys.stderr)
        return EXIT_STALE if names else 0
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        if name in files:
            (out / name).write_text(files[name])
            print(f"wrote {out / name}")
        else:
            (out / name).unlink()
            print(f"removed {out / name}")
    return 0
