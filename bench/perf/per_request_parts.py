"""The exporter with parts of its per-request work stubbed out, to price each part with `per_request.py`.

Usage: python per_request_parts.py PART[,PART...] -- EXPORTER-ARGS...
PART: none, account (no counters, no event-log line), sse (the response passed through unread: no parse,
no text hash), timeout (no `asyncio.timeout_at`), classify (every request "chat"). A measuring tool: the
stubbed exporter miscounts on purpose and is never a proxy to deploy (docs/benchmarks.md says what it
measured).
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import AsyncIterator
from typing import Any

import specwatch.exporter.main as exporter_main
import specwatch.exporter.relays as relays
import specwatch.exporter.tap as tap

PARTS = ("none", "account", "sse", "timeout", "classify")


def stub(parts: list[str]) -> None:
    if "account" in parts:
        def account(self: tap.Tap, record: Any) -> None:
            record.accounted = True
            if record.ended is not None and not record.ended.done():
                record.ended.set_result(None)
        tap.Tap._account = account  # type: ignore[method-assign]
    if "sse" in parts:
        relays.SseRelay.feed = lambda self, chunk, at=0.0: chunk  # type: ignore[method-assign]
        relays.SseRelay.finish = lambda self, status: b""  # type: ignore[method-assign]
    if "timeout" in parts:
        @contextlib.asynccontextmanager
        async def no_deadline(deadline: float) -> AsyncIterator[None]:
            yield
        shim = types.SimpleNamespace(**{k: getattr(tap.asyncio, k) for k in dir(tap.asyncio) if not k.startswith("__")})
        shim.timeout_at = no_deadline
        tap.asyncio = shim  # type: ignore[assignment]
    if "classify" in parts:
        tap.classify = lambda cfg, path, headers, parsed: "chat"  # type: ignore[assignment]


def main() -> int:
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    parts = sys.argv[1].split(",")
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"per_request_parts.py: unknown part(s) {unknown}; expected some of {PARTS}", file=sys.stderr)
        return 2
    stub(parts)
    return exporter_main.main(sys.argv[3:])


if __name__ == "__main__":
    sys.exit(main())
