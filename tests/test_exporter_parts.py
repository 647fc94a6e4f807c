"""The exporter's parts in isolation: configuration, classification, routing, SSE splitting, event log."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from specwatch.exporter.classify import classify
from specwatch.exporter.config import YAML_KEYS, ConfigError, ExporterConfig, load
from specwatch.exporter.eventlog import EventLog
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.relays import _stamp_fingerprint, plan_request
from specwatch.exporter.routing import Router
from specwatch.exporter.sse import SseSplitter
from specwatch.exporter.upstream import Connection, Pool
from specwatch.workloads import article_prompt

EXAMPLE = Path(__file__).parents[1] / "examples" / "exporter.yaml"


def test_the_example_file_loads_and_flags_win():
    cfg = load({"upstream": ["baseline=http://127.0.0.1:9000"], "listen": "127.0.0.1:9555"}, EXAMPLE)
    assert cfg.upstreams == {"baseline": "http://127.0.0.1:9000", "candidate": "http://127.0.0.1:8001"}
    assert cfg.split == {"candidate": 10.0} and cfg.sticky_header == "X-Session-Id"
    assert (cfg.listen_host, cfg.listen_port) == ("127.0.0.1", 9555)
    assert cfg.task_labels == ("code", "chat", "other")


def test_a_setting_left_out_everywhere_is_the_config_dataclass_default():
    """Issue 43: each default is written once, on `ExporterConfig`'s field; flags and the YAML file fall back to it.
    Every field but the ones given here equals the dataclass's own default (a second default written in `load`
    would differ from it the day one of the two changed)."""
    loaded = load({"upstream": ["baseline=http://127.0.0.1:9000"]}, None)
    defaults = ExporterConfig(upstreams={"baseline": "http://127.0.0.1:9000"})
    differ = [(f.name, getattr(loaded, f.name), getattr(defaults, f.name)) for f in dataclasses.fields(loaded)
              if getattr(loaded, f.name) != getattr(defaults, f.name)]
    assert loaded == defaults and not differ, differ


@pytest.mark.parametrize("flags,match", [
    ({}, "no upstream"),
    ({"upstream": ["baseline"]}, "expected NAME=VALUE"),
    ({"upstream": ["Base Line=http://x"]}, "upstream name"),
    ({"upstream": ["baseline=ftp://x"]}, "expected http://HOST"),
    ({"upstream": ["baseline=https://vllm.example:443"]}, r"expected http://HOST\[:PORT\]\[/PATH\] .*no https"),
    ({"upstream": ["baseline=http://user:secret@x"]}, r"^upstream baseline='http://\*\*\*@x': .*credentials"),
    ({"upstream": ["baseline=http://x/v1?a=1"]}, "query"),
    ({"upstream": ["baseline=http://x:99999"]}, "expected http://HOST"),
    ({"upstream": ["baseline=http://x"], "split": ["candidate=10"]}, "no such upstream"),
    ({"upstream": ["baseline=http://x", "candidate=http://y"], "split": ["candidate=150"]}, "0..100"),
    ({"upstream": ["baseline=http://x"], "mirror": "baseline"}, "must differ"),
    ({"upstream": ["baseline=http://x"], "listen": "nowhere"}, "HOST:PORT"),
])
def test_bad_settings_are_named(flags, match):
    with pytest.raises(ConfigError, match=match):
        load(flags, None)


def test_bad_yaml_rule_is_named(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("upstreams: {baseline: 'http://x'}\nrules: [{task: code, colour: red}]\n")
    with pytest.raises(ConfigError, match=r"rules\[0\]: unknown keys \['colour'\]"):
        load({}, f)


@pytest.mark.parametrize("line,match", [
    ("max_body_bytes: lots", r"max_body_bytes: expected a positive integer, got 'lots'"),
    ("max_body_bytes: 1.5", r"max_body_bytes: expected a positive integer, got 1.5"),
    ("event_log_max_bytes: 0", r"event_log_max_bytes: expected a positive integer, got 0"),
    ("probe_interval_seconds: soon", r"probe_interval_seconds: expected a positive number, got 'soon'"),
    ("upstream_timeout_seconds: -1", r"upstream_timeout_seconds: expected a positive number, got -1"),
    ("probe_interval_seconds: .inf", r"probe_interval_seconds: expected a positive number, got inf"),
    ("split: {baseline: half}", r"split.baseline: expected a number of percent, got 'half'"),
    ("split: [baseline]", r"split: expected a mapping of NAME: VALUE"),
    ("tasks: code", r"tasks: expected a list, got 'code'"),
    ("listen_address: 9400", r"listen_address: expected a string, got 9400"),
    ("rules: [code]", r"rules\[0\]: expected a mapping"),
])
def test_bad_yaml_values_name_the_key_and_what_was_expected(tmp_path, line, match):
    f = tmp_path / "x.yaml"
    f.write_text(f"upstreams: {{baseline: 'http://x'}}\n{line}\n")
    with pytest.raises(ConfigError, match=match):
        load({}, f)


def test_unknown_yaml_keys_are_refused_with_the_known_ones(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("upstreams: {baseline: 'http://x'}\nprobe_interval: 5\nlisten: ':9400'\n")
    with pytest.raises(ConfigError, match="unknown keys listen, probe_interval; known keys: upstreams, ") as err:
        load({}, f)
    assert all(key in str(err.value) for key in YAML_KEYS)


def test_numbers_in_yaml_are_read_as_given(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("upstreams: {baseline: 'http://x'}\nmax_body_bytes: 1024\nprobe_interval_seconds: 0.5\n")
    cfg = load({}, f)
    assert (cfg.max_body_bytes, cfg.probe_interval_seconds, cfg.upstream_timeout_seconds) == (1024, 0.5, 600.0)


@pytest.mark.parametrize("text,message", [
    ("upstreams: {baseline: 'http://x'}\nmax_body_bytes: lots\n",
     "max_body_bytes: expected a positive integer, got 'lots'"),
    ("upstreams: {baseline: 'http://x'}\nprobe_intervall: 5\n", "unknown key probe_intervall; known keys: "),
])
def test_a_bad_config_file_exits_2_with_the_key_and_no_traceback(tmp_path, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    done = subprocess.run([sys.executable, "-m", "specwatch.cli", "exporter", "--config.file", str(f)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()  # one message, as for every other configuration error
    assert line.startswith(f"specwatch exporter: --config.file {f}: {message}")


def test_classification_header_rules_and_other():
    cfg = load({"upstream": ["baseline=http://x"]}, None)
    code = {"messages": [{"role": "user", "content": article_prompt("code", 0)}]}
    chat = {"messages": [{"role": "user", "content": article_prompt("chat", 0)}]}
    assert classify(cfg, "/v1/chat/completions", {}, code) == "code"
    assert classify(cfg, "/v1/chat/completions", {}, chat) == "chat"
    assert classify(cfg, "/v1/chat/completions", {"x-specwatch-task": "chat"}, code) == "chat"
    assert classify(cfg, "/v1/chat/completions", {"x-specwatch-task": "'; DROP"}, code) == "other"
    assert classify(cfg, "/v1/completions", {}, {"prompt": "def f():\n  pass"}) == "code"


def test_yaml_rules_match_on_path_model_and_header(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("upstreams: {baseline: 'http://x'}\ntasks: [code, chat, rag]\nrules:\n"
                 "  - {task: rag, header: X-App, header_regex: '^search'}\n"
                 "  - {task: code, model: coder}\n  - {task: chat, path: /v1/chat/completions}\n")
    cfg = load({}, f)
    assert classify(cfg, "/v1/chat/completions", {"x-app": "search-ui"}, {"model": "m"}) == "rag"
    assert classify(cfg, "/v1/completions", {}, {"model": "coder"}) == "code"
    assert classify(cfg, "/v1/chat/completions", {}, {"model": "m"}) == "chat"
    assert classify(cfg, "/v1/completions", {}, {"model": "m"}) == "other"


def test_split_shares_and_stickiness():
    cfg = load({"upstream": ["baseline=http://x", "candidate=http://y"], "split": ["candidate=20"],
                "sticky_header": "X-S"}, None)
    router = Router(cfg, ExporterMetrics(CollectorRegistry(), cfg), random.Random(7))
    picks = [router.route({}) for _ in range(5000)]
    assert 0.17 < picks.count("candidate") / len(picks) < 0.23
    assert len({router.route({"x-s": "user-42"}) for _ in range(50)}) == 1
    assert router.route({"x-specwatch-variant": "candidate"}) == "candidate"
    assert router.route({"x-specwatch-variant": "nope"}) in ("baseline", "candidate")
    router.weights["candidate"] = 0
    assert {router.route({}) for _ in range(200)} == {"baseline"}


def test_sse_splitter_keeps_every_byte_across_arbitrary_chunking():
    stream = (b'data: {"a":1}\n\n' b": keep-alive\n\n" b'data: {"b":2}\r\n\r\n' b"data: [DONE]\n\n")
    for cut in range(1, len(stream)):
        splitter = SseSplitter()
        events = [*splitter.feed(stream[:cut]), *splitter.feed(stream[cut:]), *splitter.flush()]
        assert b"".join(e.raw for e in events) == stream
        assert [e.json() for e in events] == [{"a": 1}, None, {"b": 2}, None]
        assert events[1].data is None and events[3].data == b"[DONE]"


def test_usage_is_requested_only_when_the_client_did_not():
    plain = json.dumps({"stream": True, "messages": []}).encode()
    planned = plan_request("/v1/chat/completions", plain, "application/json")
    assert planned.strip_usage and json.loads(planned.body)["stream_options"] == {"include_usage": True}
    asked = json.dumps({"stream": True, "stream_options": {"include_usage": True}}).encode()
    assert plan_request("/v1/chat/completions", asked, "application/json").body == asked
    assert plan_request("/v1/models", plain, "application/json").parsed is None
    assert _stamp_fingerprint(b'data: {"a":1}\n\n', "fp") == b'data: {"a":1,"system_fingerprint":"fp"}\n\n'


def test_event_log_rotates_and_stays_bounded(tmp_path):
    log = EventLog(tmp_path / "events.jsonl", max_bytes=2000)
    for i in range(200):
        log.write({"i": i, "pad": "x" * 20})
    log.close()
    current, previous = tmp_path / "events.jsonl", tmp_path / "events.jsonl.1"
    assert current.stat().st_size + previous.stat().st_size <= 2000
    last = [json.loads(line)["i"] for line in current.read_text().splitlines()]
    assert last[-1] == 199


# -- the direct relay (upstream.py + SseRelay): what the speed-up must not change ----------------------------------

def _sse_stream(strip: bool) -> bytes:
    """A vLLM-shaped stream: content chunks (one with escapes and non-ASCII), finish, usage with spec metrics."""
    head = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":'
    parts = [head + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}'
             b'\n\n']
    for text in (" a", " \\u00e9\\n", " \xc3\xa9t\xc3\xa9", " b"):
        parts.append(head + b'[{"index":0,"delta":{"content":"' + text.encode("latin-1") +
                     b'"},"logprobs":null,"finish_reason":null}]}\n\n')
    parts.append(head + b'[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length","stop_reason":null}]}\n\n')
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    spec = {"speculative_decoding": {"num_spec_tokens": 3, "num_draft_tokens": 6, "num_accepted_draft_tokens": 2,
                                     "num_spec_steps": 2, "acceptance_histogram": [1, 0, 1, 0]}}
    parts.append(head[:-len(b'"choices":')] + b'"choices":[],"usage":' + json.dumps(usage).encode() +
                 b',"system_fingerprint":"fp-1","metrics":' + json.dumps(spec).encode() + b"}\n\n")
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for size in sizes:
        piece = body[pos:pos + size]
        pos += size
        if piece:
            out += b"%x\r\n%b\r\n" % (len(piece), piece)
    if pos < len(body):
        out += b"%x\r\n%b\r\n" % (len(body) - pos, body[pos:])
    return out + b"0\r\n\r\n"


def _relay_through(wire: bytes, cuts: list[int], strip: bool) -> tuple[bytes, Any, list[bytes]]:
    """Feed an upstream response, split at `cuts`, through Connection + SseRelay as the tap does."""
    import asyncio

    from prometheus_client import CollectorRegistry

    from specwatch.exporter.accounting import RequestRecord
    from specwatch.exporter.metrics import ExporterMetrics
    from specwatch.exporter.relays import SseRelay, UpstreamRequest
    from specwatch.exporter.upstream import Connection

    loop = asyncio.new_event_loop()
    try:
        cfg = load({"upstream": ["baseline=http://127.0.0.1:1"]}, None)
        metrics = ExporterMetrics(CollectorRegistry(), cfg)
        record = RequestRecord("r", "baseline", "chat", "/v1/chat/completions", True, False, True)
        relay = SseRelay(UpstreamRequest(b"", {}, True, strip), record, metrics)
        conn = Connection(loop)
        conn.transport = type("T", (), {"write": lambda self, b: None, "is_closing": lambda self: False,
                                        "close": lambda self: None, "abort": lambda self: None})()
        conn.send(b"")
        sent: list[bytes] = []
        conn.attach(lambda chunk: sent.append(relay.feed(chunk)))
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        data = head + wire
        edges = [0, *sorted(set(cuts)), len(data)]
        for a, b in zip(edges, edges[1:], strict=False):
            if b > a:
                conn.data_received(data[a:b])
        assert conn.ended is not None and conn.ended.done() and conn.ended.exception() is None
        assert conn.reusable
        sent.append(relay.finish(200))
        return b"".join(sent), record, sent
    finally:
        loop.close()


def test_each_event_is_offered_to_the_plain_reader_once_when_chunks_hold_one_event():
    """vLLM writes one event per HTTP chunk: an event the reader refuses (finish, usage, [DONE]) goes to the
    full parse without a second try of the reader's pattern (three pattern matches per request saved),
    and what the client gets and the record counts are unchanged."""
    from prometheus_client import CollectorRegistry

    from specwatch.exporter.accounting import RequestRecord
    from specwatch.exporter.metrics import ExporterMetrics
    from specwatch.exporter.relays import SseRelay, UpstreamRequest

    stream = _sse_stream(False)
    events = [e + b"\n\n" for e in stream.split(b"\n\n")[:-1]]
    metrics = ExporterMetrics(CollectorRegistry(), load({"upstream": ["baseline=http://127.0.0.1:1"]}, None))
    record = RequestRecord("r", "baseline", "chat", "/v1/chat/completions", True, False, True)
    relay = SseRelay(UpstreamRequest(b"", {}, True, False), record, metrics)
    offered: list[bytes] = []
    reader = relay.plain

    class Counting:
        prefix, suffix = None, b""

        def text(self, data: bytes) -> bytes | None:
            offered.append(data)
            return reader.text(data)

    relay.plain = Counting()  # type: ignore[assignment]
    out = b"".join(relay.feed(event) for event in events) + relay.finish(200)
    assert out == stream
    assert offered == [event[6:-2] for event in events]  # each event once, in order
    assert record.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert record.finish_reasons == ["length"] and record.outcome == "ok"
    assert record.output.hexdigest() == hashlib.sha256(" a é\n été b".encode()).hexdigest()


@pytest.mark.parametrize("strip", [False, True])
def test_direct_relay_is_byte_identical_and_exact_however_the_bytes_arrive(strip):
    """Upstream chunk boundaries anywhere (inside the size line, the CRLFs, an event, a UTF-8 sequence), reads
    split anywhere: the client gets the upstream's bytes (usage chunk removed and fingerprint stamped when the
    tap asked for usage), [DONE] only from finish(), and the record's text hash and usage are exact."""
    stream = _sse_stream(strip)
    from specwatch.exporter.relays import _stamp_fingerprint
    if strip:  # what the client would have received from vLLM without include_usage
        events = stream.split(b"\n\n")[:-1]
        finish = _stamp_fingerprint(events[-3] + b"\n\n", "fp-1")
        expected = b"".join(e + b"\n\n" for e in events[:-3]) + finish + b"data: [DONE]\n\n"
    else:
        expected = stream
    text = " a" + " é\n" + " été" + " b"
    rng = random.Random(18)
    cases: list[tuple[list[int], list[int]]] = [([len(stream)], []), ([1] * len(stream), [])]
    for _ in range(60):
        sizes = [rng.randint(1, 300) for _ in range(8)]
        wire = _chunked(stream, sizes)
        cuts = [rng.randint(1, len(wire) + 80) for _ in range(rng.randint(0, 12))]
        cases.append((sizes, cuts))
    for sizes, cuts in cases:
        got, record, sent = _relay_through(_chunked(stream, sizes), cuts, strip)
        assert got == expected
        assert b"[DONE]" in sent[-1] and not any(b"[DONE]" in s for s in sent[:-1])  # held for the accounting
        assert record.output.hexdigest() == __import__("hashlib").sha256(text.encode()).hexdigest()
        assert record.usage == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert record.spec is not None and record.spec["num_accepted_draft_tokens"] == 2
        assert record.finish_reasons == ["length"] and record.outcome == "ok"


