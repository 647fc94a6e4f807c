"""What every worker of one exporter sees alike: split weights, canary verdicts, down set, in its run folder.

With `--workers N` the admin API's changes land on whichever worker answered. They are kept in
`state.json` (replaced whole, so a reader never sees half of it), written under an exclusive
`flock` on `state.lock`, and announced by an 8-byte version counter in `state.version` that each
worker maps into memory: the router compares it with the version it last read on every request
(one aligned 8-byte read, ~0.2 µs) and rereads the JSON only when it moved. A worker started later
(a restart) reads the same file, so no change is lost across workers or restarts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specwatch.files import write_text

_VERSION = struct.Struct("<Q")

# {"weights": {variant: percent}, "verdicts": {task: {"verdict": ..., "score": ...}}, and `availability`'s
#  "down": {variant: why}, "outages": {variant: {"since", "wait"}}, "returns": {variant: {"at", "wait"}}}
State = dict[str, Any]


class SharedState:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._json, self._lock_path = folder / "state.json", folder / "state.lock"
        fd = os.open(folder / "state.version", os.O_RDWR | os.O_CLOEXEC)
        try:
            self._map = mmap.mmap(fd, _VERSION.size)
        finally:
            os.close(fd)

    @classmethod
    def create(cls, folder: Path, weights: dict[str, float]) -> SharedState:
        """The parent, before any worker starts: the configured split, no verdict, version 0."""
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "state.version").write_bytes(_VERSION.pack(0))
        (folder / "state.lock").touch()
        _write_json(folder / "state.json", {"weights": dict(weights), "verdicts": {}})
        return cls(folder)

    def version(self) -> int:
        """The change counter (cheap: one read of the shared page)."""
        return int(_VERSION.unpack_from(self._map, 0)[0])

    def read(self) -> tuple[int, State]:
        """The version and the state at least as new as it (read the counter first, then the file)."""
        version = self.version()
        return version, json.loads(self._json.read_text())

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive against every other worker's `update` and `locked` sections."""
        with self._lock_path.open("rb") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def update(self, change: Callable[[State], State]) -> State:
        """Apply `change` to the current state under the lock, publish it, bump the version; the new state."""
        with self.locked():
            return self.update_locked(change)

    def update_locked(self, change: Callable[[State], State]) -> State:
        """`update` for a caller that holds `locked()` and has more to do under the same lock."""
        state = change(json.loads(self._json.read_text()))
        _write_json(self._json, state)
        _VERSION.pack_into(self._map, 0, self.version() + 1)  # after the file: a reader of the new version
        return state                                            # finds the new file

    def close(self) -> None:
        self._map.close()


def _write_json(path: Path, state: State) -> None:
    write_text(path, json.dumps(state, sort_keys=True))
