"""`specwatch exporter --workers 3` over real HTTP in front of a simulator: exact sums whichever worker answers
`/metrics`, an intact event log, admin changes seen by every worker, a killed worker, a clean stop.

Every request and scrape opens its own connection, so the kernel spreads them over the workers' sockets.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import random
import re
import secrets
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import requests
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from specwatch.chat_client import fetch_metrics
from specwatch.exporter import main as exporter_main
from specwatch.exporter.config import load
from specwatch.exporter.eventlog import EventLog
from specwatch.net import free_port
from specwatch.snapshot import server_figures
from specwatch.workloads import article_rows
from tests.capture_checks import sse_events
from tests.conftest import NGRAM_SIM_ARGS, Service

TOKEN_ENV = "SPECWATCH_TEST_WORKERS_TOKEN"
WORKERS = 3
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass
class Tap:
    service: Service
    token: str
    events: Path

    @property
    def url(self) -> str:
        return self.service.url

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def run_dir(self) -> Path:
        found = re.search(r"run folder (\S+)\)", self.service.log.read_text())
        assert found, self.service.log.read_text()
        return Path(found.group(1))

    def worker_pids(self) -> list[int]:
        pid = self.service.proc.pid
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def start_tap(folder: Path, upstream_url: str, *extra: str) -> Tap:
    token = secrets.token_hex(16)
    events = folder / "events.jsonl"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, token)  # read once, by the parent, at start
        service = Service("exporter", ["--upstream", f"baseline={upstream_url}", "--upstream",
                                       f"candidate={upstream_url}", "--split", "candidate=30",
                                       "--workers", str(WORKERS), "--event-log", str(events),
                                       "--admin-token-env", TOKEN_ENV, *extra], folder / "exporter.log", "/healthz")
    return Tap(service, token, events)


@pytest.fixture(scope="module")
def upstream(sim_factory: Any) -> Service:
    args = [a if a != "16" else "64" for a in NGRAM_SIM_ARGS]  # --max-num-seqs 64
    return sim_factory([*args[:-1], "0.005"])


@pytest.fixture(scope="module")
def tap(upstream: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tap]:
    started = start_tap(tmp_path_factory.mktemp("workers"), upstream.url)
    yield started
    started.service.stop()


def scrape(url: str) -> tuple[str, Samples]:
    """One scrape on a new connection: which worker answered, and its samples."""
    r = requests.get(url + "/metrics", headers={"Connection": "close"}, timeout=10)
    r.raise_for_status()
    out: Samples = {}
    for fam in text_string_to_metric_families(r.text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return r.headers["X-Specwatch-Worker"], out


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and all((k, x) in ls for k, x in labels.items()))


@dataclass
class Sent:
    """What the clients sent and received, summed."""

    ids: dict[str, str] = field(default_factory=dict)  # request id -> task
    ok: Counter[str] = field(default_factory=Counter)  # task -> answered 200
    spec: Counter[tuple[str, str]] = field(default_factory=Counter)  # (task, C | D | R) -> sum
    hist: Counter[int] = field(default_factory=Counter)  # accepted -> steps
    tokens: Counter[tuple[str, str]] = field(default_factory=Counter)  # (task, prompt | completion) -> sum
    streams: int = 0  # streams that carried at least one token
    itl: int = 0  # token-carrying chunks after each stream's first


async def one(session: aiohttp.ClientSession, url: str, i: int, sent: Sent) -> None:
    task = ("code", "chat")[i % 2]
    stream = i % 3 == 0
    rid = f"{i}-" + "x" * random.Random(i).randrange(0, 5000)  # long lines too: beyond PIPE_BUF
    body: dict[str, Any] = {"model": "spec-demo", "temperature": 0, "max_tokens": 16,
                            "messages": [{"role": "user", "content": article_rows(task)[i % 10].prompt}]}
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    sent.ids[rid] = task
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"X-Specwatch-Task": task, "X-Request-Id": rid}) as resp:
        raw = await resp.read()
        assert resp.status == 200, raw[:200]
    if stream:
        events = [e for e in sse_events(raw) if e != "[DONE]"]
        final = events[-1]
        chunks = sum(1 for e in events for c in e["choices"] if c.get("delta", {}).get("content"))
        sent.streams += chunks > 0
        sent.itl += max(chunks - 1, 0)
    else:
        final = json.loads(raw)
    fields = final["metrics"]["speculative_decoding"]
    sent.ok[task] += 1
    for key, name in (("C", "num_accepted_draft_tokens"), ("D", "num_draft_tokens"), ("R", "num_spec_steps")):
        sent.spec[task, key] += fields[name]
    for accepted, steps in enumerate(fields["acceptance_histogram"]):
        sent.hist[accepted] += steps
    sent.tokens[task, "prompt"] += final["usage"]["prompt_tokens"]
    sent.tokens[task, "completion"] += final["usage"]["completion_tokens"]


def send(url: str, n: int, concurrency: int = 32, first: int = 0) -> Sent:
    """`n` requests, `concurrency` at a time, each on its own connection (so they land on different workers)."""
    sent = Sent()

    async def run() -> None:
        connector = aiohttp.TCPConnector(limit=concurrency, force_close=True)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
            await asyncio.gather(*(one(session, url, i, sent) for i in range(first, first + n)))

    asyncio.run(run())
    return sent


def per_worker_ok(run_dir: Path) -> dict[str, float]:
    """Each worker's own count of ok requests, from its counter file (the kernel spread the connections)."""
    out = {}
    for path in sorted((run_dir / "metrics").glob("counter_*.db")):
        families = MultiProcessCollector.merge([str(path)])
        out[path.stem] = sum(s.value for f in families for s in f.samples
                             if s.name == "specwatch_requests_total" and s.labels["outcome"] == "ok")
    return out


