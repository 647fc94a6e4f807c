"""Distributed Locust as compose and k8s start it (a master, workers on its port): the master ends a bounded run by
itself and reports every request its workers sent, exactly as many as the exporter counted."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from specwatch.load.results import STOPPED_MID_REQUEST
from specwatch.net import free_port
from specwatch.workloads import write_article_workloads
from tests.conftest import NGRAM_SIM_ARGS
from tests.test_exporter import value

LOCUSTFILE = Path(__file__).parents[1] / "loadgen" / "locustfile.py"
TASKS = ("code", "chat")
REQUESTS, WARMUP = 4, 1  # per task and worker: each worker runs the whole plan
MAX_TOKENS = 8
WAIT_S = 90.0  # any one process; the master's --run-time (a backstop only) is well past it

Start = Callable[[str, list[str]], subprocess.Popen[bytes]]


@pytest.fixture
def locust(tmp_path: Path) -> Iterator[Start]:
    """Start `locust <args>` with its output in tmp_path/<name>.log; whatever still runs is stopped afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> subprocess.Popen[bytes]:
        with (tmp_path / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "locust", f"--locustfile={LOCUSTFILE}", *args],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def logs(tmp_path: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2500:]}" for p in sorted(tmp_path.glob("*.log")))


def plan_args(tmp_path: Path) -> list[str]:
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    write_article_workloads(data)
    return [f"--workloads={','.join(f'{t}={data / t}.jsonl' for t in TASKS)}", f"--requests-per-task={REQUESTS}",
            f"--warmup={WARMUP}", f"--max-tokens={MAX_TOKENS}", "--ignore-eos"]


def start_workers(locust: Start, n: int, port: int, workloads: str) -> list[subprocess.Popen[bytes]]:
    """As deploy/k8s/base/locust.yaml and compose.yaml's `locust-worker` start them."""
    return [locust(f"worker{i}", ["--worker", "--master-host=127.0.0.1", f"--master-port={port}", workloads])
            for i in range(n)]


def sent_by_the_exporters_count(url: str) -> float:
    return sum(value(url, "specwatch_requests_total", task=task) for task in TASKS)


