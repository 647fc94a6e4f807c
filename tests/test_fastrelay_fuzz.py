"""A differential fuzz of the compiled relay against the Python reader: generated streams, same bytes, same counts.

Each case is a stream of chunked SSE events in the learned content shape, with what an upstream could
send instead: escapes good and bad, non-ASCII and invalid UTF-8, raw control characters and quotes,
other events (a finish chunk, [DONE], a role chunk, junk), chunk sizes in upper case, with leading
zeros, with extensions, too long, lying by a few bytes either way, a missing CRLF. It is written to the
relay thread in random pieces; some clients do not read (partial writes), some are gone before or
while it writes. The reference is the Python reader (`sse._STRING_BODY`, `sse._decoded`: what
`PlainReader` reads as an ordinary content chunk) over strict framing (1 to 16 hex digits, CRLF, the
payload, CRLF). For every case: the chunks the thread took are the reference's (all of them, or a
prefix where the client stopped it), re-framed byte for byte to the client (sent, or handed back
unsent), their texts decode to the reference's, the token count and ITL counts match, and the
unread bytes plus what is still in the socket are the rest of the stream. Half the cases hand the stream
over with `tail` (it may end in the thread): the reference then also takes, after the first chunk that is
not an ordinary content chunk, up to 16 more whole chunks of any payload (stopping at an ordinary one) and
the body's end without trailers; those chunks come back raw in `sent`, and the end's time is set exactly
where the end was taken.

`SPECWATCH_FUZZ_CASES` (default 100,000) and `SPECWATCH_FUZZ_SEED` (default: from the clock) set the
run; a failure prints the seed and the case to replay.
"""

from __future__ import annotations

import os
import random
import select
import socket
import time
from dataclasses import dataclass

import pytest

from specwatch.exporter import fastrelay
from specwatch.exporter.sse import _STRING_BODY, _decoded

from .test_fastrelay import BOUNDS, event, framed, shape

pytestmark = [pytest.mark.skipif(not fastrelay.AVAILABLE, reason="the compiled relay is not built"),
              pytest.mark.servers]
relay = fastrelay._fastrelay

CASES = int(os.environ.get("SPECWATCH_FUZZ_CASES", "100000"))
MAX_CHUNK = 256 * 1024  # _fastrelay.c
SO_SNDBUFFORCE = 32  # <asm-generic/socket.h>; not in Python's socket module

TEXTS = [b"a", b"hello world", b" ", b"", b"x" * 300, b"\\n", b'\\"', b"\\\\", b"\\/", b"\\b\\f\\r\\t",
         b"\\u00e9", b"\\ud83d\\ude00", b"\\ud800", b"\\uDC00x", "é".encode(), "日本語".encode(), "😀".encode(),
         b"\xed\xa0\x80", b"\xff", b"\xc0\x80", b"\xe6\x97", b"\xf4\x90\x80\x80", b"\x01", b'"', b"\\x", b"\\",
         b"\\u12", b"\\u12g4", b"\x7f", b"tab\there", "ǅ".encode(), b"\xe0\x80\xaf", b"\xf0\x80\x80\xaf",
         b"\xf4\x8f\xbf\xbf"]


def content(prefix: bytes, suffix: bytes, body: bytes) -> bytes:
    return b"data: " + prefix + body + suffix + b"\n\n"


@dataclass
class Case:
    raw: bytes
    pieces: list[int]  # split points
    mode: str  # "read", "slow" (the client does not read), "gone" (closed before), "gone_mid" (after a piece)
    tail: bool  # handed over with `tail`: the stream may end in the thread


