"""The exporter over real HTTP in front of simulators: exact accounting, byte-identical relay, faults."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from specwatch.chat_client import fetch_metrics
from specwatch.net import free_port
from specwatch.snapshot import server_figures
from specwatch.workloads import article_rows
from tests.capture_checks import sse_events
from tests.conftest import NGRAM_SIM_ARGS, Service

Factory = Callable[[str, list[str]], Service]


def samples_in(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for fam in text_string_to_metric_families(exposition):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def samples(url: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return samples_in(fetch_metrics(url), name)


def value_in(exposition: str, name: str, **labels: str) -> float:
    """The sum of a family's samples in one exposition whose labels include `labels`."""
    return sum(v for k, v in samples_in(exposition, name).items() if all((lk, lv) in k for lk, lv in labels.items()))


def value(url: str, name: str, **labels: str) -> float:
    return value_in(fetch_metrics(url), name, **labels)


@pytest.fixture(scope="module")
def upstream(sim_factory: Callable[[list[str]], Service]) -> Service:
    return sim_factory(NGRAM_SIM_ARGS)


@pytest.fixture(scope="module")
def event_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("events") / "events.jsonl"


@pytest.fixture(scope="module")
def tap(service_factory: Factory, upstream: Service, event_log: Path) -> Service:
    return service_factory("exporter", ["--upstream", f"baseline={upstream.url}", "--event-log", str(event_log)])


def chat(url: str, prompt: str, task: str | None = None, max_tokens: int = 48, stream: bool = False,
         usage: bool = False, **extra: object) -> requests.Response:
    body: dict[str, object] = {"model": "spec-demo", "messages": [{"role": "user", "content": prompt}],
                               "temperature": 0, "max_tokens": max_tokens, **extra}
    if stream:
        body["stream"] = True
        if usage:
            body["stream_options"] = {"include_usage": True}
    headers = {"X-Specwatch-Task": task} if task else {}
    r = requests.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    return r


def spec_of(r: requests.Response) -> dict:
    if r.headers["content-type"].startswith("text/event-stream"):
        events = [e for e in sse_events(r.content) if e != "[DONE]"]
        return dict(events[-1]["metrics"]["speculative_decoding"])
    return dict(r.json()["metrics"]["speculative_decoding"])


def test_counters_by_task_equal_what_clients_received_and_the_upstreams_deltas(tap, upstream):
    before_tap = {n: samples(tap.url, n) for n in ("specwatch_spec_steps_total", "specwatch_accepted_tokens_total")}
    before_up = fetch_metrics(upstream.url)
    received: dict[str, list[dict]] = {"code": [], "chat": []}
    for task in ("code", "chat"):
        for i, row in enumerate(article_rows(task)[:3]):
            # with the header, and without it (the default rules classify the article's prompts)
            r = chat(tap.url, row.prompt, task if i % 2 else None, stream=i == 2, usage=i == 2)
            received[task].append(spec_of(r))
    delta_up = server_figures(before_up, fetch_metrics(upstream.url))
    for task, fields in received.items():
        labels = {"variant": "baseline", "task": task}
        assert value(tap.url, "specwatch_spec_steps_total", **labels) - sum(
            v for k, v in before_tap["specwatch_spec_steps_total"].items() if ("task", task) in k) == sum(
            f["num_spec_steps"] for f in fields)
        assert value(tap.url, "specwatch_accepted_tokens_total", **labels) - sum(
            v for k, v in before_tap["specwatch_accepted_tokens_total"].items() if ("task", task) in k) == sum(
            f["num_accepted_draft_tokens"] for f in fields)
    every = received["code"] + received["chat"]
    assert delta_up.steps == sum(f["num_spec_steps"] for f in every)
    assert delta_up.accepted == sum(f["num_accepted_draft_tokens"] for f in every)
    for p in range(4):
        assert delta_up.per_position[p] == sum(sum(f["acceptance_histogram"][p + 1:]) for f in every)
    # the per-position family follows vLLM's definition
    code_pos0 = value(tap.url, "specwatch_accepted_tokens_per_pos_total", task="code", position="0")
    assert code_pos0 >= sum(sum(f["acceptance_histogram"][1:]) for f in received["code"])


