"""The exporter against hostile bytes: answers whose fields lie or overflow, bodies nested too deep, lying chunk sizes.

The real exporter process (the compiled relay on and off) in front of a hand-written upstream on loopback that
answers each request with the bytes a test case names (`X-Test-Case`, passed through by the tap). Whatever the
upstream says, a request is counted exactly once, the client gets every byte the upstream sent, and the log gets
one line, never a traceback.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from specwatch.exporter import upstream
from tests.conftest import Service
from tests.loopback import loopback_upstream, request_headers
from tests.test_exporter import value

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0" / "ngram"
STREAM = (FIXTURES / "chat_stream_usage.response").read_bytes()
BODY = (FIXTURES / "chat_nonstream.response").read_bytes()
HUGE = "9" * 400  # no float holds it: float() raises OverflowError

# (field as the captures write it, what replaces it): a count too large for a float, and C = 50 with D = 4
FIELDS = {
    "accepted-huge": (b'"num_accepted_draft_tokens":32', f'"num_accepted_draft_tokens":{HUGE}'.encode()),
    "prompt-huge": (b'"prompt_tokens":247', f'"prompt_tokens":{HUGE}'.encode()),
    "contradictory": (b'"num_accepted_draft_tokens":32,"num_draft_tokens":48',
                      b'"num_accepted_draft_tokens":50,"num_draft_tokens":4'),
}


def chunked(events: list[bytes], sizes: Callable[[bytes], bytes] = lambda e: b"%x" % len(e)) -> bytes:
    return b"".join(sizes(e) + b"\r\n" + e + b"\r\n" for e in events) + b"0\r\n\r\n"


def _sizes(form: bytes) -> Callable[[bytes], bytes]:
    return lambda event: form % len(event)


def sse_events(body: bytes) -> list[bytes]:
    return [e + b"\n\n" for e in body.split(b"\n\n") if e]


def answers() -> dict[str, bytes]:
    """Every case's whole HTTP response."""
    stream_head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
                   b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")

    def body_response(body: bytes) -> bytes:
        return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                % len(body)) + body

    out: dict[str, bytes] = {}
    for name, (old, new) in FIELDS.items():
        assert old in STREAM and old in BODY, name
        out[f"{name}-stream"] = stream_head + chunked(sse_events(STREAM.replace(old, new)))
        out[f"{name}-body"] = body_response(BODY.replace(old, new))
    for name, size in (("hex-prefix", b"0x%x"), ("plus", b"+%x"), ("spaces", b" %x "), ("negative", b"-%x")):
        out[f"size-{name}"] = stream_head + chunked(sse_events(STREAM), _sizes(size))
    return out


def expected_bytes(case: str) -> bytes:
    """What the client must get: the upstream's payload, byte for byte."""
    name, _, kind = case.rpartition("-")
    old, new = FIELDS[name]
    return (STREAM if kind == "stream" else BODY).replace(old, new)


