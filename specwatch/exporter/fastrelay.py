"""The compiled byte path for ordinary content chunks (`_fastrelay.c`): one relay thread per process.

Once a stream's headers are out and the tap has learned the shape of its content chunks
(`sse.PlainReader`), the tap hands the stream to the relay thread: it stops reading both sockets in
the event loop, and the thread reads the upstream, writes every ordinary content chunk to the client
re-framed, and counts what the tap accounts (the text for the output hash, the inter-token gaps per
ITL bucket, the last token's time). At the first chunk that is not ordinary (finish, usage, [DONE],
the end of the body), at a short write, an error, or after `max_seconds`, it hands the stream back:
the tap applies the counts, resumes reading and feeds it the unread bytes. Where the extension is not
built, `AVAILABLE` is False and the tap relays every chunk itself, with the same result.

A stream handed over with `tail=True` may end in the thread: its last chunks (finish, usage, `[DONE]`) go
to the client unchanged as they arrive and the thread writes the end of the chunked body, then hands the
stream back with those chunks' raw bytes (`sent`) for the tap to read and count, and the time of the end
(`ended_at`). Until the tap calls `settled()` for it, `unsettled()` counts it: `/metrics` waits for none
to be left, so a client that has its answer still finds it counted there. No client waits for such a
hand-back, but its next request waits for it (its connection's handler returns after it), so they are taken
one per loop iteration, in the order the thread wrote the ends: a lock-step burst of ends lets each client's
next request in after its own end's hand-back, not after the whole burst's. Every other hand-back (a stream
the tap relays on) is taken as soon as the thread's queue is read.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

try:
    from specwatch.exporter import _fastrelay  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler where the package was installed): the Python relay does it all
    _fastrelay = None

AVAILABLE = _fastrelay is not None

# the reasons a stream comes back (`_fastrelay.c`); ENDED: the thread wrote the body's end
UNUSUAL, EOF, CLIENT, PARTIAL, FLUSH, CANCELLED, ENDED = 1, 2, 3, 4, 5, 6, 7

# (id, reason, errno, unread bytes, unsent bytes, [(text, plain)], ITL bucket counts, gap sum, last token, tokens,
#  the tail's raw chunks written to the client, when the last of them was read, when the body's end was (0: not))
Result = tuple[int, int, int, bytes, bytes, list[tuple[bytes, bool]], tuple[int, ...], float, float, int,
               bytes, float, float]


class FastRelay:
    """The relay thread as the event loop sees it: hand a stream over, get it back by callback.

    Ownership is by id: `start` returns the id the C side assigned, and from then until the stream's callback
    runs (handed back, or taken back with `take_back`), the thread alone reads its upstream socket and writes
    its client socket; the caller has paused both. `held` says which ids the thread holds; taking back an id
    it does not hold is a `KeyError`, never a guess.

    One per process (the exporter's one loop; each `--workers` process has its own thread): the thread's
    queue of handed-back streams is the process's, so a second instance would drain the first one's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_seconds: float) -> None:
        assert _fastrelay is not None
        self.loop, self.max_seconds = loop, max_seconds
        self.fd: int = _fastrelay.init()
        self._waiting: dict[int, Callable[[Result], None]] = {}
        self._ends: deque[Result] = deque()  # hand-backs of streams the thread ended, taken one per iteration
        self._taking_ends = False
        loop.add_reader(self.fd, self._drain)

    def held(self, ident: int) -> bool:
        return ident in self._waiting

    def start(self, up_fd: int, client_fd: int, prefix: bytes, suffix: bytes, bounds: tuple[float, ...],
              last_token: float, on_back: Callable[[Result], None], tail: bool = False) -> int:
        """The thread reads `up_fd` and writes `client_fd` from now on; `on_back` runs in the loop when it hands
        the stream back. With `tail`, the stream may end in the thread (see above). Returns the stream's id."""
        ident: int = _fastrelay.start(up_fd, client_fd, prefix, suffix, bounds, last_token, self.max_seconds,
                                      tail)
        self._waiting[ident] = on_back
        return ident

    def take_back(self, ident: int) -> None:
        """Now, before the thread hands it back (a timeout, the request ending otherwise): the stream's
        callback runs here with what the thread counted so far (reason CANCELLED), or with the result the
        thread had already queued. `KeyError` where the thread does not hold `ident`."""
        if ident not in self._waiting:
            raise KeyError(f"fastrelay: stream {ident} is not held by the relay thread")
        if self._end_now(ident):  # ended and read from the thread's queue already (the thread forgot it)
            return
        result = _fastrelay.cancel(ident)
        if result is None:  # handed back meanwhile: its result is queued
            self._drain()
            self._end_now(ident)  # where it was an end, `_drain` put it in `_ends`
            return
        self._back(result)

    def _end_now(self, ident: int) -> bool:
        """The hand-back of an ended stream waiting in `_ends`, taken now; whether it was there."""
        for result in self._ends:
            if result[0] == ident:
                self._ends.remove(result)
                self._back(result)
                return True
        return False

    @staticmethod
    def settled() -> None:
        """The tap has counted a stream the thread ended (a result with `ended_at`): once per such stream."""
        _fastrelay.settled()

    @staticmethod
    def unsettled() -> int:
        """Streams the thread ended whose counts the tap has not made yet."""
        n: int = _fastrelay.unsettled()
        return n

    def _drain(self) -> None:
        stray = []
        for result in _fastrelay.done():
            if result[0] not in self._waiting:
                stray.append(result[0])
            elif result[12]:  # the thread wrote the body's end: at its turn (`_take_end`)
                self._ends.append(result)
            else:
                self._back(result)
        if self._ends and not self._taking_ends:
            self._taking_ends = True
            self.loop.call_soon(self._take_end)
        if stray:  # a stream this instance never handed over: a second instance in the process (see above)
            raise RuntimeError(f"fastrelay: streams {stray} came back to an instance that did not hand them over")

    def _take_end(self) -> None:
        """One ended stream's hand-back; the next in the loop's next iteration (after what arrived meanwhile)."""
        if self._ends:
            self._back(self._ends.popleft())
        if self._ends:
            self.loop.call_soon(self._take_end)
        else:
            self._taking_ends = False

    def close(self) -> None:
        self.loop.remove_reader(self.fd)
        while self._ends:  # never left waiting: their handlers return, their counts are made
            self._back(self._ends.popleft())

    def _back(self, result: Result) -> None:
        """The stream's callback with its result: the loop owns the stream again."""
        self._waiting.pop(result[0])(result)
