"""The compiled relay thread on real sockets: what it takes, what it hands back, and when.

Socket pairs stand for the upstream connection (the test writes vLLM's chunked SSE bytes into one end,
the thread reads the other) and the client connection (the thread writes one end, the test reads the
other). Each case hands a stream over as the tap does and checks the bytes the client got and the
result the thread handed back: reason, unread and unsent bytes, text segments, ITL bucket counts.
"""

from __future__ import annotations

import errno
import json
import random
import select
import socket
import time
from collections.abc import Iterator

import pytest

from specwatch.exporter import fastrelay
from specwatch.exporter.sse import PlainReader

pytestmark = pytest.mark.skipif(not fastrelay.AVAILABLE, reason="the compiled relay is not built")
relay = fastrelay._fastrelay

BOUNDS = (0.001, 0.01, 0.1, 1.0, float("inf"))


def event(content: str | None = None, finish: str | None = None, ascii_only: bool = True) -> bytes:
    delta = {} if content is None else {"content": content}
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=ascii_only).encode() + b"\n\n"


def framed(payload: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(payload), payload)


def shape() -> tuple[bytes, bytes]:
    """The bytes around a content chunk's text, as the tap's reader learns them."""
    reader = PlainReader()
    assert reader.text(event("x")[6:-2]) == b"x"
    assert reader.prefix is not None
    return reader.prefix, reader.suffix


class Pair:
    """An upstream socket pair and a client socket pair, non-blocking on the thread's side."""

    def __init__(self) -> None:
        self.up_test, self.up_thread = socket.socketpair()
        self.client_thread, self.client_test = socket.socketpair()
        for s in (self.up_thread, self.client_thread):
            s.setblocking(False)
        self.client_test.settimeout(5)

    def close(self) -> None:
        for s in (self.up_test, self.up_thread, self.client_thread, self.client_test):
            s.close()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    yield p
    p.close()


@pytest.fixture(scope="module")
def done_fd() -> int:
    return int(relay.init())


def start(pair: Pair, last_token: float, max_seconds: float = 10.0, tail: bool = False) -> int:
    prefix, suffix = shape()
    ident = relay.start(pair.up_thread.fileno(), pair.client_thread.fileno(), prefix, suffix, BOUNDS, last_token,
                        max_seconds, tail)
    assert isinstance(ident, int)
    return ident


def back(done_fd: int, timeout: float = 5.0) -> tuple:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([done_fd], [], [], 0.2)
        results = relay.done()
        if results:
            assert len(results) == 1, results
            return tuple(results[0])
    raise AssertionError("the thread handed nothing back")


def read_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        piece = sock.recv(n - len(out))
        assert piece, out
        out += piece
    return out


def test_ordinary_chunks_are_relayed_reframed_and_counted_until_the_finish_chunk(pair: Pair, done_fd: int) -> None:
    before = time.perf_counter()
    handed = start(pair, before)
    texts = ["Hello", " world", ",", " again"]
    for text in texts:
        pair.up_test.sendall(framed(event(text)))
        time.sleep(0.02)
    rest = framed(event(finish="stop")) + framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    pair.up_test.sendall(rest)
    got = read_exactly(pair.client_test, sum(len(framed(event(t))) for t in texts))
    assert got == b"".join(framed(event(t)) for t in texts)  # the same chunks, framed for the client
    ident, reason, _, unread, unsent, segments, counts, gap_sum, last_token, tokens = back(done_fd)[:10]
    assert (ident, reason, unread, unsent, tokens) == (handed, fastrelay.UNUSUAL, rest, b"", 4)
    assert segments == [("".join(texts).encode(), True)]  # plain ASCII runs merge into one segment
    assert sum(counts) == 4 and counts[0] <= 1 and counts[2] >= 3  # ~20 ms gaps: the (0.01, 0.1] bucket
    assert 0.05 < gap_sum < 2 and before < last_token <= time.perf_counter()


USAGE = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],' \
        b'"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4}}\n\n'


