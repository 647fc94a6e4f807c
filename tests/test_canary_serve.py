"""`specwatch canary --serve`: the verdict endpoint as Argo Rollouts and Flagger call it, over real HTTP.

The canary runs as a user starts it (the CLI, a subprocess) on exporter event logs written here: a
planted regression (the candidate's TPOT twice the baseline's on code), an A/A split (both sides drawn
from one distribution), too few requests, a log that disappears. Each answer is checked for its HTTP
status (what a Flagger webhook reads) and its JSON (what Argo's web provider reads).

Then the ways it must fail closed and stay up: a "Prometheus" (a loopback HTTP server here) answering a
proxy's HTML 503 page, a JSON error, or slower than the deadline; the event log replaced by a FIFO nobody
writes (a hung file system: the open never returns); `--out` where nothing can be written; SIGTERM in the
middle of an evaluation; malformed Content-Lengths; an IPv6 listen address; and `--watch` through failures.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from specwatch.net import free_port
from specwatch.vllm_metrics import samples
from tests.conftest import Service


def events(variant: str, task: str, n: int, tpot: float, rng: random.Random) -> list[str]:
    out = []
    for _ in range(n):
        t = tpot * rng.lognormvariate(0, 0.05)
        tokens = 64
        out.append(json.dumps({"ts": time.time(), "variant": variant, "task": task, "outcome": "ok",
                               "tpot_s": t, "ttft_s": 0.05 * rng.lognormvariate(0, 0.05), "e2e_s": 0.05 + t * 63,
                               "completion_tokens": tokens, "C": 40, "D": 60}))
    return out


def write(log: Path, lines: list[str]) -> None:
    with log.open("a") as f:
        f.write("".join(line + "\n" for line in lines))


class Canary:
    """`specwatch canary --serve` as a user starts it; `extra` arguments come last (a repeated flag: the last wins)."""

    def __init__(self, log: Path | None, out: Path, *extra: str, host: str = "127.0.0.1") -> None:
        self.port = free_port()
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self.log_path = out
        self.out = out.open("wb")
        source = ["--event-log", str(log)] if log is not None else []
        served = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "canary", *source,
                                      "--serve", served, "--interval", "0.3", "--window", "10m", *extra],
                                     stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, out.read_text()
            try:
                if requests.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, out.read_text()
            time.sleep(0.1)

    def get(self, query: str = "", method: str = "GET") -> tuple[int, dict]:
        r = requests.request(method, self.url + "/verdict" + query, timeout=5,
                             json={"name": "podinfo", "phase": "Progressing"} if method == "POST" else None)
        return r.status_code, r.json()

    def until(self, status: int, query: str = "", seconds: float = 20) -> dict:
        """The first answer with this status that follows a finished evaluation (before the first one ends the
        answer is a 503 too: "no evaluation yet; the first is running")."""
        deadline = time.monotonic() + seconds
        while True:
            got, body = self.get(query)
            if got == status and body.get("evaluations", 0) >= 1:
                return body
            assert time.monotonic() < deadline, (got, body)
            assert self.proc.poll() is None, self.output()
            time.sleep(0.2)

    def when(self, holds: Callable[[dict], bool], query: str = "", seconds: float = 20) -> tuple[int, dict]:
        deadline = time.monotonic() + seconds
        while True:
            status, body = self.get(query)
            if holds(body):
                return status, body
            assert time.monotonic() < deadline, (status, body)
            assert self.proc.poll() is None, self.output()
            time.sleep(0.2)

    def output(self) -> str:
        self.out.flush()
        return self.log_path.read_text()

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.out.close()
        return code


HTML_503 = ("<html><head><title>503 Service Unavailable</title></head><body><h1>503 Service Unavailable</h1>"
            "No server is available to handle this request.</body></html>")
EMPTY = json.dumps({"status": "success", "data": {"resultType": "vector", "result": []}})
BAD_DATA = json.dumps({"status": "error", "errorType": "bad_data", "error": "1:1: parse error: unexpected"})


class FakePrometheus:
    """A loopback HTTP server in Prometheus's place. `mode`: "html503" (a proxy's error page), "error" (Prometheus's
    own 400 JSON), "ok" (an empty instant vector), "slow" (ok after `delay` seconds); the first `html_first`
    queries answer html503 whatever the mode. Every query's parameters are kept in `queries`."""

    def __init__(self, mode: str = "ok", delay: float = 0.0, html_first: int = 0) -> None:
        self.mode, self.delay, self.html_first = mode, delay, html_first
        self.queries: list[dict[str, list[str]]] = []
        self.released = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                fake.queries.append(parse_qs(urlsplit(self.path).query))
                mode = "html503" if len(fake.queries) <= fake.html_first else fake.mode
                if mode == "slow":
                    fake.released.wait(fake.delay)
                status, kind, body = {"html503": (503, "text/html", HTML_503),
                                      "error": (400, "application/json", BAD_DATA)}.get(
                    mode, (200, "application/json", EMPTY))
                payload = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", kind)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:  # the canary gave up waiting: its deadline
                    pass

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def rng() -> random.Random:
    return random.Random(11)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Canary]]:
    running: list[Canary] = []
    yield running
    for canary in running:
        if canary.proc.poll() is None:
            canary.proc.kill()
            canary.proc.wait()


