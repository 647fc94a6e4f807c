"""The per-request event log: one JSON line per request, size-bounded by rotation to `<file>.1`.

Several processes (`--workers`) share one file. Each line is a single `write()` to an `O_APPEND`
descriptor: Linux appends it whole, at the end, under the file's inode lock, so lines of different
workers never interleave or tear on a local file system (not promised on NFS). The rotation runs
under an exclusive `flock` on the log's folder; before each line a writer checks (one `stat`) that
its descriptor is still the file under the log's name, and reopens when another worker has moved
it to `<file>.1`, so no line goes to a file about to be replaced.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


class EventLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, _FLAGS, 0o644)

    def write(self, event: dict[str, Any]) -> None:
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        mine = os.fstat(self._fd)
        if not self._is_current(mine) or mine.st_size + len(line) > self.max_bytes // 2:  # halves: file and .1
            self._rotate(len(line))
        written = os.write(self._fd, line)  # one write: the line lands whole (a crash loses at most this line)
        if written < len(line):  # a full disk: the rest, or the OSError that says why
            os.write(self._fd, line[written:])

    def _is_current(self, mine: os.stat_result) -> bool:
        """The descriptor still writes the file under the log's name (not one another worker moved to .1)."""
        try:
            return os.path.samestat(mine, os.stat(self.path))
        except FileNotFoundError:
            return False

    def _rotate(self, incoming: int) -> None:
        """Under the folder's lock: move a full file to .1 unless another worker did, then write to the new one."""
        folder = os.open(self.path.parent, os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)  # one rotation at a time across the workers
            mine = os.fstat(self._fd)
            if self._is_current(mine) and mine.st_size and mine.st_size + incoming > self.max_bytes // 2:
                os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            if not self._is_current(mine):
                os.close(self._fd)
                self._fd = os.open(self.path, _FLAGS, 0o644)
        finally:
            os.close(folder)  # closing releases the lock

    def close(self) -> None:
        os.close(self._fd)
