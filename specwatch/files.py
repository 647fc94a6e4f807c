"""Files the product writes, each whole or not at all, and their digests: the one place that writes through a rename.

`write_text` / `write_json` go through a hidden temporary file beside the target (`.NAME.PID.tmp`, which no `*.yml`,
`*.json` or `*.jsonl` glob a reader uses matches) and a rename, so a reader (Prometheus reloading a rule file or a
file_sd target, a resumed run, `specwatch report`) never sees half a file. `sha256_file` is the one digest of a
file. The generated files (rules, their tests, dashboards, manifests) are written here too, or with `--check`
compared: one exit code for every generator's `--check`; one file (`write_or_check`) or a folder of them
(`write_or_check_folder`, which also removes files no generator makes any more). A leaf: it imports nothing of
specwatch.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_STALE = 3


def write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path`, its folder created, through `.NAME.PID.tmp` and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # a writer of its own: processes may race
    tmp.write_bytes(data)
    tmp.replace(path)


def write_text(path: Path, text: str) -> None:
    """`write_bytes` of `text` in UTF-8."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, value: Any) -> None:
    write_text(path, json.dumps(value, indent=1, ensure_ascii=False) + "\n")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object written by `write_json`, or None when the file is missing, unreadable or not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_or_check(path: Path, text: str, check: bool, how: str = "make generate") -> int:
    """Write `text` to `path`; with `check`, write nothing and return EXIT_STALE when the file differs.

    `how` is the command the message tells the reader to run to bring the file up to date.
    """
    if check:
        if not path.exists() or path.read_text() != text:
            print(f"{path} is not current: run `{how}`", file=sys.stderr)
            return EXIT_STALE
        return 0
    write_text(path, text)
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
            write_text(out / name, files[name])
            print(f"wrote {out / name}")
        else:
            (out / name).unlink()
            print(f"removed {out / name}")
    return 0