def test_a_stream_that_may_end_in_the_thread_gets_its_tail_and_end_written_and_handed_back_raw(
        pair: Pair, done_fd: int) -> None:
    """`tail`: the finish, usage and [DONE] chunks go out unchanged as they come, then the body's end; the tail's
    raw bytes come back for the tap to count, with the time the end was written, and the end stays unsettled
    until the tap says it has counted it."""
    handed = start(pair, time.perf_counter(), tail=True)
    texts = ["Hello", " world"]
    head = b"".join(framed(event(t)) for t in texts)
    finish = framed(event(finish="stop"))
    pair.up_test.sendall(head)
    time.sleep(0.02)
    pair.up_test.sendall(finish)  # the finish chunk alone: it goes out at once, before the rest has come
    assert read_exactly(pair.client_test, len(head) + len(finish)) == head + finish
    before_end = time.perf_counter()
    tail = framed(USAGE) + framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    pair.up_test.sendall(tail)
    assert read_exactly(pair.client_test, len(tail)) == tail  # the client has it all, the end of the body too
    ident, reason, _, unread, unsent, segments, _, _, _, tokens, sent, tail_at, ended_at = back(done_fd)
    assert (ident, reason, unread, unsent, tokens) == (handed, fastrelay.ENDED, b"", b"", 2)
    assert segments == [(b"Hello world", True)]
    assert sent == finish + tail  # every tail byte as read, for the tap's parser (the upstream's end included)
    assert before_end <= tail_at <= ended_at <= time.perf_counter()
    assert relay.unsettled() == 1
    relay.settled()
    assert relay.unsettled() == 0


@pytest.mark.parametrize("case", ["trailers", "content after the tail", "a long tail", "no tail allowed"])
def test_a_tail_the_thread_does_not_end_goes_back_with_what_it_wrote_and_the_rest_unread(
        pair: Pair, done_fd: int, case: str) -> None:
    """Trailers on the body's end, an ordinary content chunk after the tail began (its text must follow the tail's
    in the count), more than 16 tail chunks, or a stream not allowed to end here: back to the tap, the chunks
    written so far in `sent`, the rest unread, nothing written twice and nothing lost."""
    start(pair, time.perf_counter(), tail=case != "no tail allowed")
    finish = framed(event(finish="stop"))
    if case == "trailers":
        written, rest = finish + framed(b"data: [DONE]\n\n"), b"0\r\nX-Trailer: 1\r\n\r\n"
    elif case == "content after the tail":
        written, rest = finish, framed(event("late")) + b"0\r\n\r\n"
    elif case == "a long tail":
        written, rest = finish * 16, finish + b"0\r\n\r\n"
    else:
        written, rest = b"", finish + b"0\r\n\r\n"
    pair.up_test.sendall(written + rest)
    result = back(done_fd)
    assert (result[1], result[3], result[4], result[10], result[12]) == (fastrelay.UNUSUAL, rest, b"", written, 0.0)
    assert read_exactly(pair.client_test, len(written)) == written if written else True
    pair.client_test.setblocking(False)
    with pytest.raises(BlockingIOError):
        pair.client_test.recv(1)  # nothing more: the rest is the tap's to relay
    assert relay.unsettled() == 0


def test_escaped_and_non_ascii_text_are_segments_of_their_own_and_a_partial_chunk_waits(
        pair: Pair, done_fd: int) -> None:
    start(pair, time.perf_counter())
    whole = framed(event("a\nb\"c")) + framed(event("日本", ascii_only=False))
    pair.up_test.sendall(whole[:10])  # a size line and a bit: nothing to take yet
    time.sleep(0.05)
    pair.up_test.sendall(whole[10:] + framed(event(finish="length")))
    assert read_exactly(pair.client_test, len(whole)) == whole
    result = back(done_fd)
    assert result[1] == fastrelay.UNUSUAL and result[9] == 2
    assert result[5] == [(rb'a\nb\"c', False), ("日本".encode(), False)]  # decoded by the tap, one by one


@pytest.mark.parametrize("body", [b"a\x01b", b"a\\xb", b"\xff", b"\xed\xa0", b'a"b'])
def test_a_body_the_pattern_would_not_take_goes_back_unread(pair: Pair, done_fd: int, body: bytes) -> None:
    prefix, suffix = shape()
    start(pair, time.perf_counter())
    odd = framed(b"data: " + prefix + body + suffix + b"\n\n")
    pair.up_test.sendall(framed(event("ok")) + odd)
    assert read_exactly(pair.client_test, len(framed(event("ok")))) == framed(event("ok"))
    result = back(done_fd)
    assert (result[1], result[3], result[9]) == (fastrelay.UNUSUAL, odd, 1)