@pytest.fixture
def prometheus() -> Iterator[FakePrometheus]:
    fake = FakePrometheus()
    yield fake
    fake.close()


def passing_log(tmp_path: Path, rng: random.Random) -> Path:
    log = tmp_path / "events.jsonl"
    write(log, events("baseline", "code", 30, 0.010, rng) + events("candidate", "code", 30, 0.010, rng))
    return log


def test_a_planted_regression_is_412_fail_and_argo_reads_the_same_verdict_with_200(
        tmp_path: Path, rng: random.Random, started: list[Canary]) -> None:
    log = tmp_path / "events.jsonl"
    write(log, events("baseline", "code", 40, 0.010, rng) + events("candidate", "code", 40, 0.020, rng)
          + events("baseline", "chat", 40, 0.010, rng) + events("candidate", "chat", 40, 0.010, rng))
    canary = Canary(log, tmp_path / "canary.log")
    started.append(canary)
    body = canary.until(412)
    assert body["verdict"] == "fail" and body["inconclusive"] is False
    code = {t["task"]: t for t in body["tasks"]}["code"]
    tpot = {m["metric"]: m for m in code["metrics"]}["tpot"]
    assert code["verdict"] == "fail" and tpot["failed"] and tpot["state"] == "high"
    assert tpot["n_baseline"] == 40 and tpot["n_candidate"] == 40
    assert 1.8 < tpot["effect"]["estimate"] < 2.2 and tpot["effect"]["low"] > 1.1  # the interval, not a point
    assert body["window"] == "10m" and body["age_seconds"] is not None and body["age_seconds"] < 5
    assert any("event log" in s for s in body["sources"])
    status, argo = canary.get("?always_200=true")
    assert status == 200 and argo["verdict"] == "fail"  # Argo's failureCondition reads result.verdict
    status, chat = canary.get("?task=chat")
    assert status == 200 and chat["verdict"] == "pass" and [t["task"] for t in chat["tasks"]] == ["chat"]
    assert canary.get("?task=code")[0] == 412
    status, missing = canary.get("?task=rag")
    assert status == 404 and "'rag' is not in the verdict" in missing["error"]
    assert canary.get(method="POST")[0] == 412  # Flagger's webhook POSTs its payload
    log.unlink()  # the log gone: no verdict, said as such (503), not the last one served as if fresh
    gone = canary.until(503)
    assert gone["verdict"] == "none" and "no such file" in gone["error"]
    assert canary.stop() == 0


def test_an_a_a_split_is_never_a_fail_and_too_few_requests_are_inconclusive(
        tmp_path: Path, rng: random.Random, started: list[Canary]) -> None:
    log = tmp_path / "events.jsonl"
    write(log, events("baseline", "code", 5, 0.010, rng) + events("candidate", "code", 5, 0.010, rng))
    canary = Canary(log, tmp_path / "canary.log")
    started.append(canary)
    early = canary.until(425)
    assert early["verdict"] == "insufficient" and early["inconclusive"] is True
    write(log, events("baseline", "code", 40, 0.010, rng) + events("candidate", "code", 40, 0.010, rng))
    deadline = time.monotonic() + 20
    while True:
        status, body = canary.get()
        assert status != 412 and body["verdict"] != "fail", body
        if status == 200:
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.2)
    assert body["verdict"] == "pass" and body["evaluations"] >= 2
    assert canary.stop() == 0


