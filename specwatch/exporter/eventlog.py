"""The per-request event log: one JSON line per request, size-bounded by rotation to `<file>.1`."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class EventLog:
    def __init__(self, path: Path, max_bytes: int) -> None:
        self.path, self.max_bytes = path, max_bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", encoding="utf-8")

    def write(self, event: dict[str, Any]) -> None:
        line = json.dumps(event, separators=(",", ":")) + "\n"
        if self._file.tell() + len(line) > self.max_bytes // 2:  # two halves: the current file and .1
            self._file.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(line)
        self._file.flush()  # a crash loses at most the line being written

    def close(self) -> None:
        self._file.close()