def test_a_client_gone_comes_back_with_its_error(pair: Pair, done_fd: int) -> None:
    start(pair, time.perf_counter())
    pair.client_test.close()
    pair.up_test.sendall(framed(event("lost")))
    result = back(done_fd)
    assert result[1] == fastrelay.CLIENT and result[2] in (errno.EPIPE, errno.ECONNRESET)


def test_a_client_that_does_not_read_comes_back_with_the_unsent_bytes_and_the_unread_rest(
        pair: Pair, done_fd: int) -> None:
    pair.client_thread.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    start(pair, time.perf_counter())
    big = [framed(event("x" * 3000)) for _ in range(200)]
    stream = b"".join(big)
    sent = 0
    pair.up_test.setblocking(False)
    while sent < len(stream):  # until the thread stops reading: the client side is full
        try:
            sent += pair.up_test.send(stream[sent:sent + 65536])
        except BlockingIOError:
            break
    result = back(done_fd)
    assert result[1] == fastrelay.PARTIAL and result[4], result[:3]
    # what reached the client, what came back unsent and unread, and what is still in the socket: the stream
    pair.client_test.setblocking(False)
    got, remaining = drain(pair.client_test), drain(pair.up_thread)
    assert got + result[4] == stream[:len(got) + len(result[4])]
    assert got + result[4] + result[3] + remaining == stream[:sent]


def drain(sock: socket.socket) -> bytes:
    """Everything a non-blocking socket holds now."""
    out = b""
    while True:
        try:
            piece = sock.recv(1 << 20)
        except BlockingIOError:
            return out
        if not piece:
            return out
        out += piece


def test_cancel_returns_the_counts_so_far_and_the_upstream_eof_is_left_for_the_loop(pair: Pair, done_fd: int) -> None:
    handle = start(pair, time.perf_counter())
    pair.up_test.sendall(framed(event("one")))
    read_exactly(pair.client_test, len(framed(event("one"))))
    result = relay.cancel(handle)
    assert result is not None and result[1] == fastrelay.CANCELLED and result[9] == 1
    assert result[5] == [(b"one", True)]
    # a second stream on the same sockets: the upstream closes, the thread hands it back without reading
    start(pair, time.perf_counter())
    pair.up_test.shutdown(socket.SHUT_WR)
    result = back(done_fd)
    assert (result[1], result[3], result[9]) == (fastrelay.EOF, b"", 0)
    assert pair.up_thread.recv(10) == b""  # the EOF is still there for the event loop's own read


def test_a_stream_held_longer_than_max_seconds_comes_back_to_flush_its_gaps(pair: Pair, done_fd: int) -> None:
    start(pair, time.perf_counter(), max_seconds=0.2)
    pair.up_test.sendall(framed(event("a")))
    time.sleep(0.3)
    pair.up_test.sendall(framed(event("b")))
    result = back(done_fd)
    assert result[1] == fastrelay.FLUSH and result[9] == 2 and result[3] == b""


def test_ids_are_the_only_handles_and_an_unknown_one_is_an_error(pair: Pair, done_fd: int) -> None:
    with pytest.raises(KeyError, match="no stream 123456789"):
        relay.cancel(123456789)  # never handed over: an error, not a dereference
    ident = start(pair, time.perf_counter())
    assert relay.cancel(ident) is not None
    with pytest.raises(KeyError):
        relay.cancel(ident)  # taken back once: the id is gone
    ident = start(pair, time.perf_counter())
    pair.up_test.shutdown(socket.SHUT_WR)  # handed back (EOF), not drained yet: known, its result queued
    assert select.select([done_fd], [], [], 5)[0], "the thread did not hand the stream back"
    assert relay.cancel(ident) is None
    assert back(done_fd)[0] == ident
    with pytest.raises(KeyError):
        relay.cancel(ident)


def test_the_loop_side_refuses_to_take_back_an_id_it_did_not_hand_over() -> None:
    import asyncio

    async def main() -> None:
        fast = fastrelay.FastRelay(asyncio.get_running_loop(), 1.0)
        try:
            with pytest.raises(KeyError, match="not held by the relay thread"):
                fast.take_back(42)
        finally:
            fast.close()

    asyncio.run(main())