def test_batched_gaps_end_as_if_each_gap_had_been_observed_and_show_within_a_second():
    from prometheus_client import CollectorRegistry, Histogram

    from specwatch.exporter.accounting import ITL_FLUSH_SECONDS, Gaps
    from specwatch.exporter.metrics import LATENCY_BUCKETS

    def child() -> tuple[CollectorRegistry, Any]:
        registry = CollectorRegistry()
        family = Histogram("itl_seconds", "ITL", ["variant"], buckets=LATENCY_BUCKETS, registry=registry)
        return registry, family.labels("v")

    def samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
        return {(s.name, s.labels.get("le", "")): s.value for m in registry.collect() for s in m.samples
                if not s.name.endswith("_created")}

    rng = random.Random(7)
    gaps = [rng.choice(LATENCY_BUCKETS) for _ in range(40)]  # exactly on a bound: counted in that bucket (le)
    gaps += [rng.uniform(0, 0.05) for _ in range(400)] + [0.0, 200.0, 1e-9]
    observed_registry, observed = child()
    batched_registry, batched = child()
    now = 1000.0
    batch = Gaps(batched, now)
    for gap in gaps:
        observed.observe(gap)
        batch.add(gap, now)  # the clock does not move: nothing is flushed yet
    assert samples(batched_registry)[("itl_seconds_count", "")] == 0
    batch.add(0.01, now + ITL_FLUSH_SECONDS)  # a second later: everything so far shows
    observed.observe(0.01)
    assert samples(batched_registry) == pytest.approx(samples(observed_registry))
    batch.add(0.003, now + ITL_FLUSH_SECONDS + 0.1)
    observed.observe(0.003)
    assert samples(batched_registry) != samples(observed_registry)
    batch.flush(now + 2)  # what account() does at the end of the request
    assert samples(batched_registry) == pytest.approx(samples(observed_registry))


