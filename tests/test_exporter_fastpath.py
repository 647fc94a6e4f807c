"""The tap's per-chunk fast path: the byte pattern agrees with a full JSON parse, and over HTTP nothing changes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web

from specwatch.exporter import fastrelay
from specwatch.exporter.accounting import utf8
from specwatch.exporter.relays import _stamp_fingerprint
from specwatch.exporter.sse import PlainReader, SseSplitter, _data, plain_text
from specwatch.net import free_port
from tests.conftest import Service
from tests.loopback import loopback_upstream
from tests.test_exporter import value, value_in

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0"
TRICKY = ['"usage"', '"usage":{"prompt_tokens":1}', ',"usage":null}', '"finish_reason":"stop"', "finish_reason",
          '}]}', '"choices":[]', "\\", '\\"', '"', "\n", "\r\n\r\n", "data: [DONE]\n\n", "\t", "è", "ès", "日本",
          "🙂", "\u2028", "\x00", "\x1f", "\ud800", "a\\u0041", "}", "{", "null", " ", "\\n\\n"]


def reference(data: bytes) -> bytes | None:
    """What the slow path decides: the text (b"" for none) of a chunk that needs nothing more, else None."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict) or "usage" in obj or not isinstance(obj.get("choices"), list):
        return None
    choices = obj["choices"]
    if len(choices) != 1 or not isinstance(choices[0], dict) or choices[0].get("finish_reason"):
        return None
    choice = choices[0]
    delta = choice.get("delta")
    text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
    return utf8(text) if isinstance(text, str) else None


def agrees(data: bytes) -> bool:
    """The fast path may decline anything, but what it accepts the full parse must say too."""
    fast = plain_text(data)
    return fast is None or fast == reference(data)


def fixture_payloads() -> Iterator[tuple[str, bytes]]:
    for path in sorted(FIXTURES.glob("*/*.response")):
        splitter = SseSplitter()
        for event in [*splitter.feed(path.read_bytes()), *splitter.flush()]:
            if event.data is not None and event.data.startswith(b"{"):
                yield f"{path.parent.name}/{path.name}", event.data


def compact(obj: Any, ascii_only: bool = False) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def with_content(data: bytes, text: str, ascii_only: bool = False) -> bytes:
    obj = json.loads(data)
    choice = obj["choices"][0]
    if "delta" in choice:
        choice["delta"]["content"] = text
    else:
        choice["text"] = text
    return compact(obj, ascii_only)


def test_fast_path_agrees_with_a_full_parse_on_every_captured_chunk():
    payloads = list(fixture_payloads())
    assert len(payloads) > 500
    declined = []
    for name, data in payloads:
        assert agrees(data), (name, data)
        if plain_text(data) is None:
            declined.append((name, data))
        elif reference(data) is None:
            raise AssertionError((name, data))
    # only the chunks that matter are parsed in full: finish chunks and the usage / metrics chunk, and the
    # chunks of streams that asked for logprobs (not plain content: read whole, and rarer)
    with_logprobs = [n for n, d in payloads if any(c.get("logprobs") for c in json.loads(d)["choices"])]
    assert with_logprobs
    for name, data in declined:
        obj = json.loads(data)
        assert ("usage" in obj or any(c.get("finish_reason") or c.get("logprobs") for c in obj["choices"])), \
            (name, data)
    assert len(declined) - len(with_logprobs) < (len(payloads) - len(with_logprobs)) / 10


@pytest.mark.parametrize("ascii_only", [False, True])
def test_tricky_content_is_read_exactly_or_left_to_the_full_parse(ascii_only):
    content = next(d for n, d in fixture_payloads() if n.endswith("chat_stream_usage.response") and
                   b'"content":"' in d and b'"finish_reason":null' in d and b'"role"' not in d)
    completion = next(d for n, d in fixture_payloads() if n.endswith("completion_stream_usage.response") and
                      b'"finish_reason":null' in d)
    for template in (content, completion):
        for text in [*TRICKY, "".join(TRICKY), "x" * 5000]:
            data = with_content(template, text, ascii_only)
            assert agrees(data), data
            if "\ud800" not in text:  # no lone surrogate: what vLLM sends, so it must take the fast path
                assert plain_text(data) == text.encode(), data