def test_ended_streams_come_back_one_per_loop_iteration_and_a_queued_one_is_taken_back_at_once() -> None:
    """Four streams the thread ends before the loop reads its queue: their hand-backs run one per loop iteration
    (what each schedules runs before the next one: a client's next request waits for its own end's hand-back,
    not the whole burst's), and `take_back` of one still queued runs its callback then and there (the thread has
    forgotten it: `cancel` would not know its id)."""
    import asyncio

    async def main() -> tuple[list[str], str]:
        loop = asyncio.get_running_loop()
        fast = fastrelay.FastRelay(loop, 10.0)
        pairs = {name: Pair() for name in "ABCD"}
        order: list[str] = []
        prefix, suffix = shape()
        try:
            ids = {}
            for name, p in pairs.items():
                def on_back(result: fastrelay.Result, name: str = name) -> None:
                    assert result[1] == fastrelay.ENDED and result[12] > 0, result[:3]
                    order.append(name)
                    loop.call_soon(order.append, "after " + name)
                ids[name] = fast.start(p.up_thread.fileno(), p.client_thread.fileno(), prefix, suffix, BOUNDS,
                                       time.perf_counter(), on_back, tail=True)
            body = (framed(event("Hi")) + framed(event(finish="stop")) + framed(USAGE) + framed(b"data: [DONE]\n\n")
                    + b"0\r\n\r\n")
            for p in pairs.values():  # the loop does not run meanwhile: the four results wait in the thread's queue
                p.up_test.sendall(body)
            for p in pairs.values():
                assert read_exactly(p.client_test, len(body)) == body
            deadline = time.monotonic() + 5
            while relay.unsettled() < 4:
                assert time.monotonic() < deadline, relay.unsettled()
                time.sleep(0.01)
            while not fast._ends:  # the loop reads the queue: all four wait their turn
                await asyncio.sleep(0)
            last = fast._ends[-1][0]
            name = next(n for n, i in ids.items() if i == last)
            before = len(order)
            fast.take_back(last)
            assert order[before:] == [name] and not fast.held(last), order
            while len(order) < 8:
                await asyncio.sleep(0)
            return order, name
        finally:
            fast.close()
            for _ in range(4):
                relay.settled()
            for p in pairs.values():
                p.close()

    order, taken_back = asyncio.run(main())
    assert sorted(x for x in order if not x.startswith("after ")) == list("ABCD"), order
    by_loop = [x for x in order if not x.startswith("after ") and x != taken_back]
    for name, following in zip(by_loop, by_loop[1:], strict=False):  # one per iteration: its follow-up first
        assert order.index("after " + name) < order.index(following), order