def test_observe_by_bisect_ends_as_the_library_observe_on_bounds_between_them_and_past_them():
    from prometheus_client import CollectorRegistry, Histogram

    from specwatch.exporter.accounting import observe
    from specwatch.exporter.metrics import LATENCY_BUCKETS

    def child() -> tuple[CollectorRegistry, Any]:
        registry = CollectorRegistry()
        family = Histogram("x_seconds", "x", ["variant"], buckets=LATENCY_BUCKETS, registry=registry)
        return registry, family.labels("v")

    def samples(registry: CollectorRegistry) -> list[tuple[str, str, float]]:
        return sorted((s.name, s.labels.get("le", ""), s.value) for m in registry.collect() for s in m.samples
                      if not s.name.endswith("_created"))

    rng = random.Random(11)
    amounts = [*LATENCY_BUCKETS, *(rng.uniform(0, 2 * LATENCY_BUCKETS[-1]) for _ in range(500)), 0.0, -1.0, 1e9,
               float("inf"), float("nan")]
    library_registry, library = child()
    ours_registry, ours = child()
    for amount in amounts:
        library.observe(amount)
        observe(ours, amount)
    got, want = samples(ours_registry), samples(library_registry)
    assert [(n, le) for n, le, _ in got] == [(n, le) for n, le, _ in want]
    assert [v for *_, v in got if v == v] == pytest.approx([v for *_, v in want if v == v])  # the NaN sum aside
    assert sum(1 for *_, v in got if v != v) == sum(1 for *_, v in want if v != v) == 1


