"""`specwatch canary --serve`: the verdict endpoint as Argo Rollouts and Flagger call it, over real HTTP.

The canary runs as a user starts it (the CLI, a subprocess) on exporter event logs written here: a
planted regression (the candidate's TPOT twice the baseline's on code), an A/A split (both sides drawn
from one distribution), too few requests, a log that disappears. Each answer is checked for its HTTP
status (what a Flagger webhook reads) and its JSON (what Argo's web provider reads).
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from specwatch.net import free_port


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
    def __init__(self, log: Path, out: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = out.open("wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "canary", "--event-log", str(log),
                                      "--serve", f"127.0.0.1:{self.port}", "--interval", "0.3", "--window", "10m"],
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

    def until(self, status: int, query: str = "") -> dict:
        deadline = time.monotonic() + 20
        while True:
            got, body = self.get(query)
            if got == status:
                return body
            assert time.monotonic() < deadline, (got, body)
            time.sleep(0.2)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=30)
        self.out.close()
        return code


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
