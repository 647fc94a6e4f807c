"""`specwatch up` with simulators: healthy parts, a labelled load, and nothing left behind when it stops."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests

from specwatch import cli

TOKEN = "test-only-admin-token"  # given through the environment, as a user would


def port_free(url: str) -> bool:
    """Nothing listens there. SO_REUSEADDR: a closed connection's TIME_WAIT on the port is not a listener."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", urlsplit(url).port or 0))
            return True
        except OSError:
            return False


def alive(run: Path) -> list[str]:
    """The stack's recorded process groups that still have a member."""
    pids = json.loads((run / "processes.json").read_text())
    out = []
    for name, pid in pids.items():
        try:
            os.killpg(pid, 0)
            out.append(name)
        except ProcessLookupError:
            pass
    return out


@pytest.mark.servers
def test_headless_up_runs_a_labelled_load_and_stops_everything(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "run"
    monkeypatch.setenv("SPECWATCH_ADMIN_TOKEN", TOKEN)  # the exporter gets its admin API, never the token in a log
    # the split is random per request: 13 requests per task leave the candidate without one of a task
    # with probability 2**-13
    code = cli.main(["up", "--backend", "sim", "--headless", "--free-ports", "--sim-time-scale", "0.05",
                     "--requests", "12", "--concurrency", "2", "--max-tokens", "32", "--out", str(out)])
    assert code == cli.EXIT_OK
    summary = json.loads((out / "stack-summary.json").read_text())
    rows = {(r["variant"], r["task"]): r for r in summary["by_task"]}
    for task in ("code", "chat"):
        row = rows[("candidate", task)]
        assert row["D"] > 0 and row["acceptance_rate"] == row["C"] / row["D"]
        assert row["prometheus_acceptance_rate"] == pytest.approx(row["acceptance_rate"], rel=1e-9)
        assert rows[("baseline", task)]["D"] == 0  # the baseline does not speculate
        assert summary["load"][task]["requests"] == 12 and summary["load"][task]["failures"] == 0
    for url in (*summary["servers"].values(), summary["exporter"], summary["prometheus"]):
        assert port_free(url), url
    assert alive(out) == []
    assert (out / "exporter.log").exists() and (out / "prometheus" / "prometheus.log").exists()
    exporter_log = (out / "exporter.log").read_text()
    assert "--admin-token-env SPECWATCH_ADMIN_TOKEN" in exporter_log.splitlines()[0]
    assert "/admin/ is disabled" not in exporter_log
    assert not [p for p in out.rglob("*") if p.is_file() and TOKEN.encode() in p.read_bytes()]


@pytest.mark.servers
def test_web_mode_serves_locust_and_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "up", "--backend", "sim", "--free-ports",
                             "--sim-time-scale", "0.05", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SPECWATCH_ADMIN_TOKEN": TOKEN})
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "the stack is up" in line or not line:
                break
        urls = {line.split()[1]: next(t for t in line.split() if t.startswith("http"))
                for line in lines if line.startswith("up ")}
        assert "the stack is up" in lines[-1], "".join(lines)
        assert requests.get(urls["locust"] + "/", timeout=5).status_code == 200
        assert requests.get(urls["exporter"] + "/healthz", timeout=5).status_code == 200
        assert sorted(alive(out)) == ["exporter", "locust", "prometheus", "sim baseline", "sim candidate", "viewer"]
        # the dashboard viewer (built by `make viewer`, a prerequisite of make test) reads this stack's Prometheus
        index = requests.get(urls["viewer"] + "/dashboards/index.json", timeout=5).json()
        assert [d["name"] for d in index] == ["specwatch-acceptance", "specwatch-latency", "specwatch-canary"]
        up = requests.get(urls["viewer"] + "/api/v1/query", params={"query": "up"}, timeout=5).json()
        assert up["status"] == "success" and up["data"]["result"], up
        # the exporter's admin API works with the token from up's environment, and only with it
        admin = urls["exporter"] + "/admin/weights"
        assert requests.post(admin, json={"candidate": 0}, timeout=5).status_code == 401
        moved = requests.post(admin, json={"candidate": 0}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        assert moved.status_code == 200, moved.text
        weights = requests.get(admin, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5).json()
        assert weights["weights"]["candidate"] == 0, weights
    finally:
        proc.send_signal(signal.SIGINT)
        rest = proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, rest
    assert "stopping the stack" in rest
    assert alive(out) == []
    assert all(port_free(url) for url in urls.values())


def test_a_rules_file_that_is_not_a_yml_rule_file_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for bad in (tmp_path / "missing.yml", tmp_path / "cost.yaml"):
        code = cli.main(["up", "--backend", "sim", "--headless", "--free-ports", "--rules", str(bad),
                         "--out", str(tmp_path / "run")])
        assert code == cli.EXIT_USAGE
        assert f"--rules {bad}: expected an existing .yml rule file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