async def _get(pool: Pool, port: int) -> Connection:
    """One GET over a connection from `pool` to the loopback server on `port`, answered whole; the connection."""
    conn, _ = await pool.acquire("127.0.0.1", port)
    conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert conn.head is not None and conn.ended is not None
    await conn.head
    conn.attach(lambda _: None)
    await conn.ended
    return conn


def test_the_relay_pool_keeps_a_bounded_number_of_idle_connections_and_closes_stale_ones():
    """A real keep-alive server on loopback: after a peak of 6 concurrent requests, at most `max_idle`
    connections stay open, the most recent is reused, and once idle for `idle_seconds` all are closed."""
    import asyncio

    async def scenario() -> tuple[int, int, bool, int, int, int]:
        open_now: set[asyncio.StreamWriter] = set()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            open_now.add(writer)
            try:
                while await reader.readuntil(b"\r\n\r\n"):
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                open_now.discard(writer)
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool(idle_seconds=0.5, max_idle=3)

        conns = await asyncio.gather(*(_get(pool, port) for _ in range(6)))  # six at once: six connections
        peak = len(open_now)
        for conn in conns:
            pool.release("127.0.0.1", port, conn)
        await asyncio.sleep(0.1)
        after_peak, kept = len(open_now), pool.idle_count()
        again, reused = await pool.acquire("127.0.0.1", port)
        newest = again is conns[-1] and reused
        pool.release("127.0.0.1", port, again)
        await asyncio.sleep(1.5)  # past idle_seconds with no traffic: the sweep closes them
        quiet, left = len(open_now), pool.idle_count()
        pool.close()
        server.close()
        await server.wait_closed()
        return peak, after_peak, newest, kept, quiet, left

    peak, after_peak, newest, kept, quiet, left = asyncio.run(scenario())
    assert peak == 6
    assert (after_peak, kept) == (3, 3)  # the three oldest closed at once
    assert newest  # the most recently used connection is the one reused
    assert (quiet, left) == (0, 0)