def test_every_scrape_shows_the_exact_sums_over_the_workers(tap: Tap, upstream: Service) -> None:
    _, before = scrape(tap.url)
    before_up = fetch_metrics(upstream.url)
    lines_before = len(tap.events.read_text().splitlines()) if tap.events.exists() else 0
    sent = send(tap.url, 300)
    up = server_figures(before_up, fetch_metrics(upstream.url))
    assert sum(sent.ok.values()) == 300
    assert up.steps == sum(v for (_, k), v in sent.spec.items() if k == "R") > 0
    assert up.accepted == sum(v for (_, k), v in sent.spec.items() if k == "C") > 0

    def delta(after: Samples, name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    answered = set()
    for _ in range(12):
        worker, after = scrape(tap.url)
        answered.add(worker)
        for task in ("code", "chat"):
            assert delta(after, "specwatch_requests_total", task=task, outcome="ok") == sent.ok[task]
            assert delta(after, "specwatch_spec_steps_total", task=task) == sent.spec[task, "R"]
            assert delta(after, "specwatch_draft_tokens_total", task=task) == sent.spec[task, "D"]
            assert delta(after, "specwatch_accepted_tokens_total", task=task) == sent.spec[task, "C"]
            assert delta(after, "specwatch_prompt_tokens_total", task=task) == sent.tokens[task, "prompt"]
            assert delta(after, "specwatch_completion_tokens_total", task=task) == sent.tokens[task, "completion"]
        assert delta(after, "specwatch_requests_total") == 300  # no other outcome
        for p, count in enumerate(up.per_position):
            assert delta(after, "specwatch_accepted_tokens_per_pos_total", position=str(p)) == count
        for accepted, steps in sent.hist.items():
            assert delta(after, "specwatch_spec_steps_by_accepted_total", accepted=str(accepted)) == steps
        # histograms sum bucket by bucket: counts exact, buckets cumulative, +Inf = count
        assert delta(after, "specwatch_e2e_seconds_count") == 300
        assert delta(after, "specwatch_ttft_seconds_count") == sent.streams
        assert delta(after, "specwatch_itl_seconds_count") == sent.itl
        for variant in ("baseline", "candidate"):
            for task in ("code", "chat"):
                labels = {"variant": variant, "task": task}
                buckets = sorted(((float(dict(ls)["le"]), v) for (n, ls), v in after.items()
                                  if n == "specwatch_itl_seconds_bucket" and all(x in ls for x in labels.items())))
                assert [v for _, v in buckets] == sorted(v for _, v in buckets)
                assert buckets[-1] == (float("inf"), total(after, "specwatch_itl_seconds_count", **labels))
        assert total(after, "specwatch_upstream_up", variant="baseline") == 1
        assert 0 < delta(after, "specwatch_requests_total", variant="candidate") < 300  # the 30 % split
    assert len(answered) >= 2, answered  # different workers answered, each with the same sums
    assert all(n > 0 for n in per_worker_ok(tap.run_dir()).values())  # every worker carried traffic

    # the event log: one whole line per request, whichever worker wrote it
    lines = [json.loads(line) for line in tap.events.read_text().splitlines()]
    new = lines[lines_before:]
    assert len(new) == 300
    assert {e["request_id"]: e["task"] for e in new} == sent.ids
    assert all(e["outcome"] == "ok" for e in new)
    assert sum(e["C"] for e in new) == up.accepted and sum(e["R"] for e in new) == up.steps


def test_an_admin_change_on_any_worker_applies_to_all(tap: Tap) -> None:
    def weights_everywhere() -> tuple[set[str], list[Any]]:
        seen, answers = set(), []
        for _ in range(12):
            r = requests.get(tap.url + "/admin/weights", headers={**tap.auth, "Connection": "close"}, timeout=10)
            answers.append(r.json())
            seen.add(requests.get(tap.url + "/healthz", headers={"Connection": "close"},
                                  timeout=10).headers["X-Specwatch-Worker"])
        return seen, answers

    try:
        for pct, to_candidate in ((0, 0), (100, 60)):
            r = requests.post(tap.url + "/admin/weights", json={"candidate": pct}, headers=tap.auth, timeout=10)
            assert r.status_code == 200 and r.json() == {"weights": {"candidate": float(pct)}}
            seen, answers = weights_everywhere()
            assert len(seen) >= 2 and answers == [{"weights": {"candidate": float(pct)}}] * 12
            _, before = scrape(tap.url)
            run_dir = tap.run_dir()
            before_workers = per_worker_ok(run_dir)
            send(tap.url, 60, first=1000)
            _, after = scrape(tap.url)
            moved = {v: total(after, "specwatch_requests_total", variant=v) -
                     total(before, "specwatch_requests_total", variant=v) for v in ("baseline", "candidate")}
            assert moved == {"candidate": to_candidate, "baseline": 60 - to_candidate}
            after_workers = per_worker_ok(run_dir)
            assert sum(after_workers[w] > before_workers.get(w, 0) for w in after_workers) >= 2  # spread
        # the canary's verdict: pushed through one worker, the same on every scrape
        for push, expected in (({"verdict": "fail", "score": 40}, ("fail", 40)), ({"verdict": "pass"}, ("pass", 40))):
            r = requests.post(tap.url + "/admin/verdict", json={"tasks": {"code": push}}, headers=tap.auth,
                              timeout=10)
            assert r.status_code == 200
            for _ in range(8):
                _, now = scrape(tap.url)
                verdicts = {v: total(now, "specwatch_canary_verdict", task="code", verdict=v)
                            for v in ("pass", "marginal", "fail", "insufficient")}
                assert verdicts == {v: float(v == expected[0]) for v in verdicts}
                assert total(now, "specwatch_canary_score", task="code") == expected[1]
                assert total(now, "specwatch_canary_verdict", task="chat") == 0  # untouched tasks stay at 0
    finally:
        requests.post(tap.url + "/admin/weights", json={"candidate": 30}, headers=tap.auth, timeout=10)


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}"
        time.sleep(0.1)