def back_through_memory_errors(done_fd: int, timeout: float = 5.0) -> tuple:
    """`back`, where building the result may fail for want of memory: it stays queued and is signalled again."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        select.select([done_fd], [], [], 0.2)
        try:
            results = relay.done()
        except MemoryError:
            continue
        if results:
            assert len(results) == 1, results
            return tuple(results[0])
    raise AssertionError("the thread handed nothing back")


@pytest.mark.parametrize("nth", range(1, 19))  # 18: the result; from 19 on nothing fails
def test_every_allocation_failure_hands_the_stream_back_with_all_its_bytes(pair: Pair, done_fd: int, nth: int) -> None:
    """The n-th allocation from the hand-over on fails (the stream's own, its buffers as they grow, the result):
    whatever fails, the stream comes back, and what reached the client, what came back unsent and unread, and
    what is still in the socket are the stream, byte for byte; the texts counted are those of the chunks sent."""
    texts = [f"t{i}-" * (1 + i * 40) for i in range(24)]  # growing chunks: the buffers grow and reallocate
    chunks = [framed(event(t)) for t in texts]
    stream = b"".join(chunks) + framed(event(finish="stop"))
    relay._fail_allocation(nth)
    try:
        try:
            ident = start(pair, time.perf_counter())
        except MemoryError:
            return  # refused at the hand-over: the tap relays this stream in Python (tests/test_exporter_fastpath.py)
        pair.up_test.sendall(stream)
        result = back_through_memory_errors(done_fd)
    finally:
        relay._fail_allocation(0)
    assert result[0] == ident
    pair.client_test.setblocking(False)
    pair.up_test.shutdown(socket.SHUT_WR)
    got, unread, unsent = drain(pair.client_test), result[3], result[4]
    assert got + unsent + unread + drain(pair.up_thread) == stream
    taken = len(got + unsent)
    sent = [c for c in chunks if sum(map(len, chunks[:chunks.index(c) + 1])) <= taken]
    assert got + unsent == b"".join(sent)  # whole chunks only
    assert b"".join(t for t, _ in result[5]) == "".join(texts[:len(sent)]).encode() and result[9] == len(sent)


def test_a_result_without_memory_stays_queued_and_comes_back_at_the_next_call(pair: Pair, done_fd: int) -> None:
    ident = start(pair, time.perf_counter())
    pair.up_test.sendall(framed(event("kept")) + framed(event(finish="stop")))
    assert select.select([done_fd], [], [], 5)[0]
    relay._fail_allocation(1)
    try:
        with pytest.raises(MemoryError):
            relay.done()
    finally:
        relay._fail_allocation(0)
    assert select.select([done_fd], [], [], 0)[0], "signalled again"
    result = back(done_fd)
    assert result[0] == ident and result[5] == [(b"kept", True)]


def test_cancel_racing_the_hand_back_returns_each_stream_exactly_once_with_its_bytes(done_fd: int) -> None:
    """A take-back at every moment of a hand-back (the thread reading, writing, queueing the stream): each stream
    comes back once, by `cancel` or by `done`, and its bytes add up."""
    rng = random.Random(3)
    stream = b"".join(framed(event(f"w{i} ")) for i in range(30)) + framed(event(finish="stop"))
    ways = {"cancel": 0, "done": 0}
    rounds = 0
    # 600 rounds, more (up to 3000) until both sides were reached: on a loaded machine (make check beside an apt
    # install) the relay's thread once won all 600; every other round takes back at once, the earliest moment
    while rounds < 600 or (not (ways["cancel"] and ways["done"]) and rounds < 3000):
        rounds += 1
        pair = Pair()
        try:
            ident = start(pair, time.perf_counter())
            pair.up_test.sendall(stream)
            spin = rng.randrange(0, 3000) if rounds % 2 else 0
            while spin:  # a spread of moments, from before the first read to after the hand-back
                spin -= 1
            result = relay.cancel(ident)
            if result is None:
                ways["done"] += 1
                result = back(done_fd)
            else:
                ways["cancel"] += 1
            assert result[0] == ident
            with pytest.raises(KeyError):
                relay.cancel(ident)
            pair.client_test.setblocking(False)
            pair.up_test.shutdown(socket.SHUT_WR)
            assert drain(pair.client_test) + result[4] + result[3] + drain(pair.up_thread) == stream
        finally:
            pair.close()
    select.select([done_fd], [], [], 0.05)
    assert relay.done() == []  # nothing came back twice
    assert ways["cancel"] and ways["done"], ways  # both sides of the race were reached


FAILED_START = """
import json, os, resource
from specwatch.exporter import _fastrelay as relay
free = 0
while os.path.exists(f"/proc/self/fd/{free}"):
    free += 1
resource.setrlimit(resource.RLIMIT_NOFILE, (free + 1, 4096))  # room for the epoll set, none for the eventfd
out = {"before": len(os.listdir("/proc/self/fd"))}
try:
    relay.init()
except OSError as exc:
    out["init"] = str(exc)
try:
    relay.start(0, 1, b"", b"", (1.0,), 0.0, 1.0)
except RuntimeError as exc:
    out["start"] = str(exc)
out["fds"] = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
out["again"] = relay.init() >= 0
print(json.dumps(out))
"""


def test_a_failed_start_leaves_nothing_half_started_and_a_later_init_works() -> None:
    """No eventfd (out of descriptors): init raises, closes the epoll set it made, start refuses; init works later."""
    import subprocess
    import sys

    found = subprocess.run([sys.executable, "-c", FAILED_START], capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    out = json.loads(found.stdout)
    assert "Too many open files" in out["init"] and "init() first" in out["start"], out
    assert out["fds"] == out["before"], "the epoll set made before the failure is closed"
    assert out["again"] is True
