"""The compiled relay thread on real sockets: what it takes, what it hands back, and when.

Socket pairs stand for the upstream connection (the test writes vLLM's chunked SSE bytes into one end,
the thread reads the other) and the client connection (the thread writes one end, the test reads the
other). Each case hands a stream over as the tap does and checks the bytes the client got and the
result the thread handed back: reason, unread and unsent bytes, text segments, ITL bucket counts.
"""

from __future__ import annotations

import errno
import json
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


def start(pair: Pair, last_token: float, max_seconds: float = 10.0) -> object:
    prefix, suffix = shape()
    return relay.start(7, pair.up_thread.fileno(), pair.client_thread.fileno(), prefix, suffix, BOUNDS, last_token,
                       max_seconds)


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
    start(pair, before)
    texts = ["Hello", " world", ",", " again"]
    for text in texts:
        pair.up_test.sendall(framed(event(text)))
        time.sleep(0.02)
    rest = framed(event(finish="stop")) + framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    pair.up_test.sendall(rest)
    got = read_exactly(pair.client_test, sum(len(framed(event(t))) for t in texts))
    assert got == b"".join(framed(event(t)) for t in texts)  # the same chunks, framed for the client
    ident, reason, _, unread, unsent, segments, counts, gap_sum, last_token, tokens = back(done_fd)
    assert (ident, reason, unread, unsent, tokens) == (7, fastrelay.UNUSUAL, rest, b"", 4)
    assert segments == [("".join(texts).encode(), True)]  # plain ASCII runs merge into one segment
    assert sum(counts) == 4 and counts[0] <= 1 and counts[2] >= 3  # ~20 ms gaps: the (0.01, 0.1] bucket
    assert 0.05 < gap_sum < 2 and before < last_token <= time.perf_counter()


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