def _normalise(raw: bytes) -> bytes:
    return re.sub(rb'"created":\d+', b'"created":0', raw)


@pytest.mark.parametrize("extra", [{}, {"logprobs": True, "top_logprobs": 2}, {"stop": ["scale_1"]}],
                         ids=["plain", "logprobs", "long-stop"])
@pytest.mark.parametrize("usage", [True, False])
def test_streamed_bytes_equal_the_upstreams_and_usage_injection_is_invisible(tap, upstream, usage, extra):
    """Also for streams whose chunks carry logprobs or held-back empty content: relayed whole, tokens counted."""
    prompt = article_rows("code")[4].prompt
    body = {"model": "spec-demo", "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": 40, "stream": True, **extra}
    if usage:
        body["stream_options"] = {"include_usage": True}
    rid = {"X-Request-Id": uuid.uuid4().hex}
    direct = requests.post(upstream.url + "/v1/chat/completions", json=body, headers=rid, timeout=60).content
    tokens_before = value(tap.url, "specwatch_completion_tokens_total")
    tapped = requests.post(tap.url + "/v1/chat/completions", json=body, headers=rid, timeout=60).content
    assert _normalise(tapped) == _normalise(direct)
    has_usage_chunk = any(e != "[DONE]" and e["choices"] == [] for e in sse_events(tapped))
    assert has_usage_chunk is usage
    usage_of_direct = [e["usage"] for e in sse_events(direct) if e != "[DONE]" and e.get("usage")]
    if usage_of_direct:
        assert value(tap.url, "specwatch_completion_tokens_total") - tokens_before == \
            usage_of_direct[-1]["completion_tokens"]


def test_tap_counts_streams_whose_client_did_not_ask_for_usage(tap, upstream):
    before = value(tap.url, "specwatch_spec_steps_total", task="code")
    before_up = fetch_metrics(upstream.url)
    chat(tap.url, article_rows("code")[6].prompt, "code", stream=True, usage=False)
    assert value(tap.url, "specwatch_spec_steps_total", task="code") - before == \
        server_figures(before_up, fetch_metrics(upstream.url)).steps > 0


def test_random_task_headers_cannot_grow_the_series(tap, upstream):
    before = len(samples(tap.url, "specwatch_requests_total"))
    others = value(tap.url, "specwatch_requests_total", task="other")
    for _ in range(20):
        chat(tap.url, "hello", task=uuid.uuid4().hex, max_tokens=2)
    assert len(samples(tap.url, "specwatch_requests_total")) == before
    assert value(tap.url, "specwatch_requests_total", task="other") == others + 20