@pytest.mark.parametrize("data", [
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":null}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"usage":{"total_tokens":3}}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}],"choices":[]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null,"delta":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null,"finish_reason":"stop"}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"}},{"index":1,"delta":{"content":"b"}}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a","tool_calls":[]},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[]},"finish_reason":null}]}',
    b'{"id":"x", "choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"\xff"},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a\x01"},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a\\x"},"finish_reason":null}]}',
    b'{"id":"\xc3\xa8","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":null},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"text":"a","delta":{"content":"b"},"finish_reason":null}]}',
])
def test_chunks_that_matter_or_are_unusual_take_the_full_parse(data: bytes) -> None:
    assert plain_text(data) is None


def mutate(rng: random.Random, original: bytes, alphabet: bytes, near: tuple[int, int] | None = None) -> bytes:
    """1 to 3 random byte edits (replace, insert, delete); with `near`, 70 % of them in that span."""
    data = bytearray(original)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(data))
        if near is not None and rng.random() >= 0.3:
            at = min(rng.randrange(*near), len(data) - 1)
        op = rng.randrange(3)
        if op == 0:
            data[at] = rng.choice(alphabet)
        elif op == 1:
            data.insert(at, rng.choice(alphabet))
        else:
            del data[at]
    return bytes(data)


def test_fast_path_never_disagrees_on_mutated_chunks():
    rng = random.Random(4)
    payloads = [d for _, d in fixture_payloads()]
    alphabet = b'"\\{}[],:0123456789abnlu \xc3\xa8\xff\n'
    accepted = 0
    for _ in range(20000):
        mutated = mutate(rng, rng.choice(payloads), alphabet)
        assert agrees(mutated), mutated
        accepted += plain_text(mutated) is not None
    assert accepted > 1000  # the test did exercise the fast path's acceptance, not only its refusals


def fixture_streams() -> Iterator[tuple[str, list[bytes]]]:
    for path in sorted(FIXTURES.glob("*/*.response")):
        splitter = SseSplitter()
        events = [*splitter.feed(path.read_bytes()), *splitter.flush()]
        yield f"{path.parent.name}/{path.name}", [e.data for e in events if e.data is not None]


def test_the_per_stream_reader_answers_as_the_full_pattern_on_every_captured_stream():
    single_choice_streams = 0
    for name, payloads in fixture_streams():
        reader = PlainReader()
        full = 0
        for data in payloads:
            learned = reader.prefix
            got = reader.text(data)
            assert got == plain_text(data), (name, data)
            assert reader.last_plain == (got is not None), (name, data)  # what the hand-over waits for
            full += got is not None and not (learned is not None and reader.prefix is learned)
        if payloads and not any(b'"index":1' in d for d in payloads):
            # one choice: the full pattern reads the role chunk and the first content chunk, the learned
            # surroundings every later one (n = 2 streams alternate their index and keep the full pattern)
            single_choice_streams += 1
            assert full <= 2, (name, full)
    assert single_choice_streams >= 12


@pytest.mark.parametrize("ascii_only", [False, True])
def test_the_reader_after_learning_a_chunk_reads_tricky_text_as_the_full_pattern(ascii_only: bool) -> None:
    streams = dict(fixture_streams())
    for name in ("ngram/chat_stream_usage.response", "ngram/completion_stream_usage.response"):
        ordinary = [d for d in streams[name] if plain_text(d) and b'"role"' not in d]
        for text in [*TRICKY, "".join(TRICKY), "x" * 5000, "plain words", ""]:
            reader = PlainReader()
            assert reader.text(ordinary[0]) == plain_text(ordinary[0])
            data = with_content(ordinary[0], text, ascii_only)
            assert reader.text(data) == plain_text(data), data
            assert agrees(data), data


def test_the_reader_never_disagrees_on_mutated_chunks_after_learning_the_original():
    rng = random.Random(5)
    payloads = [d for _, d in fixture_payloads() if plain_text(d) is not None]
    alphabet = b'"\\{}[],:0123456789abnlu \xc3\xa8\xff\n\x01'
    templated = 0
    for _ in range(20000):
        original = rng.choice(payloads)
        reader = PlainReader()
        reader.text(original)
        assert reader.prefix is not None
        near_text = (len(reader.prefix) - 3, len(original) - len(reader.suffix) + 3)  # the text and its quotes
        mutated = mutate(rng, original, alphabet, near_text)
        learned = reader.prefix
        got = reader.text(mutated)
        assert got == plain_text(mutated), (original, mutated)
        assert got is None or got == reference(mutated), mutated
        templated += got is not None and reader.prefix is learned
    assert templated > 1000  # the learned shape did answer, not only the full pattern