def test_a_killed_worker_is_replaced_without_losing_a_count_and_sigterm_stops_all(
        upstream: Service, tmp_path: Path) -> None:
    tap = start_tap(tmp_path, upstream.url)
    try:
        run_dir = tap.run_dir()
        first = send(tap.url, 90)
        pids = tap.worker_pids()
        assert len(pids) == WORKERS
        victim = max(per_worker_ok(run_dir).items(), key=lambda kv: kv[1])[0].removeprefix("counter_")
        assert int(victim) in pids
        os.kill(int(victim), signal.SIGKILL)  # the worker that counted the most
        wait_for(lambda: len(tap.worker_pids()) == WORKERS and int(victim) not in tap.worker_pids(), 20,
                 "a replacement worker")
        for _ in range(6):  # nothing lost, not even the dead worker's counts (its file stays)
            _, now = scrape(tap.url)
            assert total(now, "specwatch_requests_total", outcome="ok") == 90
            assert total(now, "specwatch_spec_steps_total") == sum(v for (_, k), v in first.spec.items() if k == "R")
        second = send(tap.url, 60, first=2000)
        for _ in range(6):
            _, now = scrape(tap.url)
            assert total(now, "specwatch_requests_total", outcome="ok") == 150
            assert total(now, "specwatch_accepted_tokens_total") == sum(
                v for s in (first, second) for (_, k), v in s.spec.items() if k == "C")
        assert all(requests.get(tap.url + "/healthz", headers={"Connection": "close"}, timeout=5).status_code == 200
                   for _ in range(10))
        assert "worker" in tap.service.log.read_text() and "SIGKILL" in tap.service.log.read_text()
        # SIGTERM to the parent: every worker stops, the parent exits 0 and removes its run folder
        workers = tap.worker_pids()
        tap.service.proc.send_signal(signal.SIGTERM)
        assert tap.service.proc.wait(40) == 0
        assert not any(Path(f"/proc/{pid}").exists() for pid in workers)
        assert not run_dir.exists()
    finally:
        tap.service.stop()