def test_oversized_body_is_refused_with_413_counted_and_logged_alike(tap, event_log):
    counted = value(tap.url, "specwatch_requests_total", outcome="rejected")
    logged = len(event_log.read_text().splitlines())
    r = requests.post(tap.url + "/v1/chat/completions", data=b"x" * (17 * 1024 * 1024),
                      headers={"Content-Type": "application/json", "X-Specwatch-Task": "chat"}, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == 413
    assert value(tap.url, "specwatch_requests_total", outcome="rejected", task="chat") >= 1
    assert value(tap.url, "specwatch_requests_total", outcome="rejected") == counted + 1
    # the canary's two sources agree: the event log has the same request, same labels and outcome
    lines = [json.loads(line) for line in event_log.read_text().splitlines()]
    assert len(lines) == logged + 1
    assert {k: lines[-1][k] for k in ("variant", "task", "outcome", "status", "path")} == {
        "variant": "baseline", "task": "chat", "outcome": "rejected", "status": 413, "path": "/v1/chat/completions"}


def test_other_paths_pass_through(tap, upstream):
    """Over the tap's own client like every request: a GET's body, a HEAD's head alone (no body is waited for), and
    the kept-alive connection serves the next request after both."""
    with requests.Session() as session:
        got = session.get(tap.url + "/v1/models", timeout=10)
        assert got.status_code == 200 and got.json()["data"][0]["id"] == "spec-demo"
        head = session.head(tap.url + "/v1/models", timeout=10)
        assert head.status_code == 200 and head.content == b""
        assert session.get(tap.url + "/version", timeout=10).json() == {"version": "0.32.0"}


def test_each_upstreams_version_is_exposed_as_an_info_series(tap, upstream, service_factory):
    """Issue 43: the version each upstream's GET /version answers (the simulator answers what vLLM 0.32.0 does),
    read by the health probe once the upstream is up: `specwatch_upstream_version_info{variant, version} 1`; an
    upstream that answers no version object reads `unknown`, so label values stay bounded."""
    answered = requests.get(upstream.url + "/version", timeout=10).json()["version"]
    deadline = time.monotonic() + 15  # the first probe round runs at start, the next 5 s later
    while time.monotonic() < deadline and value(tap.url, "specwatch_upstream_version_info", variant="baseline",
                                                 version=answered) != 1:
        time.sleep(0.5)
    versions = {dict(k)["version"]: v for k, v in samples(tap.url, "specwatch_upstream_version_info").items()}
    assert versions == {answered: 1.0}, versions
    # an upstream whose version is no label value (markup, a space, 80 characters): healthy, its version `unknown`
    with broken_upstream() as url:
        odd = service_factory("exporter", ["--upstream", f"baseline={url}"])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not samples(odd.url, "specwatch_upstream_version_info"):
            time.sleep(0.5)
        found = samples(odd.url, "specwatch_upstream_version_info")
    assert {dict(k)["version"]: v for k, v in found.items()} == {"unknown": 1.0}, found


def test_event_log_has_one_line_per_request(tap, event_log):
    before = len(event_log.read_text().splitlines())
    r = chat(tap.url, article_rows("code")[9].prompt, "code")
    lines = [json.loads(line) for line in event_log.read_text().splitlines()]
    assert len(lines) == before + 1
    last = lines[-1]
    spec = spec_of(r)
    assert (last["task"], last["variant"], last["outcome"]) == ("code", "baseline", "ok")
    assert (last["C"], last["D"], last["R"]) == (spec["num_accepted_draft_tokens"], spec["num_draft_tokens"],
                                                 spec["num_spec_steps"])
    assert last["finish_reasons"] == [r.json()["choices"][0]["finish_reason"]]


def test_upstream_down_gives_502_and_upstream_up_drops(service_factory):
    dead = f"http://127.0.0.1:{free_port()}"
    tap = service_factory("exporter", ["--upstream", f"baseline={dead}"])
    r = requests.post(tap.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]},
                      timeout=30)
    assert r.status_code == 502 and r.json()["error"]["code"] == 502
    assert value(tap.url, "specwatch_requests_total", outcome="upstream_error") == 1
    assert value(tap.url, "specwatch_upstream_up", variant="baseline") == 0