def test_single_line_data_shortcut_equals_the_general_rule():
    for raw in (b"data: {}\n\n", b"data:{}\n\n", b"data: a\ndata: b\n\n", b": c\n\n", b"data: x\r\n\r\n",
                b"event: e\ndata: y\n\n", b"data: \n\n", b"data:  two spaces\n\n"):
        lines = [line[5:].removeprefix(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
        assert _data(raw) == (b"\n".join(lines) if lines else None), raw


def test_splitter_gives_the_same_events_however_the_bytes_arrive():
    stream = (FIXTURES / "ngram" / "chat_stream_usage.response").read_bytes()
    whole = [(e.raw, e.data) for e in SseSplitter().feed(stream)]
    assert b"".join(raw for raw, _ in whole) == stream
    for size in (1, 7, 64, 300, 4096):
        splitter = SseSplitter()
        events = [(e.raw, e.data) for i in range(0, len(stream), size) for e in splitter.feed(stream[i:i + size])]
        assert events + [(e.raw, e.data) for e in splitter.flush()] == whole


# -- over HTTP: a scripted upstream whose content is full of the words the fast path looks for ----------

def tricky_stream() -> tuple[bytes, list[str], dict[str, Any]]:
    """The captured ngram chat stream with tricky content: (its bytes, the text pieces, the usage chunk)."""
    stream = (FIXTURES / "ngram" / "chat_stream_usage.response").read_bytes()
    out, text = [], []
    final: dict[str, Any] = {}
    for i, event in enumerate(SseSplitter().feed(stream)):
        data = event.data
        obj = json.loads(data) if data and data.startswith(b"{") else None
        if obj and obj["choices"] and obj["choices"][0]["delta"].get("content"):
            piece = TRICKY[i % len(TRICKY)].replace("\ud800", "?")
            obj["choices"][0]["delta"]["content"] = piece
            text.append(piece)
            data = compact(obj, ascii_only=i % 3 == 0)
        elif obj and "usage" in obj:
            final = obj
        out.append(event.raw if data is None else b"data: " + data + b"\n\n")
    return b"".join(out), text, final


@pytest.fixture(scope="module", params=["odd-pieces", "event-per-chunk"])
def scripted(request: pytest.FixtureRequest) -> Iterator[tuple[str, bytes, bool]]:
    body, _, _ = tricky_stream()
    by_event = request.param == "event-per-chunk"

    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        rng = random.Random(len(await request.read()))
        if by_event:  # as vLLM writes: one event per HTTP chunk, a few ms apart
            for event in SseSplitter().feed(body):
                await resp.write(event.raw)
                await asyncio.sleep(0.002)
        at = 0
        while at < len(body) and not by_event:  # odd pieces, some across event boundaries, some with a pause
            size = rng.choice((1, 5, 37, 200, 700))
            await resp.write(body[at:at + size])
            at += size
            if rng.random() < 0.2:
                await asyncio.sleep(0.001)
        await resp.write_eof()
        return resp

    with serving(chat) as url:
        yield url, body, by_event


@contextlib.contextmanager
def serving(chat: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Iterator[str]:
    """An aiohttp upstream on loopback in a thread of its own: `chat` answers POST /v1/chat/completions."""
    async def health(request: web.Request) -> web.Response:
        return web.Response()

    port = free_port()
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def replaying(body: bytes) -> contextlib.AbstractContextManager[str]:
    """An upstream that answers every chat request with a captured stream, one event per HTTP chunk a few ms
    apart, as vLLM writes."""
    async def chat(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for event in SseSplitter().feed(body):
            await resp.write(event.raw)
            await asyncio.sleep(0.002)
        await resp.write_eof()
        return resp

    return serving(chat)


def test_an_n2_stream_alternating_its_chunk_shape_is_handed_to_the_relay_thread_at_most_three_times(
        service_factory: Callable[[str, list[str]], Service]) -> None:
    """Two choices: chunks alternate index 0 and 1, so the relay thread hands each hand-over back at once.
    After three such the stream stays in Python (without the limit: one hand-over per chunk)."""
    body = (FIXTURES / "ngram" / "chat_n2_stream_usage.response").read_bytes()

    with replaying(body) as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        got = requests.post(tap.url + "/v1/chat/completions", timeout=30, json={
            "model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": True, "n": 2,
            "stream_options": {"include_usage": True}})
        assert got.status_code == 200 and got.content == body
        content_chunks = body.count(b'"content":"') - 2  # less the two role chunks
        assert content_chunks > 20
        assert value(tap.url, "specwatch_requests_total", outcome="ok") == 1
        assert 1 <= value(tap.url, "specwatch_fast_relay_handovers_total") <= 3
        assert value(tap.url, "specwatch_fast_relay_chunks_total") < 3


@pytest.mark.parametrize("fast", [True, False], ids=["fast-relay", "python-relay"])
def test_tricky_content_over_http_is_relayed_byte_identical_and_counted_exactly(
        service_factory: Callable[[str, list[str]], Service], scripted: tuple[str, bytes, bool], tmp_path: Path,
        fast: bool) -> None:
    url, body, by_event = scripted
    _, pieces, final = tricky_stream()
    log = tmp_path / "events.jsonl"
    tap = service_factory("exporter", ["--upstream", f"baseline={url}", "--event-log", str(log),
                                       *(() if fast else ("--no-fast-relay",))])
    request = {"model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": True}
    asked = requests.post(tap.url + "/v1/chat/completions", timeout=30, headers={"X-Specwatch-Task": "code"},
                          json={**request, "stream_options": {"include_usage": True}})
    assert asked.status_code == 200 and asked.content == body
    stripped = requests.post(tap.url + "/v1/chat/completions", json=request, timeout=30,
                             headers={"X-Specwatch-Task": "code"})
    events = [e.raw for e in SseSplitter().feed(body)]
    usage_at = next(i for i, raw in enumerate(events) if b'"usage"' in raw and b'"choices":[]' in raw)
    expected = events[:usage_at - 1] + [_stamp_fingerprint(events[usage_at - 1], final["system_fingerprint"])] + \
        events[usage_at + 1:]
    assert stripped.content == b"".join(expected)
    spec = final["metrics"]["speculative_decoding"]
    usage = final["usage"]
    token_chunks = len(pieces)
    for name, want in (("specwatch_requests_total", 2), ("specwatch_completion_tokens_total",
                                                         2 * usage["completion_tokens"]),
                       ("specwatch_prompt_tokens_total", 2 * usage["prompt_tokens"]),
                       ("specwatch_accepted_tokens_total", 2 * spec["num_accepted_draft_tokens"]),
                       ("specwatch_draft_tokens_total", 2 * spec["num_draft_tokens"]),
                       ("specwatch_spec_steps_total", 2 * spec["num_spec_steps"]),
                       ("specwatch_ttft_seconds_count", 2), ("specwatch_itl_seconds_count", 2 * (token_chunks - 1))):
        assert value(tap.url, name, task="code") == want, name
    assert value(tap.url, "specwatch_requests_total", outcome="ok") == 2
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["output_sha256"] for line in lines] == [hashlib.sha256("".join(pieces).encode()).hexdigest()] * 2
    assert [line["finish_reasons"] for line in lines] == [["length"], ["length"]]
    # one event per HTTP chunk (vLLM's way) is what the relay thread takes: most content chunks go through it
    by_thread = value(tap.url, "specwatch_fast_relay_chunks_total")
    if fast and by_event:
        assert fastrelay.AVAILABLE, "the compiled relay is not built (specwatch/exporter/_fastrelay.c)"
        assert by_thread >= token_chunks, (by_thread, token_chunks)  # of two requests' chunks, at least one's
    elif not fast:
        assert by_thread == 0


def test_a_stream_whose_client_asked_for_usage_ends_in_the_relay_thread_byte_identical_and_counted_at_once(
        service_factory: Callable[[str, list[str]], Service], tmp_path: Path) -> None:
    """One process, no event log, the client's own include_usage: the relay thread writes the tail and the end
    of the body, and the tap counts the stream after. The client gets the upstream's bytes exactly, on one
    keep-alive connection; each answer is counted in full the moment the client has it (`/metrics` waits for
    the count); e2e is the end's time, not the count's. With an event log every end is counted before it
    leaves, in Python, as is a stream whose usage chunk the tap strips."""
    body, pieces, final = tricky_stream()
    usage = final["usage"]
    request = {"model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": True,
               "stream_options": {"include_usage": True}}
    with replaying(body) as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        logged = service_factory("exporter", ["--upstream", f"baseline={url}", "--event-log",
                                              str(tmp_path / "events.jsonl")])
        took = 0.0  # the client's time, request to answer, summed
        with requests.Session() as client:
            for n in (1, 2, 3):
                started = time.perf_counter()
                got = client.post(tap.url + "/v1/chat/completions", json=request, timeout=30)
                took += time.perf_counter() - started
                assert got.status_code == 200 and got.content == body
                # read once, no wait: the count is there as soon as the client has its answer
                metrics = requests.get(tap.url + "/metrics", timeout=10).text
                assert value_in(metrics, "specwatch_requests_total", outcome="ok") == n
                assert value_in(metrics, "specwatch_completion_tokens_total") == n * usage["completion_tokens"]
                assert value_in(metrics, "specwatch_itl_seconds_count") == n * (len(pieces) - 1)
                assert value_in(metrics, "specwatch_fast_relay_ends_total") == n
                assert 0 < value_in(metrics, "specwatch_e2e_seconds_sum") <= took
        # the tap strips the usage chunk it asked for itself: that stream's end is the tap's, not the thread's
        stripped = requests.post(tap.url + "/v1/chat/completions", timeout=30,
                                 json={k: v for k, v in request.items() if k != "stream_options"})
        assert stripped.status_code == 200 and b'"usage"' not in stripped.content
        assert value(tap.url, "specwatch_fast_relay_ends_total") == 3
        assert value(tap.url, "specwatch_requests_total", outcome="ok") == 4
        got = requests.post(logged.url + "/v1/chat/completions", json=request, timeout=30)
        assert got.content == body and value(logged.url, "specwatch_fast_relay_ends_total") == 0
        assert value(logged.url, "specwatch_fast_relay_chunks_total") > 0  # handed over, ended in Python


@contextlib.contextmanager
def raw_upstream(head_alone: threading.Event, go: threading.Event, events: list[bytes],
                 received: list[bytes] | None = None) -> Iterator[str]:
    """A streamed chat answer written by hand on loopback: the head with the first event in one write (or
    the head alone where `head_alone` is set), then nothing until `go`, then the rest. Each chat request's
    bytes go to `received`."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%b\r\n" % (len(data), data)

    def answer(conn: socket.socket, got: bytes) -> None:
        if received is not None:
            received.append(got)
        conn.sendall(head if head_alone.is_set() else head + chunk(events[0]))
        go.wait(30)
        rest = events if head_alone.is_set() else events[1:]
        conn.sendall(b"".join(chunk(e) for e in rest) + b"0\r\n\r\n")

    with loopback_upstream(answer) as url:
        yield url


def data_segments_in(sock: socket.socket) -> int:
    """TCP_INFO's tcpi_data_segs_in: segments with data this socket received (Linux >= 4.6)."""
    return int.from_bytes(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 232)[152:156], "little")


def test_response_headers_leave_with_the_bytes_that_came_with_them_and_alone_when_they_came_alone(
        service_factory: Callable[[str, list[str]], Service]) -> None:
    """The client's socket counts the exporter's writes (each one segment on loopback, TCP_NODELAY): the
    upstream's head and first event written together reach the client as one segment (two where the
    headers went out on their own); a head written alone reaches the client before any event exists."""
    events = [e.raw for e in SseSplitter().feed((FIXTURES / "baseline" / "chat_stream_usage.response").read_bytes())]
    head_alone, go = threading.Event(), threading.Event()
    body = json.dumps({"model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    with raw_upstream(head_alone, go, events) as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        host, port = tap.url.removeprefix("http://").split(":")
        for alone in (False, True):
            go.clear()
            head_alone.set() if alone else head_alone.clear()
            with socket.create_connection((host, int(port)), timeout=30) as client:
                client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Connection: close\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))
                got = b""
                while b"\r\n\r\n" not in got or (not alone and events[0] not in got):
                    got += client.recv(65536)
                assert got.startswith(b"HTTP/1.1 200 OK\r\n"), got[:100]
                if alone:
                    assert got.endswith(b"\r\n\r\n"), got  # the headers, and no event: the upstream has sent none
                else:
                    assert data_segments_in(client) == 1, "the headers and the first event in separate writes"
                go.set()
                while not got.endswith(b"0\r\n\r\n"):
                    piece = client.recv(65536)
                    assert piece, got[-200:]
                    got += piece
            relayed = SseSplitter().feed(unchunk(got.split(b"\r\n\r\n", 1)[1]))
            assert b"".join(e.raw for e in relayed) == b"".join(events)
        assert value(tap.url, "specwatch_requests_total", outcome="ok") == 2


def unchunk(body: bytes) -> bytes:
    out, at = b"", 0
    while True:
        eol = body.index(b"\r\n", at)
        size = int(body[at:eol], 16)
        if size == 0:
            return out
        out += body[eol + 2:eol + 2 + size]
        at = eol + 4 + size


def test_a_streamed_request_reaches_the_upstream_with_the_clients_headers_as_sent(
        service_factory: Callable[[str, list[str]], Service]) -> None:
    """Over the tap's own upstream client: every end-to-end header line as the client wrote it (case, order,
    repeats, an Authorization value), none of the hop-by-hop or the tap's own, the Host and length of the
    upstream request, the body unchanged (the client asked for usage itself)."""
    events = [e.raw for e in SseSplitter().feed((FIXTURES / "baseline" / "chat_stream_usage.response").read_bytes())]
    received: list[bytes] = []
    go = threading.Event()
    go.set()
    body = json.dumps({"model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    secret = b"Bearer sk-" + uuid.uuid4().hex.encode()
    with raw_upstream(threading.Event(), go, events, received) as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        host, port = tap.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as client:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: tap.example\r\nauthorization: %b\r\n"
                           b"X-Dup: one\r\nContent-Type: application/json\r\nX-Specwatch-Task: code\r\n"
                           b"x-dup: two\r\nAccept-Encoding: gzip\r\nConnection: close\r\nTE: trailers\r\n"
                           b"X-Specwatch-Variant: baseline\r\nContent-Length: %d\r\n\r\n%b" % (secret, len(body), body))
            got = b""
            while piece := client.recv(65536):
                got += piece
        assert got.startswith(b"HTTP/1.1 200 OK\r\n") and got.endswith(b"0\r\n\r\n")
    head, sent_body = received[-1].split(b"\r\n\r\n", 1)
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert lines[1:] == [b"Host: " + url.removeprefix("http://").encode(), b"authorization: " + secret,
                         b"X-Dup: one", b"Content-Type: application/json", b"x-dup: two",
                         b"Content-Length: %d" % len(body)]
    assert sent_body == body
    assert secret.decode() not in tap.log.read_text()


def test_a_stream_with_logprobs_stays_in_python_and_is_never_handed_to_the_relay_thread(
        service_factory: Callable[[str, list[str]], Service]) -> None:
    """Every content chunk carries a logprobs object, which the plain pattern does not match: handing the
    stream over after the plain role chunk would come back at the next chunk, and that chunk would then wait
    for its turn as if it were the stream's end."""
    body = (FIXTURES / "ngram" / "chat_logprobs_stop_string_stream_usage.response").read_bytes()

    with replaying(body) as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        got = requests.post(tap.url + "/v1/chat/completions", timeout=30, json={
            "model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": True,
            "logprobs": True, "top_logprobs": 2, "stop": ["scale_1"], "stream_options": {"include_usage": True}})
        assert got.status_code == 200 and got.content == body
        assert body.count(b'"logprobs":{"content":') > 5
        assert value(tap.url, "specwatch_requests_total", outcome="ok") == 1
        assert value(tap.url, "specwatch_fast_relay_handovers_total") == 0
        assert value(tap.url, "specwatch_fast_relay_chunks_total") == 0