def test_serve_refuses_a_bad_address_and_watch_together(tmp_path: Path) -> None:
    log = tmp_path / "e.jsonl"
    log.write_text("")
    for extra, message in ((["--serve", "nowhere"], "expected HOST:PORT"),
                           (["--serve", "127.0.0.1:9", "--watch"], "leave out --watch")):
        done = subprocess.run([sys.executable, "-m", "specwatch.cli", "canary", "--event-log", str(log), *extra],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr


# -- failing closed, staying up ------------------------------------------------------------------------------
def test_prometheus_answering_a_proxys_html_503_is_a_503_with_the_reason_and_the_process_stays_up(
        tmp_path: Path, rng: random.Random, started: list[Canary], prometheus: FakePrometheus) -> None:
    prometheus.mode = "html503"
    canary = Canary(passing_log(tmp_path, rng), tmp_path / "canary.log", "--prometheus", prometheus.url)
    started.append(canary)
    body = canary.until(503)
    assert body["verdict"] == "none" and body["inconclusive"] is True, body
    assert f"Prometheus {prometheus.url}: HTTP 503, not a JSON answer: '503 Service Unavailable" in body["error"]
    status, argo = canary.get("?always_200=true")
    assert status == 200 and argo["verdict"] == "none"  # Argo: neither "pass" nor "fail", so inconclusive
    first = body["evaluations"]
    while canary.get()[1]["evaluations"] < first + 3:  # it keeps judging, and keeps failing closed
        assert canary.proc.poll() is None, canary.output()
        time.sleep(0.1)
    prometheus.mode = "error"  # Prometheus's own error: said with its errorType
    status, body = canary.when(lambda b: "bad_data" in b.get("error", ""))
    assert status == 503 and "HTTP 400, query failed: bad_data: 1:1: parse error: unexpected" in body["error"]
    prometheus.mode = "ok"  # fixed: the verdict comes back
    fixed = canary.until(200)
    assert fixed["verdict"] == "pass" and fixed["sources"][-1] == f"Prometheus {prometheus.url}"
    log = canary.output()
    assert canary.stop() == 0
    assert "Traceback" not in log
    failures = log.count("specwatch canary: evaluation failed: ")
    assert failures >= 4 and failures == log.count("not a JSON answer") + log.count("bad_data"), log[-2000:]


def test_prometheus_slower_than_the_deadline_fails_each_evaluation_within_the_deadline(
        tmp_path: Path, rng: random.Random, started: list[Canary], prometheus: FakePrometheus) -> None:
    prometheus.mode, prometheus.delay = "slow", 30.0  # 30 s a query: 34 queries would be 17 minutes
    canary = Canary(passing_log(tmp_path, rng), tmp_path / "canary.log", "--prometheus", prometheus.url,
                    "--interval", "0.5", "--deadline", "1")
    started.append(canary)
    began = time.monotonic()
    body = canary.until(503)
    assert body["verdict"] == "none" and body["deadline_seconds"] == 1
    while body["evaluations"] < 3:  # three evaluations, each ended by its deadline (not 17 minutes)
        assert time.monotonic() - began < 3 * (1 + 0.5) + 3, body
        asked = time.monotonic()
        status, body = canary.get()
        assert time.monotonic() - asked < 0.5 and status == 503  # the answer never waits on the evaluation
        time.sleep(0.1)
    assert f"Prometheus {prometheus.url}: no answer within" in body["error"] and "deadline" in body["error"]
    # the deadline is Prometheus's too: each query carries what is left of it as the API's timeout
    assert all(0 < float(q["timeout"][0]) <= 1.0 for q in prometheus.queries), prometheus.queries[:3]
    assert canary.stop() == 0


def fifo_openers(pid: int) -> int | None:
    """How many of the process's threads wait in a FIFO's open (None where the kernel does not say)."""
    chans = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            chans.append(Path(f"/proc/{pid}/task/{tid}/wchan").read_text())
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between the listing and the read (an executor's worker leaving)
    if all(c in ("", "0") for c in chans):
        return None
    return sum(c == "wait_for_partner" for c in chans)


def test_a_hung_event_log_stops_the_200_at_2_x_interval_plus_deadline_and_sigterm_still_returns(
        tmp_path: Path, rng: random.Random, started: list[Canary]) -> None:
    log = passing_log(tmp_path, rng)
    interval, deadline = 2, 1
    bound = 2 * interval + deadline
    canary = Canary(log, tmp_path / "canary.log", "--interval", str(interval), "--deadline", str(deadline))
    started.append(canary)
    passed = canary.until(200)
    assert passed["verdict"] == "pass" and passed["stale_after_seconds"] == bound
    log.unlink()
    os.mkfifo(log)  # nobody writes it: the next evaluation's open() never returns, as on a hung file system
    seen: list[tuple[int, dict]] = []
    openers: list[int | None] = []
    limit = time.monotonic() + 60
    while not seen or seen[-1][1]["verdict"] != "stale":
        seen.append(canary.get())
        if seen[-1][1]["verdict"] == "none":
            openers.append(fifo_openers(canary.proc.pid))
        assert time.monotonic() < limit, seen[-1]
        time.sleep(0.1)
    served = [body for status, body in seen if status == 200]
    assert all(body["verdict"] == "pass" and body["age_seconds"] <= bound for body in served)
    first_refusal = next(body for status, body in seen if status != 200)
    assert first_refusal["age_seconds"] <= bound  # the hung evaluation is refused before the verdict goes stale
    hung = [body for status, body in seen if status == 503 and body["verdict"] == "none"]
    assert hung and all(f"evaluation running past its deadline ({deadline} s) for" in b["error"] for b in hung)
    status, stale = seen[-1]
    assert status == 503 and bound < stale["age_seconds"] <= bound + 1.0, stale  # exactly the bound, one poll late
    assert f"stale after {bound} s" in stale["error"] and "running past its deadline" in stale["error"]
    assert stale["last_verdict"]["verdict"] == "pass" and "tasks" not in stale  # kept, never as the verdict
    assert len({b["evaluations"] for b in hung + [stale]}) == 1  # the hung one never finished
    known = [n for n in openers if n is not None]  # one thread in the FIFO's open, however long it hangs
    assert all(n == 1 for n in known) and (len(known) >= 2 or not known), openers
    status, argo = canary.get("?always_200=true")
    assert status == 200 and argo["verdict"] == "stale"  # Argo: inconclusive, never a pass
    asked = time.monotonic()
    canary.proc.send_signal(signal.SIGTERM)  # the evaluation is still hung in open()
    assert canary.proc.wait(timeout=5) == 0 and time.monotonic() - asked < 1.0
    output = canary.output()
    assert output.count("evaluation running past its deadline") == 1 and "Traceback" not in output, output


def test_an_out_where_nothing_can_be_written_is_a_503_that_says_so_and_recovers(
        tmp_path: Path, rng: random.Random, started: list[Canary]) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where --out wants a folder\n")  # unwritable even for root
    canary = Canary(passing_log(tmp_path, rng), tmp_path / "canary.log", "--out", str(blocker / "report"))
    started.append(canary)
    body = canary.until(503)
    assert body["verdict"] == "none" and str(blocker / "report") in body["error"], body
    assert "Not a directory" in body["error"] or "File exists" in body["error"]
    assert canary.proc.poll() is None
    blocker.unlink()
    assert canary.until(200)["verdict"] == "pass"
    assert json.loads((blocker / "report" / "canary.json").read_text())["verdict"] == "pass"
    assert canary.stop() == 0


def test_sigterm_in_the_middle_of_an_evaluation_returns_within_a_second(
        tmp_path: Path, rng: random.Random, started: list[Canary], prometheus: FakePrometheus) -> None:
    prometheus.mode, prometheus.delay = "slow", 60.0
    canary = Canary(passing_log(tmp_path, rng), tmp_path / "canary.log", "--prometheus", prometheus.url,
                    "--deadline", "120")
    started.append(canary)
    limit = time.monotonic() + 20
    while not prometheus.queries:  # an evaluation is waiting on Prometheus
        assert time.monotonic() < limit
        time.sleep(0.05)
    status, body = canary.get()
    assert status == 503 and body["error"] == "no evaluation yet; the first is running"
    asked = time.monotonic()
    canary.proc.send_signal(signal.SIGTERM)
    assert canary.proc.wait(timeout=5) == 0
    assert time.monotonic() - asked < 1.0
    assert "Traceback" not in canary.output()


def raw_post(port: int, content_length: str) -> tuple[int, dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(f"POST /verdict HTTP/1.1\r\nHost: canary\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {content_length}\r\n\r\n{{}}".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    assert answer, "the connection closed without an answer"
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_malformed_content_length_is_400_with_a_json_error(
        tmp_path: Path, rng: random.Random, started: list[Canary]) -> None:
    canary = Canary(passing_log(tmp_path, rng), tmp_path / "canary.log")
    started.append(canary)
    canary.until(200)
    for bad in ("abc", "-5", "99999999999999999999", "1e3", ""):
        status, body = raw_post(canary.port, bad)
        assert status == 400 and "Content-Length" in body["error"], (bad, status, body)
    status, body = raw_post(canary.port, "2")  # the real `{}`: the verdict
    assert status == 200 and body["verdict"] == "pass"
    assert canary.get(method="POST")[0] == 200
    assert canary.stop() == 0


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_an_ipv6_listen_address_serves_and_prints_its_url_in_brackets(
        tmp_path: Path, rng: random.Random, started: list[Canary]) -> None:
    canary = Canary(passing_log(tmp_path, rng), tmp_path / "canary.log", host="::1")
    started.append(canary)
    assert canary.until(200)["verdict"] == "pass"
    assert f"verdict endpoint: http://[::1]:{canary.port}/verdict" in canary.output()
    assert canary.stop() == 0


def verdicts(exporter: str) -> dict[str, str]:
    """The verdict per task pushed to the exporter (its series at 1; every other one stays at 0)."""
    exposition = samples(requests.get(exporter + "/metrics", timeout=5).text)
    return {dict(labels)["task"]: dict(labels)["verdict"] for (name, labels), value in exposition.items()
            if name == "specwatch_canary_verdict" and value == 1}


def test_watch_prints_a_failed_evaluation_keeps_watching_and_never_stops_the_split_on_an_error(
        tmp_path: Path, rng: random.Random, prometheus: FakePrometheus, monkeypatch: pytest.MonkeyPatch) -> None:
    token_env = "SPECWATCH_TEST_WATCH_TOKEN"
    monkeypatch.setenv(token_env, "watch-token")
    nowhere = f"http://127.0.0.1:{free_port()}"  # the exporter's admin endpoint needs no live upstream
    tap = Service("exporter", ["--upstream", f"baseline={nowhere}", "--upstream", f"candidate={nowhere}",
                               "--split", "candidate=50", "--admin-token-env", token_env],
                  tmp_path / "exporter.log", "/healthz")
    auth = {"Authorization": "Bearer watch-token"}
    try:
        def watch(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "specwatch.cli", "canary", "--event-log", str(log),
                                   "--prometheus", prometheus.url, "--watch", "--interval", "0.2", "--push-to",
                                   tap.url, "--admin-token-env", token_env, *extra],
                                  capture_output=True, text=True, timeout=120)

        log = passing_log(tmp_path, rng)
        prometheus.mode = "html503"
        failing = watch("--rounds", "3", "--stop-split")
        assert failing.returncode == 1, failing.stderr  # the last evaluation failed
        assert failing.stderr.count("specwatch canary: evaluation failed: Prometheus") == 3, failing.stderr
        assert "Traceback" not in failing.stderr
        weights = requests.get(tap.url + "/admin/weights", headers=auth, timeout=5).json()["weights"]
        assert weights["candidate"] == 50  # an error never stops the split
        assert verdicts(tap.url) == {}  # nothing pushed
        prometheus.mode, prometheus.html_first = "ok", len(prometheus.queries) + 1  # one more failure, then fixed
        recovered = watch("--rounds", "2")
        assert recovered.returncode == 0, recovered.stderr  # it kept watching: the second round passed
        assert recovered.stderr.count("evaluation failed") == 1 and "verdict: PASS" in recovered.stdout
        assert verdicts(tap.url) == {"code": "pass"}
    finally:
        tap.stop()
