"""`specwatch snapshot` / `specwatch diff` against real simulator and exporter processes, restarts included."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from specwatch import cli, snapshot
from specwatch.acceptance import Acceptance, spec_field
from specwatch.chat_client import chat_body, post_json
from specwatch.net import free_port
from specwatch.vllm_metrics import CounterResetError
from specwatch.workloads import article_rows
from tests.conftest import NGRAM_SIM_ARGS, Service


def send(url: str, task: str, n: int) -> Acceptance:
    """n greedy requests of the article's `task` rows, labelled; the summed per-request fields."""
    session = requests.Session()
    session.headers["X-Specwatch-Task"] = task
    acc = Acceptance()
    for row in article_rows(task)[:n]:
        body = post_json(session, url + "/v1/chat/completions", chat_body(row, 48, "spec-demo"))
        acc = acc.add(spec_field(body), body["usage"]["completion_tokens"])
    return acc


def test_diff_equals_the_summed_per_request_fields_on_server_and_exporter(
        service_factory: Callable[[str, list[str]], Service], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    sim = service_factory("sim", NGRAM_SIM_ARGS)
    tap = service_factory("exporter", ["--upstream", f"candidate={sim.url}"])
    assert cli.main(["snapshot", sim.url, "--out", str(tmp_path / "server-0.prom")]) == cli.EXIT_OK
    assert cli.main(["snapshot", tap.url + "/metrics", "--out", str(tmp_path / "tap-0.prom")]) == cli.EXIT_OK
    sums = {task: send(tap.url, task, n) for task, n in (("code", 4), ("chat", 3))}
    assert cli.main(["snapshot", sim.url, "--out", str(tmp_path / "server-1.prom")]) == cli.EXIT_OK
    assert cli.main(["snapshot", tap.url, "--out", str(tmp_path / "tap-1.prom")]) == cli.EXIT_OK

    server = snapshot.diff(snapshot.read(tmp_path / "server-0.prom"), snapshot.read(tmp_path / "server-1.prom"))
    assert server.server is not None
    everything = (sums["code"].accepted + sums["chat"].accepted, sums["code"].drafted + sums["chat"].drafted,
                  sums["code"].steps + sums["chat"].steps)
    assert (server.server.accepted, server.server.draft_tokens, server.server.steps) == everything
    histogram = [a + b for a, b in zip(sums["code"].histogram, sums["chat"].histogram, strict=True)]
    survival = [sum(histogram[p + 1:]) for p in range(len(histogram) - 1)]
    assert list(server.server.per_position) == survival  # vLLM's per_pos counter is the histogram's survival
    assert server.server.acceptance_rate == everything[0] / everything[1]

    capsys.readouterr()
    assert cli.main(["diff", str(tmp_path / "tap-0.prom"), str(tmp_path / "tap-1.prom"), "--json"]) == cli.EXIT_OK
    by_task = {row["task"]: row for row in json.loads(capsys.readouterr().out)["by_task"]}
    for task, acc in sums.items():
        row = by_task[task]
        assert row["variant"] == "candidate"
        assert (row["C"], row["D"], row["R"]) == (acc.accepted, acc.drafted, acc.steps)
        assert row["histogram"] == list(acc.histogram)
        assert row["acceptance_rate"] == acc.acceptance_rate and row["mean_acceptance_length"] == \
            acc.mean_acceptance_length
    assert cli.main(["diff", str(tmp_path / "server-0.prom"), str(tmp_path / "server-1.prom")]) == cli.EXIT_OK
    assert "server" in capsys.readouterr().out


def _sim_on(port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "sim", *NGRAM_SIM_ARGS, "--port", str(port)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(log.read_text())


def test_a_restart_between_snapshots_is_an_error_not_a_number(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = _sim_on(port, tmp_path / "sim.log")
    try:
        send(url, "code", 2)  # counters well above zero
        before = snapshot.take(url)
    finally:
        first.terminate()
        first.wait(10)
    second = _sim_on(port, tmp_path / "sim.log")
    try:
        send(url, "code", 1)
        after = snapshot.take(url)
    finally:
        second.terminate()
        second.wait(10)
    with pytest.raises(CounterResetError, match="restarted"):
        snapshot.diff(before, after)
    snapshot.write(before, tmp_path / "a.prom")
    snapshot.write(after, tmp_path / "b.prom")
    capsys.readouterr()
    assert cli.main(["diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom")]) == cli.EXIT_CHECK
    assert "restarted" in capsys.readouterr().err


def test_a_counter_that_went_down_is_caught_even_without_created_samples(tmp_path: Path) -> None:
    text = "# TYPE vllm:spec_decode_num_drafts_total counter\nvllm:spec_decode_num_drafts_total{engine=\"0\"} {}\n"
    before = snapshot.Snapshot("http://x/metrics", 1.0, text.replace("{}", "10.0"))
    after = snapshot.Snapshot("http://x/metrics", 2.0, text.replace("{}", "3.0"))
    with pytest.raises(CounterResetError, match="went from 10.0 to 3.0"):
        snapshot.diff(before, after)
    with pytest.raises(snapshot.SnapshotError, match="older"):
        snapshot.diff(after, before)
    (tmp_path / "plain.txt").write_text(text)
    with pytest.raises(snapshot.SnapshotError, match="expected a first line"):
        snapshot.read(tmp_path / "plain.txt")
