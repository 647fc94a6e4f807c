"""The Locust user: task-labelled streaming chat requests in a closed loop, per-request results recorded.

The user is a `FastHttpUser` (geventhttpclient, Locust's lighter client than python-requests) and reads
the stream line by line as it arrives; the target host is looked up before any user starts, so the first
wave of C requests leaves within a few ms.
Run it through `specwatch load`, or by hand: `locust -f loadgen/locustfile.py --host URL
--workloads code=data/code.jsonl,chat=data/chat.jsonl` (the web UI shows the same options).
Each user sends one request at a time with no wait (fixed concurrency = number of users),
tasks in turn, rows in order; the first `--warmup` requests of each task are labelled
"<task> warmup" and left out of the results. Locust's request statistics hold the requests alone (one
POST row per task, its time the whole streamed request); TTFT, TPOT and ITL go to the web UI's "LLM latency"
tab and the exporter's acceptance to its "Acceptance" tab (specwatch/load/webui.py), and every request's result
(timings, usage, `metrics.speculative_decoding`) goes to `--results-file`.
Distributed (`--master`, `--worker`s), each worker sends the whole plan and the master ends the run once all
have (see specwatch/load/finish.py).
"""

import locust  # first: gevent patching
import locust.stats

import contextlib
import itertools
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.client import HTTPException
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.socket
from locust import FastHttpUser, constant, events, task
from locust.contrib.fasthttp import FastResponse, ResponseContextManager
from locust.env import Environment
from gevent import GreenletExit
from locust.exception import StopUser

from specwatch.load import webui
from specwatch.load.finish import plan_sent
from specwatch.load.results import STOPPED_MID_REQUEST, RequestResult
from specwatch.workloads import Row, load_jsonl


@events.init_command_line_parser.add_listener
def _arguments(parser: Any) -> None:
    parser.add_argument("--workloads", default="", include_in_web_ui=True,
                        help="TASK=PATH.jsonl[,TASK=PATH.jsonl...]: the task-labelled workloads")
    parser.add_argument("--requests-per-task", type=int, default=0, include_in_web_ui=True,
                        help="measured requests per task (each worker, if distributed), then stop (0: --run-time)")
    parser.add_argument("--warmup", type=int, default=0, include_in_web_ui=True,
                        help="warm-up requests per task, sent first and left out of the results")
    parser.add_argument("--max-tokens", type=int, default=0, include_in_web_ui=True,
                        help="max_tokens for every request (0: each row's output_tokens)")
    parser.add_argument("--ignore-eos", action="store_true", default=False, include_in_web_ui=True,
                        help="fixed work: generate exactly max_tokens (performance runs only)")
    parser.add_argument("--model", default="spec-demo", include_in_web_ui=True)
    parser.add_argument("--seed", type=int, default=42, include_in_web_ui=True)
    parser.add_argument("--results-file", default="", help="append one JSON line per request here")
    parser.add_argument("--exporter-metrics", default="", include_in_web_ui=True,
                        help="the exporter's /metrics for the Acceptance tab (default: HOST/metrics; none: off)")


@dataclass
class RequestPlan:
    """Which request comes next, shared by all users of this Locust process."""

    rows: dict[str, list[Row]]
    measured: int
    warmup: int
    sent: dict[str, int] = field(default_factory=dict)
    in_flight: int = 0
    order: Any = None

    def __post_init__(self) -> None:
        self.sent = dict.fromkeys(self.rows, 0)
        self.order = itertools.cycle(list(self.rows))

    @property
    def budget(self) -> float:
        """Requests per task: warm-ups plus measured ones, or unbounded (then --run-time stops the run)."""
        return self.warmup + self.measured if self.measured else float("inf")

    def next(self) -> tuple[str, Row, bool] | None:
        for _ in range(len(self.rows)):
            name = next(self.order)
            n = self.sent[name]
            if n < self.budget:
                self.sent[name] = n + 1
                rows = self.rows[name]
                return name, rows[n % len(rows)], n < self.warmup
        return None


PLAN: RequestPlan | None = None
RESULTS: Any = None
CSV_PREFIX: str | None = None


@events.test_start.add_listener
def _start(environment: Environment, **_: Any) -> None:
    global PLAN, RESULTS, CSV_PREFIX
    options = environment.parsed_options
    assert options is not None
    CSV_PREFIX = options.csv_prefix
    rows: dict[str, list[Row]] = {}
    for item in filter(None, (options.workloads or "").split(",")):
        name, _, path = item.partition("=")
        rows[name.strip()] = load_jsonl(Path(path.strip()), name.strip())
    if not rows:
        raise SystemExit("--workloads: expected TASK=PATH.jsonl[,TASK=PATH.jsonl...]")
    PLAN = RequestPlan(rows, options.requests_per_task, options.warmup)
    _resolve(environment.host)
    RESULTS = open(options.results_file, "a", encoding="utf-8") if options.results_file else None  # noqa: SIM115


def _resolve(host: str | None) -> None:
    """Look the target up once before any user starts. The process's first lookup imports and starts gevent's
    resolver (~50 ms here): inside the first request it would add to that TTFT and, since greenlets run one
    at a time, hold back the rest of the first wave (and the closed loop keeps that stagger to the end)."""
    url = urlsplit(host or "")
    if url.hostname:
        with contextlib.suppress(OSError, ValueError):
            gevent.socket.getaddrinfo(url.hostname, url.port or (443 if url.scheme == "https" else 80), 0,
                                      socket.SOCK_STREAM)