@contextlib.contextmanager
def canned_upstream() -> Iterator[tuple[str, list[str]]]:
    """An upstream that answers each POST with `answers()[X-Test-Case]` and closes; GETs (the tap's probe) get 200.
    Yields its URL and the cases it was asked for."""
    canned = answers()
    asked: list[str] = []

    def answer(conn: socket.socket, got: bytes) -> None:
        case = request_headers(got).get("x-test-case", "")
        asked.append(case)
        conn.sendall(canned.get(case, b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"))

    with loopback_upstream(answer) as url:
        yield url, asked


@pytest.fixture(scope="module", params=[True, False], ids=["fast-relay", "python-relay"])
def tap(request: pytest.FixtureRequest, service_factory: Callable[[str, list[str]], Service]
        ) -> Iterator[tuple[Service, list[str]]]:
    with canned_upstream() as (url, asked):
        yield service_factory("exporter", ["--upstream", f"baseline={url}",
                                           *(() if request.param else ("--no-fast-relay",))]), asked


COUNTERS = ("specwatch_accepted_tokens_total", "specwatch_draft_tokens_total", "specwatch_spec_steps_total",
            "specwatch_prompt_tokens_total", "specwatch_completion_tokens_total",
            "specwatch_request_acceptance_rate_count")


def _counts(url: str) -> dict[str, float]:
    out = {name: value(url, name) for name in COUNTERS}
    for outcome in ("ok", "bad_response", "upstream_error", "rejected"):
        out[outcome] = value(url, "specwatch_requests_total", outcome=outcome)
    return out


def _post(url: str, case: str, stream: bool, body: bytes | None = None) -> requests.Response:
    payload = body if body is not None else json.dumps({
        "model": "spec-demo", "messages": [{"role": "user", "content": "x"}], "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {})}).encode()
    return requests.post(url + "/v1/chat/completions", data=payload, timeout=30,
                         headers={"Content-Type": "application/json", "X-Test-Case": case,
                                  "X-Request-Id": f"hostile-{case}"})


def _log(service: Service) -> str:
    return service.log.read_text(errors="replace")


@pytest.mark.parametrize("kind", ["stream", "body"])
@pytest.mark.parametrize("field", list(FIELDS))
def test_an_overflowing_or_contradictory_field_is_one_bad_response_and_the_client_gets_every_byte(
        tap: tuple[Service, list[str]], field: str, kind: str) -> None:
    service, _ = tap
    case = f"{field}-{kind}"
    before = _counts(service.url)
    got = _post(service.url, case, kind == "stream")
    assert got.status_code == 200 and got.content == expected_bytes(case)
    if kind == "stream":
        assert got.content.endswith(b"data: [DONE]\n\n")
    after = _counts(service.url)
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert moved == {"bad_response": 1}, moved  # counted once, as what it is; no counter took a part of it
    lines = [line for line in _log(service).splitlines() if f"request hostile-{case} " in line]
    assert len(lines) == 1 and "bad_response" in lines[0] and len(lines[0]) < 400, lines
    assert "Traceback" not in _log(service)


def test_a_body_nested_deeper_than_the_parser_goes_gets_a_400_of_the_taps_own(tap: tuple[Service, list[str]]
                                                                               ) -> None:
    service, asked = tap
    before, calls = _counts(service.url), len(asked)
    got = _post(service.url, "deep", True, body=b"[" * 200_000 + b"]" * 200_000)
    assert got.status_code == 400 and "nested deeper" in got.json()["error"]["message"]
    after = _counts(service.url)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"rejected": 1}
    assert len(asked) == calls  # nothing went upstream
    assert "Traceback" not in _log(service)


@pytest.mark.parametrize("size", ["hex-prefix", "plus", "spaces", "negative"])
def test_a_chunk_size_that_is_not_hex_digits_is_bad_framing_never_ok(tap: tuple[Service, list[str]],
                                                                       size: str) -> None:
    service, _ = tap
    before = _counts(service.url)
    with contextlib.suppress(requests.RequestException):  # the tap cuts a mis-framed answer: the client may see it
        _post(service.url, f"size-{size}", True)
    after = _counts(service.url)
    assert after["ok"] == before["ok"] and after["upstream_error"] == before["upstream_error"] + 1, (before, after)
    assert after["specwatch_completion_tokens_total"] == before["specwatch_completion_tokens_total"]


@pytest.mark.parametrize("line, size", [
    (b"1f", 31), (b"1F", 31), (b"0", 0), (b"1f;ext=1", 31), (b"1f ;ext", 31), (b"ffffffffffffffff", 2 ** 64 - 1),
    (b"0x1f", None), (b"+1f", None), (b" 1f", None), (b"1f ", None), (b"-5", None), (b"", None), (b";x", None),
    (b"1_f", None), (b"11111111111111111", None)])
def test_chunk_size_reads_only_hex_digits(line: bytes, size: int | None) -> None:
    assert upstream.chunk_size(line) == size


def test_the_exporter_says_which_relay_carries_the_chunks(tap: tuple[Service, list[str]],
                                                         request: pytest.FixtureRequest) -> None:
    service, _ = tap
    fast = request.node.callspec.params["tap"]  # the fixture's parameter: the compiled relay asked for
    relay, other = ("compiled", "python") if fast else ("python", "compiled")
    assert value(service.url, "specwatch_relay", relay=relay) == 1
    assert value(service.url, "specwatch_relay", relay=other) == 0
    assert f"content chunks relayed by the {relay} relay" in _log(service)