def test_an_upstream_that_resets_every_connection_as_it_accepts_gives_only_502s(service_factory):
    """A server restarting (CI: a crashed simulator back within a second) can accept a connection and reset it
    at once. The reset may land between the tap's connect and its write: that must be a 502 like any other
    broken upstream, never a 500 (it was one in about 300, uvloop's write on the closed transport raising
    RuntimeError). A thousand streamed requests, each on a new connection, every one a counted 502."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=512)
    listener.settimeout(0.2)
    stop = threading.Event()

    def reset_each() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            conn.close()

    thread = threading.Thread(target=reset_each, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
        codes: dict[int, int] = {}
        with requests.Session() as session:
            for _ in range(1000):
                r = session.post(tap.url + "/v1/chat/completions", json=body, timeout=30)
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code != 502:
                    break
        assert codes == {502: 1000}, (codes, tap.log.read_text()[-3000:])
        assert value(tap.url, "specwatch_requests_total", outcome="upstream_error") == 1000
        assert "Traceback" not in tap.log.read_text()
    finally:
        stop.set()
        thread.join(5)
        listener.close()


@contextlib.contextmanager
def broken_upstream() -> Iterator[str]:
    """tests/broken_upstream.py on a free port, answering /health; its URL."""
    port = free_port()
    broken = subprocess.Popen([sys.executable, str(Path(__file__).with_name("broken_upstream.py")), str(port)])
    try:
        for _ in range(100):
            try:
                requests.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        broken.terminate()
        broken.wait(10)


def test_malformed_upstream_answers_are_relayed_and_counted(service_factory, tmp_path):
    with broken_upstream() as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}"])
        plain = requests.post(tap.url + "/v1/chat/completions", json={"messages": []}, timeout=10)
        assert plain.status_code == 200 and plain.content == b'{"id": "x", "choices": ['
        streamed = requests.post(tap.url + "/v1/chat/completions", json={"messages": [], "stream": True},
                                 timeout=10)
        assert b"data: {this is not json\n\n" in streamed.content
        assert value(tap.url, "specwatch_requests_total", outcome="bad_response") == 2
        assert requests.get(tap.url + "/healthz", timeout=5).status_code == 200
        # headers pass through untouched, the tap's own are stripped, and none is logged
        secret = "Bearer sk-" + uuid.uuid4().hex
        echoed = requests.post(tap.url + "/v1/echo-headers", timeout=10, headers={
            "Authorization": secret, "X-Custom": "kept", "X-Specwatch-Task": "code", "X-Specwatch-Variant": "x"}).json()
        assert echoed["Authorization"] == secret and echoed["X-Custom"] == "kept"
        assert not {"X-Specwatch-Task", "X-Specwatch-Variant"} & set(echoed)
        assert secret not in tap.log.read_text()


def test_a_client_that_has_its_answer_finds_it_counted_and_logged(service_factory, tmp_path):
    """The last bytes (a stream's [DONE], a body's last read) leave only after the request is accounted, so a
    client that reads its whole answer and then asks /metrics or the event log finds it there, even when the
    upstream is slow to end its response (the broken upstream waits a second after its last byte)."""
    with broken_upstream() as url:
        events = tmp_path / "events.jsonl"
        tap = service_factory("exporter", ["--upstream", f"baseline={url}",
                                           "--event-log", str(events)])
        for n, stream in enumerate((True, False), start=1):
            body = {"model": "m", "prompt": "x", "max_tokens": 2, "stream": stream}
            with requests.post(tap.url + "/v1/completions", json=body, stream=True, timeout=10) as r:
                if stream:
                    lines = r.iter_lines()
                    while next(lines) != b"data: [DONE]":
                        pass
                else:
                    answer = json.loads(next(r.iter_content(chunk_size=None)))  # the whole body, one write
                    assert answer["usage"]["completion_tokens"] == 2
                # the answer is complete here; the upstream has not ended its response yet
                assert value(tap.url, "specwatch_requests_total", outcome="ok") == n
                assert len(events.read_text().splitlines()) == n


@pytest.mark.parametrize("fast", [True, False], ids=["fast-relay", "python-relay"])
def test_client_disconnect_mid_stream_cancels_upstream(service_factory, upstream, fast):
    tap = service_factory("exporter", ["--upstream", f"baseline={upstream.url}",
                                       *(() if fast else ("--no-fast-relay",))])
    aborted_before = value(upstream.url, "vllm:request_success_total", finished_reason="abort")
    body = json.dumps({"model": "spec-demo", "messages": [{"role": "user", "content": article_rows("chat")[0].prompt}],
                       "max_tokens": 3000, "ignore_eos": True, "stream": True}).encode()
    host, port = tap.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while received.count(b"data:") < 3:  # the role chunk and two content chunks: the second came by the thread
            received += s.recv(4096)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and value(tap.url, "specwatch_requests_total", outcome="client_abort") < 1:
        time.sleep(0.1)
    assert value(tap.url, "specwatch_requests_total", outcome="client_abort") >= 1
    while time.monotonic() < deadline and value(upstream.url, "vllm:request_success_total",
                                                 finished_reason="abort") <= aborted_before:
        time.sleep(0.1)
    assert value(upstream.url, "vllm:request_success_total", finished_reason="abort") == aborted_before + 1
    # the relay thread had the stream when the client left (its chunks are counted when it hands them back)
    assert (value(tap.url, "specwatch_fast_relay_chunks_total") > 0) == fast


@pytest.mark.parametrize("fast", [True, False], ids=["fast-relay", "python-relay"])
def test_a_client_that_stops_reading_stops_the_upstream_read_and_the_tap_buffers_a_bounded_amount(
        service_factory, fast):
    """Backpressure through the relay: the tap stops reading the upstream while the client does not read,
    so what it holds is bounded by its write high-water mark and the sockets' buffers, not the answer's size."""
    flood = 400 * 1024 * 1024
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True,
                       "flood": flood}).encode()
    with broken_upstream() as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}", *(() if fast else ("--no-fast-relay",))])

        def progress() -> dict:
            return requests.get(url + "/v1/flood-progress", timeout=5).json()

        host, port = tap.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            received = b""
            while b"data:" not in received:
                received += s.recv(65536)
            # the client reads no more: the upstream stalls once the buffers on the way are full
            stalled, last, deadline = 0, -1, time.monotonic() + 60
            while stalled < 3 and time.monotonic() < deadline:
                time.sleep(1.0)
                written = progress()["written"]
                stalled, last = (stalled + 1, written) if written == last else (0, written)
            assert stalled == 3, f"the upstream never stalled: {written} bytes written"
            assert 0 < written < 64 * 1024 * 1024, written  # a few MB of socket buffers, not the 400 MB answer
            # the client reads again: the stream resumes and ends, every byte relayed
            total = len(received)
            while True:
                chunk = s.recv(1 << 20)
                total += len(chunk)
                if not chunk or chunk.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                    break
        assert progress()["written"] >= flood and total > flood
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and value(tap.url, "specwatch_requests_total", outcome="ok") < 1:
        time.sleep(0.1)
    assert value(tap.url, "specwatch_requests_total", outcome="ok") == 1
    assert (value(tap.url, "specwatch_fast_relay_chunks_total") > 0) == fast


@pytest.mark.parametrize("fast", [True, False], ids=["fast-relay", "python-relay"])
def test_an_upstream_that_hangs_mid_stream_is_cut_at_the_deadline_and_its_chunks_counted(
        service_factory, tmp_path, fast):
    """The tap's deadline while the relay thread holds the stream: taken back with what it relayed."""
    config = tmp_path / "exporter.yaml"
    config.write_text("upstream_timeout_seconds: 2\n")
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True, "stall": 12}
    with broken_upstream() as url:
        tap = service_factory("exporter", ["--upstream", f"baseline={url}", "--config.file", str(config),
                                           *(() if fast else ("--no-fast-relay",))])
        started = time.monotonic()
        received = b""
        with pytest.raises(requests.exceptions.ChunkedEncodingError):
            with requests.post(tap.url + "/v1/chat/completions", json=body, stream=True, timeout=30) as resp:
                for piece in resp.iter_content(None):
                    received += piece
        assert 1.5 < time.monotonic() - started < 10
        assert received.count(b'"content":" word') == 12  # every chunk before the hang reached the client
        assert value(tap.url, "specwatch_requests_total", outcome="upstream_error") == 1
        assert value(tap.url, "specwatch_itl_seconds_count") == 11  # the gaps between the 12 content chunks
        assert (value(tap.url, "specwatch_fast_relay_chunks_total") > 0) == fast