def _turns_with_io(loop_factory: Any, cancel: str = "") -> list[str]:
    """Four stream ends queued on `Turns`; the first one's work makes a socket readable (a new request
    arrives while it runs): the order in which the ends and the socket's read callback run (`cancel`: an
    end cancelled before its turn)."""
    import asyncio
    import socket

    from specwatch.exporter.turns import Turns

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        turns, order = Turns(), []
        a, b = socket.socketpair()
        b.setblocking(False)

        def readable() -> None:
            b.recv(64)
            order.append("io")

        loop.add_reader(b.fileno(), readable)

        async def end(name: str) -> None:
            await turns.wait()
            order.append(name)
            if name == "A":
                a.send(b"x")

        tasks = {name: asyncio.create_task(end(name)) for name in "ABCD"}
        await asyncio.sleep(0)  # all four are waiting for their turn
        assert len(turns) == 4
        if cancel:
            tasks[cancel].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        for _ in range(3):
            await asyncio.sleep(0)
        loop.remove_reader(b.fileno())
        a.close()
        b.close()
        assert len(turns) == 0
        return order

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(scenario())


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_stream_ends_take_turns_so_new_io_is_served_between_them(loop_name: str) -> None:
    """One end per loop iteration: what arrives during one end runs before the third end, not after the last
    (asyncio runs a callback made ready before its poll first, so the second end may come before it)."""
    import asyncio

    import uvloop

    factory = uvloop.new_event_loop if loop_name == "uvloop" else asyncio.new_event_loop
    order = _turns_with_io(factory)
    assert [x for x in order if x != "io"] == ["A", "B", "C", "D"], order  # in arrival order
    assert order.count("io") == 1 and order.index("io") < order.index("C"), order
    order = _turns_with_io(factory, cancel="C")
    assert [x for x in order if x != "io"] == ["A", "B", "D"], order  # a cancelled end gives up its turn