@events.test_stop.add_listener
def _stop(**_: Any) -> None:
    if RESULTS is not None:
        RESULTS.flush()


@events.quit.add_listener
def _final_csv(**_: Any) -> None:
    """Locust rewrites its CSVs every CSV_STATS_INTERVAL_SEC; a run shorter than that would keep stale ones."""
    if CSV_PREFIX:
        gevent.sleep(locust.stats.CSV_STATS_INTERVAL_SEC + 0.2)


def _write(result: RequestResult) -> None:
    if RESULTS is not None:
        RESULTS.write(result.line())
        RESULTS.flush()


def _whole(response: ResponseContextManager, started: float) -> None:
    """The request's row times the whole streamed answer: FastHttp alone stops the clock at the headers."""
    response.request_meta["response_time"] = (time.perf_counter() - started) * 1000


def _lines(response: FastResponse) -> Iterator[bytes]:
    """The body line by line, each as soon as it is in: geventhttpclient's `readline(sep)` returns one line
    from what the socket has delivered, whereas `iter_content` / `FastHttpSession.iter_lines` read 1024
    bytes, i.e. wait for several SSE messages (and the public `readline` splits on CRLF, which SSE lacks)."""
    raw = response._response
    if raw is None:
        return
    while line := raw.readline(b"\n"):
        yield line


class ChatUser(FastHttpUser):
    """One request in flight at a time, no wait: a closed loop."""

    wait_time = constant(0)
    network_timeout = 900.0  # a read may wait for a whole prefill queue on a slow server

    @task
    def send(self) -> None:
        plan = PLAN
        if plan is None:
            raise StopUser()
        pick = plan.next()
        if pick is None:
            if plan.in_flight == 0:
                plan_sent(self.environment)
            raise StopUser()
        name, row, warmup = pick
        plan.in_flight += 1
        try:
            result = self._request(name, row, warmup)
        finally:
            plan.in_flight -= 1
        _write(result)

    def _request(self, name: str, row: Row, warmup: bool) -> RequestResult:
        options = self.environment.parsed_options
        assert options is not None
        max_tokens = options.max_tokens or row.output_tokens
        body: dict[str, Any] = {
            "model": options.model, "messages": row.messages(), "max_tokens": max_tokens, "temperature": 0,
            "seed": options.seed, "stream": True, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": False}}
        if options.ignore_eos:
            body["ignore_eos"] = True
        label = f"{name} warmup" if warmup else name
        result = RequestResult(task=name, ok=False, warmup=warmup, start=time.time(), end=0.0)
        started = time.perf_counter()
        first = last = None
        done = False
        headers = {"X-Specwatch-Task": name, "Accept-Encoding": "identity"}  # SSE lines, never a gzip stream
        with self.client.post("/v1/chat/completions", json=body, headers=headers, stream=True,
                              catch_response=True, name=label) as response:
            try:
                if response.status_code != 200:
                    raise ValueError(f"HTTP {response.status_code}: {(response.text or '')[:200]}"
                                     if response.status_code else f"no response: {getattr(response, 'error', None)!r}")
                for line in _lines(response):
                    now = time.perf_counter()  # on arrival, before parsing (as vllm bench stamps its messages)
                    if not line.startswith(b"data: "):
                        continue
                    payload = line[6:].rstrip()
                    if payload == b"[DONE]":  # read on to the end of the body: the connection goes back to the pool
                        done = True
                        continue
                    chunk = json.loads(payload)
                    choices = chunk.get("choices") or []
                    if any((c.get("delta") or {}).get("content") or c.get("text") for c in choices):
                        if first is None:
                            first = now
                        else:
                            result.itl_s.append(now - (last or now))
                        last = now
                    if chunk.get("usage") and not choices:
                        result.completion_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                        result.prompt_tokens = int(chunk["usage"].get("prompt_tokens") or 0)
                        metrics = chunk.get("metrics") or {}
                        result.spec = metrics.get("speculative_decoding")
                        timing = {k: v for k, v in metrics.items() if k != "speculative_decoding"}
                        result.server = timing or None
                if not done:
                    raise ValueError("stream ended without [DONE]")
                if not result.completion_tokens:
                    raise ValueError("no usage chunk")
                if options.ignore_eos and result.completion_tokens != max_tokens:
                    raise ValueError(f"ignore_eos: {result.completion_tokens} tokens, expected {max_tokens}")
                _whole(response, started)
                response.success()
                result.ok = True
            except (ValueError, KeyError, TypeError, OSError, HTTPException) as exc:
                result.error = (str(exc) or repr(exc))[:300]
                _whole(response, started)
                response.failure(result.error)
            except GreenletExit:  # the run was stopped mid-stream (past --stop-timeout): the exporter saw it leave
                _whole(response, started)
                response.failure(STOPPED_MID_REQUEST)
                result.error, result.end = STOPPED_MID_REQUEST, time.time()
                _write(result)  # a request that left is on record, as in Locust's and the exporter's counts
                raise
        result.end = time.time()
        if first is not None:
            result.ttft_s = first - started
            if result.completion_tokens > 1 and last is not None:
                result.tpot_s = (last - first) / (result.completion_tokens - 1)
        if result.ok and not warmup:
            if result.ttft_s is not None:
                webui.record("TTFT", name, result.ttft_s)
            if result.tpot_s is not None:
                webui.record("TPOT", name, result.tpot_s)
            for gap in result.itl_s:
                webui.record("ITL", name, gap)
        return result