def test_an_upstream_that_never_answers_is_a_502_at_the_deadline(service_factory, tmp_path):
    """Accepted, read, never answered (no head): a streamed request gets the tap's 502 once the deadline passes."""
    config = tmp_path / "exporter.yaml"
    config.write_text("upstream_timeout_seconds: 1\n")
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])  # kept open, never answered

    threading.Thread(target=accept, daemon=True).start()
    try:
        tap = service_factory("exporter", ["--upstream", f"baseline=http://127.0.0.1:{server.getsockname()[1]}",
                                           "--config.file", str(config)])
        started = time.monotonic()
        got = requests.post(tap.url + "/v1/chat/completions", timeout=30, json={
            "model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True})
        assert 0.8 < time.monotonic() - started < 10
        assert got.status_code == 502 and got.json()["error"]["message"] == "upstream baseline failed: TimeoutError"
        assert value(tap.url, "specwatch_requests_total", outcome="upstream_error") == 1
    finally:
        server.close()
        for conn in held:
            conn.close()


def test_split_is_sticky_and_a_variant_can_be_pinned(service_factory, upstream, sim_factory):
    candidate = sim_factory(NGRAM_SIM_ARGS)
    tap = service_factory("exporter", ["--upstream", f"baseline={upstream.url}", "--upstream",
                                       f"candidate={candidate.url}", "--split", "candidate=50",
                                       "--sticky-header", "X-Session"])
    def variant_counts() -> dict[str, float]:
        return {v: value(tap.url, "specwatch_requests_total", variant=v) for v in ("baseline", "candidate")}

    for session in ("alpha", "beta", "gamma", "delta"):
        before = variant_counts()
        for _ in range(3):
            requests.post(tap.url + "/v1/chat/completions", headers={"X-Session": session},
                          json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}, timeout=30)
        after = variant_counts()
        assert sorted(after[v] - before[v] for v in after) == [0, 3]  # one session, one route
    before = variant_counts()
    for _ in range(4):
        requests.post(tap.url + "/v1/chat/completions", headers={"X-Specwatch-Variant": "candidate"},
                      json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}, timeout=30)
    assert variant_counts()["candidate"] - before["candidate"] == 4