def test_a_long_queue_of_stream_ends_drains_an_eighth_per_iteration() -> None:
    """Never more than max(1, waiting // 8) ends per loop iteration, and 256 of them within 50 iterations."""
    import asyncio

    from specwatch.exporter.turns import Turns

    async def scenario() -> list[int]:
        turns = Turns()
        tasks = [asyncio.create_task(turns.wait()) for _ in range(256)]
        await asyncio.sleep(0)  # every task waits; the first release is scheduled
        sizes = [len(turns)]
        while len(turns) and len(sizes) < 300:
            await asyncio.sleep(0)  # one loop iteration
            sizes.append(len(turns))
        await asyncio.gather(*tasks)
        return sizes

    sizes = asyncio.run(scenario())
    assert sizes[0] == 256 and sizes[-1] == 0, sizes
    assert all(0 <= a - b <= max(1, a // 8) for a, b in zip(sizes, sizes[1:], strict=False)), sizes
    assert len(sizes) <= 50 and sizes[1] < 256, sizes


@pytest.mark.parametrize("loop_name", ["asyncio", "uvloop"])
def test_a_connection_reset_before_the_request_is_written_refuses_to_send(loop_name: str) -> None:
    """A server that accepts and resets at once: once the reset is read, `send` raises `NotSent` (an OSError,
    which the tap answers with a 502 after one more try), where uvloop's write used to raise RuntimeError and
    asyncio's used to drop the bytes silently (the tap then waited for a head until its deadline)."""
    import asyncio
    import socket
    import struct

    import uvloop

    from specwatch.exporter.upstream import NotSent

    async def scenario() -> tuple[bool, bool, BaseException | None]:
        listener = socket.create_server(("127.0.0.1", 0))
        listener.setblocking(False)
        loop = asyncio.get_running_loop()
        pool = Pool()
        conn, reused = await pool.acquire("127.0.0.1", listener.getsockname()[1])
        accepted, _ = await loop.sock_accept(listener)
        accepted.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        accepted.close()  # a reset
        for _ in range(200):  # until the loop has read the reset
            if conn.lost:
                break
            await asyncio.sleep(0.01)
        error: BaseException | None = None
        try:
            conn.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        except BaseException as exc:  # noqa: BLE001 - the type is what is checked
            error = exc
        pool.close()
        listener.close()
        return reused, conn.lost, error

    factory = uvloop.new_event_loop if loop_name == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        reused, lost, error = runner.run(scenario())
    assert not reused and lost
    assert isinstance(error, NotSent) and isinstance(error, OSError), repr(error)


def test_a_connection_released_while_paused_reads_again_and_sees_the_upstream_close() -> None:
    """A relay may pause reading (a slow or gone client) in the read that ends the response; the pool resumes
    it, so the upstream closing the idle connection marks it lost and it is never handed out again."""
    import asyncio

    async def scenario() -> tuple[bool, bool, bool]:
        closing: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
            closing.append(writer)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = Pool()
        conn = await _get(pool, port)
        conn.pause()
        pool.release("127.0.0.1", port, conn)
        for _ in range(100):
            if closing:
                break
            await asyncio.sleep(0.01)
        closing[0].close()  # the upstream closes the idle connection
        for _ in range(100):
            if conn.lost:
                break
            await asyncio.sleep(0.01)
        again, reused = await pool.acquire("127.0.0.1", port)
        server.close()
        pool.close()
        again.abort()
        return conn.lost, again is conn, reused

    lost, same, reused = asyncio.run(scenario())
    assert lost and not same and not reused


COMPAT_BUMP = """
import aiohttp, sys
aiohttp.__version__ = "3.15.0"  # what a dependency bump would install
try:
    import specwatch.exporter.compat
except ImportError as exc:
    print(type(exc).__name__, exc)
    sys.exit(3)
"""


def test_a_dependency_bump_stops_the_exporter_at_import_naming_what_it_was_written_for():
    import subprocess
    import sys

    from specwatch.exporter import compat

    bumped = subprocess.run([sys.executable, "-c", COMPAT_BUMP], capture_output=True, text=True, timeout=60)
    assert bumped.returncode == 3, (bumped.stdout, bumped.stderr)
    assert "IncompatibleDependency" in bumped.stdout and "written for aiohttp 3.14.x and found aiohttp 3.15.0" in \
        bumped.stdout
    with pytest.raises(compat.IncompatibleDependency, match="prometheus_client 0.26.x and found prometheus_client 1.0"):
        compat.check({"aiohttp": "3.14.9", "prometheus_client": "1.0.0"})
    compat.check({"aiohttp": "3.14.9", "prometheus_client": "0.26.3"})  # a patch release passes the version check
    # and it is the only module that reaches into them: the rest of the tap goes through it
    private = re.compile(r"\._(upper_bounds|buckets|sum|headers_buf|send_headers_with_payload"
                         r"|send_headers_immediately)\b|\bValueClass\b|MultiProcessValue")
    package = Path(compat.__file__).parents[1]
    reaching = [f"{path.relative_to(package)}: {line.strip()}" for path in package.rglob("*.py")
                if path.name != "compat.py" for line in path.read_text().splitlines()
                if private.search(line) and not line.lstrip().startswith("#")]
    assert private.search(Path(compat.__file__).read_text())  # the pattern finds them where they are
    assert not reaching, reaching
