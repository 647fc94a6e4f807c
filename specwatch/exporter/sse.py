"""Server-sent events, incrementally: bytes in, complete events (with their exact bytes) out."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Event:
    raw: bytes  # the event exactly as received, terminator included
    data: bytes | None  # the joined `data:` payload, None for a comment-only event

    def json(self) -> Any:
        """The payload as JSON; None for `[DONE]`, comments or anything unparsable."""
        if self.data is None or self.data == b"[DONE]":
            return None
        try:
            return json.loads(self.data)
        except ValueError:
            return None


class SseSplitter:
    """Splits a byte stream at blank lines (LF LF or CRLF CRLF), keeping every byte."""

    def __init__(self, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._buffer = b""
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> Iterator[Event]:
        self._buffer += chunk
        while True:
            cut = _boundary(self._buffer)
            if cut < 0:
                if len(self._buffer) > self.max_event_bytes:  # not SSE as we know it: pass it on whole
                    raw, self._buffer = self._buffer, b""
                    yield Event(raw, None)
                return
            raw, self._buffer = self._buffer[:cut], self._buffer[cut:]
            yield Event(raw, _data(raw))

    def flush(self) -> Iterator[Event]:
        if self._buffer:
            raw, self._buffer = self._buffer, b""
            yield Event(raw, _data(raw))


def _boundary(buf: bytes) -> int:
    candidates = [i + len(sep) for sep in (b"\n\n", b"\r\n\r\n") if (i := buf.find(sep)) >= 0]
    return min(candidates) if candidates else -1


def _data(raw: bytes) -> bytes | None:
    lines = [line[5:].removeprefix(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None