def generate(rng: random.Random, prefix: bytes, suffix: bytes) -> Case:
    mode = rng.choices(["read", "slow", "gone", "gone_mid"], [0.8, 0.1, 0.05, 0.05])[0]
    chunks = []
    if mode == "slow":  # more than the client's socket takes, first: the thread's write comes up short
        chunks.append(b"".join(framed(content(prefix, suffix, b"z" * rng.randrange(1000, 5000))) for _ in range(40)))
    for _ in range(rng.randrange(1, 12)):
        roll = rng.random()
        if roll < 0.75:
            body = b"".join(rng.choice(TEXTS) for _ in range(rng.randrange(0, 4)))
            payload = content(prefix, suffix, body)
        elif roll < 0.8:
            payload = event(finish="stop")
        elif roll < 0.84:
            payload = b"data: [DONE]\n\n"
        elif roll < 0.88:
            payload = b"data: " + prefix[:-1] + b"\n\n"  # a truncated event
        elif roll < 0.92:
            payload = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        else:
            payload = content(prefix, suffix + b" ", b"odd suffix")
        chunks.append(frame(rng, payload))
    if rng.random() < 0.5:
        chunks.append(framed(event(finish="stop")) + framed(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    elif rng.random() < 0.2:
        chunks.append(framed(event(finish="stop")) + rng.choice([b"0\r\nX-Trailer: 1\r\n\r\n", b"0;x\r\n\r\n",
                                                                 b"00\r\n\r\n", b"0\r\n\n"]))
    if rng.random() < 0.1:
        chunks.append(b"".join(frame(rng, content(prefix, suffix, b"y" * 4000)) for _ in range(60)))  # a flood
    raw = b"".join(chunks)
    cuts = sorted(rng.sample(range(1, len(raw)), min(len(raw) - 1, rng.randrange(0, 6)))) if len(raw) > 1 else []
    return Case(raw, cuts, mode, rng.random() < 0.5)


def frame(rng: random.Random, payload: bytes) -> bytes:
    roll, size = rng.random(), len(payload)
    if roll < 0.8:
        return framed(payload)
    if roll < 0.84:
        return b"%X\r\n%b\r\n" % (size, payload)
    if roll < 0.87:
        return b"%b\r\n%b\r\n" % ((b"%x" % size).rjust(rng.choice([5, 16, 17]), b"0"), payload)  # leading zeros
    if roll < 0.9:
        return b"%x;ext=1\r\n%b\r\n" % (size, payload)
    if roll < 0.94:
        return b"%x\r\n%b\r\n" % (max(1, size + rng.choice([-3, -1, 1, 2])), payload)  # a lying size
    if roll < 0.96:
        return b"%x\r\n%b" % (size, payload)  # no CRLF after the payload
    if roll < 0.98:
        return rng.choice([b"0x", b"+", b" ", b"-"]) + framed(payload)
    return b"%x\n%b\r\n" % (size, payload)  # a bare LF


@dataclass
class Reference:
    offsets: list[int]  # where each taken chunk ends in raw
    chunks: list[bytes]  # each taken chunk re-framed as the client gets it
    bodies: list[bytes]  # each taken chunk's text body, raw
    complete: bool  # the reference stopped at a whole chunk it does not take (else: bytes still to come)
    tail: dict[int, bytes]  # the tail's chunks as read, by the index of their offset
    ended: bool = False  # the last offset is the body's end, taken


def reference(raw: bytes, prefix: bytes, suffix: bytes, tail: bool = False) -> Reference:
    """The Python reader over strict framing: the chunks an ordinary content chunk's reader takes, in order;
    with `tail`, then the tail's whole chunks and the body's end as the thread may take them."""
    ref = Reference([], [], [], False, {})
    pos, hexdigits = 0, set(b"0123456789abcdefABCDEF")
    while True:
        eol = raw.find(b"\r", pos, pos + 18)
        if eol < 0:
            ref.complete = len(raw) - pos >= 17 or any(c not in hexdigits for c in raw[pos:])
            return ref
        line = raw[pos:eol]
        if not 1 <= len(line) <= 16 or any(c not in hexdigits for c in line):
            ref.complete = True
            return ref
        if eol + 1 >= len(raw):
            return ref
        size = int(line, 16)
        if raw[eol + 1] != ord("\n") or size > MAX_CHUNK or (size == 0 and not (tail and ref.tail)):
            ref.complete = True
            return ref
        if size == 0:  # the body's end, after a tail: taken without trailers
            if eol + 4 > len(raw):
                return ref
            if raw[eol + 2:eol + 4] != b"\r\n":
                ref.complete = True
                return ref
            ref.tail[len(ref.offsets)] = raw[pos:eol + 4]
            ref.offsets.append(eol + 4)
            ref.chunks.append(b"0\r\n\r\n")
            ref.ended = ref.complete = True
            return ref
        start, end = eol + 2, eol + 2 + size
        if end + 2 > len(raw):
            return ref
        payload = raw[start:end]
        least = 6 + len(prefix) + len(suffix) + 2
        body = payload[6 + len(prefix):len(payload) - len(suffix) - 2]
        ordinary = (len(payload) >= least and payload.startswith(b"data: " + prefix)
                    and payload.endswith(suffix + b"\n\n") and _STRING_BODY.fullmatch(body) is not None
                    and _decoded(body) is not None)  # as `PlainReader.text`: a body it cannot decode is not plain
        if raw[end:end + 2] != b"\r\n" or (ordinary and ref.tail) or (
                not ordinary and not (tail and len(ref.tail) < 16)):
            ref.complete = True
            return ref
        if not ordinary:
            ref.tail[len(ref.offsets)] = raw[pos:end + 2]
        else:
            ref.bodies.append(body)
        pos = end + 2
        ref.offsets.append(pos)
        ref.chunks.append(framed(payload))


def drain(sock: socket.socket) -> bytes:
    out = b""
    while True:
        try:
            piece = sock.recv(1 << 20)
        except (BlockingIOError, ConnectionResetError):
            return out
        if not piece:
            return out
        out += piece


def roomy(sock: socket.socket) -> None:
    """A send buffer far beyond a case's bytes (root may force it past the system's maximum)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 16 << 20)
    except OSError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 << 20)


def run_case(case: Case, prefix: bytes, suffix: bytes, done_fd: int) -> tuple:
    """The case through the relay thread: (result, bytes the client got, bytes still in the upstream socket)."""
    up_test, up_thread = socket.socketpair()
    client_thread, client_test = socket.socketpair()
    try:
        for s in (up_thread, client_thread, client_test):
            s.setblocking(False)
        roomy(up_test)  # every write goes at once, whether or not the thread reads on
        if case.mode == "slow":
            client_thread.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        else:
            roomy(client_thread)  # a client that reads never makes the thread wait
        if case.mode == "gone":
            client_test.close()
        ident = relay.start(up_thread.fileno(), client_thread.fileno(), prefix, suffix, BOUNDS,
                            time.perf_counter(), 30.0, case.tail)
        got, last = b"", 0
        for i, cut in enumerate([*case.pieces, len(case.raw)]):
            up_test.sendall(case.raw[last:cut])
            last = cut
            if case.mode == "gone_mid" and i == 0:
                client_test.close()
            elif case.mode == "read":
                got += drain(client_test)
        up_test.shutdown(socket.SHUT_WR)
        results: list = []
        deadline = time.monotonic() + 10
        while not results:
            assert time.monotonic() < deadline, "the thread handed nothing back"
            select.select([done_fd], [], [], 0.5)
            results = relay.done()
        assert len(results) == 1 and results[0][0] == ident, results
        if case.mode in ("read", "slow"):
            got += drain(client_test)
        return tuple(results[0]), got, drain(up_thread), case.raw[last:]
    finally:
        for s in (up_test, up_thread, client_thread, client_test):
            s.close()


def check(case: Case, ref: Reference, result: tuple, got: bytes, left: bytes, unwritten: bytes) -> None:
    _, reason, _, unread, unsent, segments, counts, _, _, tokens = result[:10]
    rest = unread + left + unwritten
    offset = len(case.raw) - len(rest)
    assert case.raw[offset:] == rest, "unread, still in the socket and unwritten: the stream's end"
    assert offset in (0, *ref.offsets), f"the thread stopped at {offset}, inside a chunk {ref.offsets}"
    k = ref.offsets.index(offset) + 1 if offset else 0
    sent = b"".join(ref.chunks[:k])
    if case.mode in ("read", "slow"):
        assert got + unsent == sent, "the client's bytes and the unsent ones: the taken chunks re-framed"
    else:
        assert sent.endswith(unsent) and len(got) + len(unsent) <= len(sent)
    if case.mode == "read":
        assert k == len(ref.offsets), f"took {k} of the {len(ref.offsets)} chunks the Python reader takes"
        assert reason == (fastrelay.ENDED if ref.ended else fastrelay.UNUSUAL if ref.complete else fastrelay.EOF), \
            reason
    assert result[10] == b"".join(raw for i, raw in sorted(ref.tail.items()) if i < k), "the tail as read"
    assert (result[12] > 0) == (ref.ended and k == len(ref.offsets)), "the end's time where the end was taken"
    text = [b if plain else _decoded(b) for b, plain in segments]
    expected = [_decoded(b) for b in ref.bodies[:k] if b]
    assert None not in text, "the thread took a body the tap cannot decode"
    assert b"".join(t for t in text if t is not None) == b"".join(e for e in expected if e is not None)
    assert all(plain == (b.isascii() and b"\\" not in b) for b, plain in segments)
    assert tokens == len(expected) == sum(counts), (tokens, len(expected), counts)


def test_the_compiled_relay_takes_exactly_what_the_python_reader_takes() -> None:
    seed = int(os.environ.get("SPECWATCH_FUZZ_SEED", str(time.time_ns() % 2**32)))
    rng = random.Random(seed)
    done_fd = relay.init()
    prefix, suffix = shape()
    modes: dict[str, int] = {}
    reasons: dict[int, int] = {}
    started = time.monotonic()
    for number in range(CASES):
        case = generate(rng, prefix, suffix)
        ref = reference(case.raw, prefix, suffix, case.tail)
        try:
            result, got, left, unwritten = run_case(case, prefix, suffix, done_fd)
            check(case, ref, result, got, left, unwritten)
        except AssertionError as exc:
            raise AssertionError(f"fuzz case {number} of seed {seed} (SPECWATCH_FUZZ_SEED={seed}): {exc}\n"
                                 f"mode {case.mode}, pieces {case.pieces}, raw {case.raw[:2000]!r}") from exc
        if result[12]:
            relay.settled()  # as the tap does once it has counted the stream
        modes[case.mode] = modes.get(case.mode, 0) + 1
        reasons[result[1]] = reasons.get(result[1], 0) + 1
    print(f"fuzz: {CASES} cases, seed {seed}, {time.monotonic() - started:.1f} s; modes {modes}; reasons {reasons}; "
          f"relay {relay.__file__}")
    assert relay.unsettled() == 0
    if CASES >= 1000:  # every way back was reached
        assert {fastrelay.UNUSUAL, fastrelay.EOF, fastrelay.CLIENT, fastrelay.PARTIAL,
                fastrelay.ENDED} <= set(reasons), reasons