def test_workers_flag_and_yaml_key(tmp_path: Path) -> None:
    base = {"upstream": ["baseline=http://127.0.0.1:8000"]}
    assert load(base, None).workers == 1
    config = tmp_path / "exporter.yaml"
    config.write_text("workers: 4\n")
    assert load(base, config).workers == 4
    assert load({**base, "workers": 2}, config).workers == 2  # the flag wins
    config.write_text("workers: 0\n")
    with pytest.raises(ValueError, match="workers: expected a positive integer"):
        load(base, config)
    assert exporter_main.main(["--upstream", "baseline=http://127.0.0.1:8000", "--workers", "0"]) == 2


def test_an_address_in_use_fails_once_before_any_worker_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        code = exporter_main.main(["--upstream", "baseline=http://127.0.0.1:8000", "--workers", "2",
                                   "--web.listen-address", f"127.0.0.1:{port}"])
    assert code == 1


def _write_lines(path: Path, max_bytes: int, writer: int, n: int) -> None:
    log = EventLog(path, max_bytes)
    rng = random.Random(writer)
    for seq in range(n):
        log.write({"writer": writer, "seq": seq, "pad": "x" * rng.randrange(0, 6000)})  # many beyond PIPE_BUF
    log.close()


@pytest.mark.parametrize("max_bytes", [1 << 30, 400_000])
def test_event_log_lines_from_concurrent_processes_never_tear(tmp_path: Path, max_bytes: int) -> None:
    """Four processes write one log at once: every line parses, each writer's lines keep their order; without
    rotation every line is there, with it both files stay within the bound (give or take the lines in flight)."""
    path = tmp_path / "events.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_write_lines, args=(path, max_bytes, w, 600)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    files = [f for f in (path.with_name(path.name + ".1"), path) if f.exists()]
    lines = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    for w in range(4):
        seqs = [e["seq"] for e in lines if e["writer"] == w]
        assert seqs == sorted(seqs)
        if max_bytes == 1 << 30:
            assert seqs == list(range(600))
    if max_bytes < 1 << 30:
        assert len(files) == 2
        assert all(f.stat().st_size <= max_bytes // 2 + 4 * 6100 for f in files)