def test_mirror_accounts_both_and_compares_greedy_outputs(service_factory, upstream, sim_factory):
    eagle3 = json.dumps({"method": "eagle3", "model": "x/eagle3", "num_speculative_tokens": 3})
    at = NGRAM_SIM_ARGS.index("--speculative-config") + 1
    candidate = sim_factory([*NGRAM_SIM_ARGS[:at], eagle3, *NGRAM_SIM_ARGS[at + 1:]])
    tap = service_factory("exporter", ["--upstream", f"baseline={upstream.url}", "--upstream",
                                       f"candidate={candidate.url}", "--mirror", "candidate"])
    for row in article_rows("code")[:3]:
        chat(tap.url, row.prompt, "code", max_tokens=32)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and value(tap.url, "specwatch_mirror_outputs_total") < 3:
        time.sleep(0.1)
    assert value(tap.url, "specwatch_requests_total", variant="candidate", outcome="ok") == 3
    assert value(tap.url, "specwatch_requests_total", variant="baseline", outcome="ok") == 3
    # greedy decoding: speculation must not change the text
    assert value(tap.url, "specwatch_mirror_outputs_total", result="identical") == 3
    assert value(tap.url, "specwatch_spec_steps_total", variant="candidate") > 0


def test_a_server_that_forces_usage_keeps_its_usage_chunk_through_the_tap(service_factory, sim_factory):
    forced = sim_factory([*NGRAM_SIM_ARGS, "--enable-force-include-usage"])
    tap = service_factory("exporter", ["--upstream", f"baseline={forced.url}"])
    body = {"messages": [{"role": "user", "content": article_rows("code")[1].prompt}], "temperature": 0,
            "max_tokens": 24, "stream": True}
    rid = {"X-Request-Id": uuid.uuid4().hex}
    direct = requests.post(forced.url + "/v1/chat/completions", json=body, headers=rid, timeout=60).content
    tapped = requests.post(tap.url + "/v1/chat/completions", json=body, headers=rid, timeout=60).content
    assert _normalise(tapped) == _normalise(direct)
    assert value(tap.url, "specwatch_spec_steps_total", task="code") > 0