@pytest.mark.parametrize("workers", [1, 2])
def test_headless_master_reports_every_request_its_workers_sent(sim_ngram, service_factory, locust, tmp_path,
                                                                 workers):
    tap = service_factory("exporter", ["--upstream", f"baseline={sim_ngram.url}"])
    port = free_port()
    plan = plan_args(tmp_path)
    started = time.monotonic()
    master = locust("master", ["--master", "--master-bind-host=127.0.0.1", f"--master-bind-port={port}", "--headless",
                               f"--expect-workers={workers}", "--users=4", "--spawn-rate=4", f"--host={tap.url}",
                               "--run-time=300s", "--only-summary", f"--csv={tmp_path / 'master'}", *plan,
                               f"--results-file={tmp_path / 'requests.jsonl'}"])  # the master's options: every worker's
    procs = start_workers(locust, workers, port, plan[0])
    try:
        code = master.wait(WAIT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the master did not end by itself within {WAIT_S:.0f} s\n{logs(tmp_path)}")
    assert code == 0, logs(tmp_path)
    assert time.monotonic() - started < WAIT_S  # the plan ended the run, not --run-time
    for proc in procs:  # the master's quit ends the workers
        assert proc.wait(30) == 0, logs(tmp_path)

    with (tmp_path / "master_stats.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["Type"] == "POST"]
    reported = {r["Name"]: int(r["Request Count"]) for r in rows}
    expected = workers * len(TASKS) * (REQUESTS + WARMUP)
    assert sum(reported.values()) == sent_by_the_exporters_count(tap.url) == expected, (reported, logs(tmp_path))
    assert reported == {name: workers * n for task in TASKS
                        for name, n in ((task, REQUESTS), (f"{task} warmup", WARMUP))}, logs(tmp_path)
    assert all(r["Failure Count"] == "0" for r in rows), rows
    with (tmp_path / "master_stats.csv").open() as f:  # nothing but requests: no TTFT / TPOT / ITL rows
        assert {r["Type"] for r in csv.DictReader(f)} == {"POST", ""}
    # the workers' latencies, merged on the master: one TTFT and one TPOT per measured request, and every gap
    # between text chunks the workers saw (fewer than tokens where a chunk carries accepted drafts)
    measured = [row for line in (tmp_path / "requests.jsonl").read_text().splitlines()
                if not (row := json.loads(line))["warmup"]]
    with (tmp_path / "master_llm_latency.csv").open() as f:
        latency = {(r["Metric"], r["Task"]): int(r["Count"]) for r in csv.DictReader(f)}
    assert latency == {(m, task): sum(len(r["itl_s"]) if m == "ITL" else 1 for r in measured if r["task"] == task)
                       for task in TASKS for m in ("TTFT", "TPOT", "ITL")}, logs(tmp_path)
    assert len(measured) == workers * REQUESTS * len(TASKS)


def test_web_ui_master_stops_the_run_when_its_workers_are_done_and_keeps_them(sim_ngram, service_factory, locust,
                                                                                tmp_path):
    tap = service_factory("exporter", ["--upstream", f"baseline={sim_ngram.url}"])
    port, web = free_port(), free_port()
    url = f"http://127.0.0.1:{web}"
    plan = plan_args(tmp_path)
    master = locust("master", ["--master", "--master-bind-host=127.0.0.1", f"--master-bind-port={port}",
                               "--web-host=127.0.0.1", f"--web-port={web}", f"--host={tap.url}", *plan])
    procs = start_workers(locust, 2, port, plan[0])
    deadline = time.monotonic() + WAIT_S

    def until(done: Callable[[dict], bool], what: str) -> dict:
        """Poll the UI's /stats/requests until `done(report)`."""
        last: dict = {}
        while time.monotonic() < deadline:
            if master.poll() is not None:
                pytest.fail(f"the master exited with {master.returncode}\n{logs(tmp_path)}")
            try:
                last = dict(requests.get(f"{url}/stats/requests", timeout=2).json())
            except (requests.RequestException, ValueError):
                pass
            if last and done(last):
                return last
            time.sleep(0.25)
        pytest.fail(f"{what}: not within {WAIT_S:.0f} s, last {last}\n{logs(tmp_path)}")

    def posts(report: dict) -> dict[str, int]:
        return {s["name"]: s["num_requests"] for s in report["stats"] if s["method"] == "POST"}

    until(lambda r: r["worker_count"] == 2, "two workers ready")
    expected = 2 * len(TASKS) * (REQUESTS + WARMUP)
    for run in (1, 2):  # the second run: the workers stay connected, and each run's statistics start at 0
        swarm = requests.post(f"{url}/swarm", data={"user_count": 4, "spawn_rate": 4, "host": tap.url}, timeout=10)
        assert swarm.json()["success"], swarm.text
        time.sleep(2.1)  # /stats/requests answers from a 2 s cache (locust.web.DEFAULT_CACHE_TIME): not the last run's
        # stopped by itself, every request reported, and the workers back and ready for the next run
        now = until(lambda r: r["state"] == "stopped" and sum(posts(r).values()) >= expected and r["worker_count"] == 2,
                    f"run {run} stopped with every request and both workers")
        assert sum(posts(now).values()) == sent_by_the_exporters_count(tap.url) / run == expected, \
            (run, posts(now), logs(tmp_path))
        # the tabs start again with each run: this run's requests at the exporter, this run's latencies
        tabs = {tab["key"]: tab["data"] for tab in now["extended_stats"]}
        assert {(r["task"], r["ok"], r["failed"]) for r in tabs["acceptance"]} == {
            (task, str(2 * (REQUESTS + WARMUP)), "0") for task in TASKS}, tabs
        assert {(r["metric"], r["task"]): r["count"] for r in tabs["llm-latency"] if r["metric"] == "TTFT"} == {
            ("TTFT", task): str(2 * REQUESTS) for task in TASKS}, tabs
    assert all(p.poll() is None for p in procs), logs(tmp_path)
    master.terminate()  # SIGTERM: the master quits its workers, then itself
    assert master.wait(30) == 0, logs(tmp_path)
    for proc in procs:
        assert proc.wait(30) == 0, logs(tmp_path)


def test_a_stop_mid_stream_is_counted_alike_by_locust_and_the_exporter(sim_factory, service_factory, locust,
                                                                       tmp_path):
    """Stop with Locust's default --stop-timeout 0 (as compose starts it) cuts the requests in flight: each is a
    failure "stopped mid-request" in Locust and in the results file, and a client_abort at the exporter."""
    slow = sim_factory([*NGRAM_SIM_ARGS[:-1], "1"])  # H200 step times: a 256-token answer streams for seconds
    tap = service_factory("exporter", ["--upstream", f"baseline={slow.url}"])
    web = free_port()
    url = f"http://127.0.0.1:{web}"
    data = tmp_path / "data"
    data.mkdir()
    write_article_workloads(data)
    results = tmp_path / "requests.jsonl"
    master = locust("standalone", ["--web-host=127.0.0.1", f"--web-port={web}", f"--host={tap.url}",
                                   f"--workloads=code={data / 'code.jsonl'}", "--max-tokens=256", "--ignore-eos",
                                   f"--results-file={results}"])
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/", timeout=1).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    assert requests.post(f"{url}/swarm", data={"user_count": 4, "spawn_rate": 4}, timeout=10).json()["success"]
    # stop while four answers stream: after the first has finished, so each user is inside its next one
    while value(tap.url, "specwatch_requests_total") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    requests.post(f"{url}/stop", timeout=10)
    report: dict = {}
    while time.monotonic() < deadline:  # the exporter counts a cut when its next write fails: soon, not at once
        report = requests.get(f"{url}/stats/requests", timeout=5).json()
        aggregated = next(s for s in report["stats"] if s["name"] == "Aggregated")
        if report["state"] == "stopped" and aggregated["num_requests"] == value(tap.url, "specwatch_requests_total"):
            break
        time.sleep(0.5)
    aggregated = next(s for s in report["stats"] if s["name"] == "Aggregated")
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    cut = [r for r in lines if r["error"] == STOPPED_MID_REQUEST]
    assert aggregated["num_requests"] == value(tap.url, "specwatch_requests_total") == len(lines), \
        (aggregated, lines, logs(tmp_path))
    assert len(cut) >= 1 and aggregated["num_failures"] == len(cut), (aggregated, cut)
    assert value(tap.url, "specwatch_requests_total", outcome="client_abort") >= 1
    assert any("stopped mid-request" in e["error"] for e in report["errors"]), report["errors"]
    master.terminate()
    assert master.wait(30) == 1, logs(tmp_path)  # Locust's exit code when a request failed (--exit-code-on-error)
