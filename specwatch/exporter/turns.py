"""End-of-stream work waits its turn: a few streams' endings per event-loop iteration.

Streams that start together end together (a closed-loop client, a batch of equal requests), so the
work at their ends (the finish and usage chunks, accounting, the last bytes) arrives in bursts, just
when the same clients send their next requests. Run first-come-first-served, a new request's intake
and its first chunk queue behind every ending of the burst. `Turns` lets the endings go a few per loop
iteration instead (one, or an eighth of those waiting when more wait, so that a long queue still drains
within a few dozen iterations): between two groups the loop polls its sockets and runs everything that
arrived (new requests, first chunks), so time to first token does not wait for a whole burst of other
streams' bookkeeping. Nothing is skipped or reordered within a stream; when the loop is quiet a turn
costs one iteration. Ends that no client waits for (the relay thread wrote them already) take a queue of
their own that lets one go per iteration (`Turns(share=None)`): their counts wait behind everything else.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Turns:
    """A queue of waiters released in arrival order, max(1, waiting // share) per loop iteration (one where
    `share` is None)."""

    SHARE = 8

    def __init__(self, share: int | None = SHARE) -> None:
        self.share = share
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._scheduled = False

    def __len__(self) -> int:
        """Waiters queued, cancelled ones not yet skipped included."""
        return len(self._waiting)

    async def wait(self) -> None:
        """Return at this waiter's turn. A waiter cancelled meanwhile (its client left) stays queued until
        its turn comes and is skipped then, taking none of the share."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        if not self._scheduled:
            self._scheduled = True
            fut.get_loop().call_soon(self._release)
        await fut

    def _release(self) -> None:
        """Wake this iteration's share of the waiters still waiting; come back in the next iteration while
        any remain. (Callbacks scheduled while the loop runs its ready queue run in its next iteration,
        after it has polled its sockets: that is the turn.)"""
        waiting = self._waiting
        share = max(1, len(waiting) // self.share) if self.share else 1
        while waiting and share:
            fut = waiting.popleft()
            if not fut.done():  # a cancelled waiter (its client left) gives up its turn
                fut.set_result(None)
                share -= 1
        if waiting:
            asyncio.get_running_loop().call_soon(self._release)
        else:
            self._scheduled = False
