"""Real Locust, headless, against the simulator through the exporter: the summary matches the tap's counters."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from specwatch import cli
from specwatch.load.results import RequestResult, percentile, summarise
from specwatch.workloads import write_article_workloads
from tests.test_exporter import value

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    write_article_workloads(out)
    return out


def test_headless_run_through_the_exporter_matches_its_counters(sim_ngram, service_factory, data, tmp_path):
    tap = service_factory("exporter", ["--upstream", f"baseline={sim_ngram.url}"])
    out = tmp_path / "run"
    code = cli.main(["load", "--target", tap.url, "--concurrency", "4", "--requests", "6", "--warmup", "2",
                     "--task", f"code={data / 'code.jsonl'}", "--task", f"chat={data / 'chat.jsonl'}",
                     "--ignore-eos", "--max-tokens", "32", "--max-seconds", "120", "--out", str(out)])
    assert code == cli.EXIT_OK, (out / "locust.log").read_text()[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert summary["warmup_requests"] == 4 and len(lines) == 16
    for task in ("code", "chat"):
        s = summary["tasks"][task]
        assert (s["requests"], s["failures"], s["output_tokens"]) == (6, 0, 6 * 32)
        measured = [r["spec"] for r in lines if r["task"] == task and not r["warmup"]]
        everything = [r["spec"] for r in lines if r["task"] == task]
        assert s["acceptance"]["C"] == sum(f["num_accepted_draft_tokens"] for f in measured)
        assert s["acceptance"]["R"] == sum(f["num_spec_steps"] for f in measured)
        # the tap saw every request, warm-ups included, and counted exactly what the clients received
        assert value(tap.url, "specwatch_accepted_tokens_total", task=task) == sum(
            f["num_accepted_draft_tokens"] for f in everything)
        assert value(tap.url, "specwatch_draft_tokens_total", task=task) == sum(
            f["num_draft_tokens"] for f in everything)
        assert value(tap.url, "specwatch_requests_total", task=task, outcome="ok") == 8
        assert 0 < s["ttft_ms"]["p50"] <= s["ttft_ms"]["p99"] and 0 < s["tpot_ms"]["p50"]
    assert summary["tasks"]["code"]["acceptance"]["drafted_token_share"] > \
        summary["tasks"]["chat"]["acceptance"]["drafted_token_share"]
    # Locust's statistics hold the requests alone, as many as the exporter counted; the latencies their own CSV
    with (out / "locust_stats.csv").open() as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    assert {kind for kind, _ in rows} == {"POST", ""}, sorted(rows)  # "" : the Aggregated row
    assert int(rows[("", "Aggregated")]["Request Count"]) == len(lines) == sum(
        value(tap.url, "specwatch_requests_total", task=task) for task in ("code", "chat"))
    assert int(rows[("POST", "code warmup")]["Request Count"]) == 2
    with (out / "locust_llm_latency.csv").open() as f:
        latency = {(r["Metric"], r["Task"]): r for r in csv.DictReader(f)}
    for task in ("code", "chat"):
        measured = [r for r in lines if r["task"] == task and not r["warmup"]]
        assert int(latency[("TTFT", task)]["Count"]) == len(measured) == 6
        assert int(latency[("ITL", task)]["Count"]) == sum(len(r["itl_s"]) for r in measured)
        p50 = summary["tasks"][task]["ttft_ms"]["p50"]
        assert float(latency[("TTFT", task)]["p50 ms"]) == pytest.approx(p50, rel=0.006)  # 1 % buckets
    with (out / "locust_acceptance.csv").open() as f:  # the exporter's window over the run: every request of it
        acceptance = {r["Task"]: r for r in csv.DictReader(f)}
    for task in ("code", "chat"):
        everything = [r["spec"] for r in lines if r["task"] == task]
        assert acceptance[task]["Requests ok"] == "8" and acceptance[task]["Requests failed"] == "0"
        assert int(acceptance[task]["C"]) == sum(f["num_accepted_draft_tokens"] for f in everything)
        assert int(acceptance[task]["D"]) == sum(f["num_draft_tokens"] for f in everything)
        assert tap.url in acceptance[task]["Source"] and "final" in acceptance[task]["Source"]


def test_a_bad_workload_row_is_reported_with_its_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": 5}\n')
    code = cli.main(["load", "--target", "http://127.0.0.1:9", "--task", f"code={bad}", "--out", str(tmp_path / "o")])
    assert code == cli.EXIT_ERROR
    assert f"{bad}:2" in capsys.readouterr().err


def test_sweep_shape_steps_through_levels_and_stops_by_itself(sim_ngram, data, tmp_path):
    results = tmp_path / "sweep.jsonl"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "locust", "-f", str(REPO / "loadgen" / "sweep.py"), "--headless", "--only-summary",
         "--host", sim_ngram.url, "--workloads", f"chat={data / 'chat.jsonl'}", "--levels", "1,3",
         "--step-seconds", "2", "--max-tokens", "8", "--results-file", str(results),
         # the requests in flight at the end finish (docs/load.md): without it one is cut, a failure, exit 1
         "--stop-timeout", "10"],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - started < 30
    starts = sorted(json.loads(line)["start"] for line in results.read_text().splitlines())
    first, second = [s for s in starts if s < starts[0] + 2], [s for s in starts if s >= starts[0] + 2.2]
    assert first and second  # both levels ran


class Stub(BaseHTTPRequestHandler):
    """A chat stream with a pause after the first text chunk (task `slow`), or a 503 (task `busy`)."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # as uvicorn / asyncio servers: each small chunk leaves when written
    PAUSE_S = 0.4

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers["X-Specwatch-Task"] == "busy":
            body = b'{"error": "overloaded"}'
            self.send_response(503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(data: object) -> None:
            line = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        def text(t: str) -> dict[str, object]:
            return {"choices": [{"index": 0, "delta": {"content": t}}]}

        send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        send(text("a"))  # ~100 bytes in all so far: a reader that waits for 1024 would stall here
        time.sleep(self.PAUSE_S)
        send(text("b"))
        send(text("c"))
        send({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3}})
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *_: object) -> None:
        pass


def test_ttft_stops_at_the_first_text_line_as_it_arrives_and_failures_carry_reasons(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "hi", "output_tokens": 3}\n')
    results = tmp_path / "results.jsonl"
    try:
        done = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(REPO / "loadgen" / "locustfile.py"), "--headless",
             "--only-summary", "-u", "2", "-r", "2", "--host", f"http://127.0.0.1:{server.server_port}",
             "--workloads", f"slow={rows},busy={rows}", "--requests-per-task", "2", "--run-time", "30s",
             "--csv", str(tmp_path / "locust"), "--html", str(tmp_path / "report.html"),
             "--results-file", str(results)],
            capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    slow = [r for r in lines if r["task"] == "slow"]
    busy = [r for r in lines if r["task"] == "busy"]
    assert len(slow) == 2 and len(busy) == 2, done.stderr[-2000:]
    for r in slow:
        assert r["ok"] and r["completion_tokens"] == 3, r
        assert r["ttft_s"] < Stub.PAUSE_S / 2, r  # clocked at "a", not when more bytes came in after the pause
        assert r["tpot_s"] == pytest.approx(Stub.PAUSE_S / 2, rel=0.25), r  # ("c" - "a") / (3 - 1)
        assert len(r["itl_s"]) == 2 and r["itl_s"][0] > Stub.PAUSE_S * 0.9, r
    assert all(not r["ok"] and r["error"].startswith("HTTP 503") for r in busy), busy
    with (tmp_path / "locust_failures.csv").open() as f:
        failures = {(r["Method"], r["Name"]): r for r in csv.DictReader(f)}
    assert "HTTP 503" in failures[("POST", "busy")]["Error"] and failures[("POST", "busy")]["Occurrences"] == "2"
    with (tmp_path / "locust_llm_latency.csv").open() as f:
        latency = {(r["Metric"], r["Task"]): r for r in csv.DictReader(f)}
    assert [latency[(m, "slow")]["Count"] for m in ("TTFT", "TPOT", "ITL")] == ["2", "2", "4"], latency
    assert float(latency[("ITL", "slow")]["Max ms"]) > Stub.PAUSE_S * 900
    with (tmp_path / "locust_stats.csv").open() as f:
        stats = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    # the request's row times the whole answer, the pause included, not the headers
    assert float(stats[("POST", "slow")]["Min Response Time"]) > Stub.PAUSE_S * 1000
    assert {kind for kind, _ in stats} == {"POST", ""}, sorted(stats)
    # headless --html: Locust's report, completed with both tables once Locust has written it
    report = (tmp_path / "report.html").read_text()
    section = report[report.index('<section id="specwatch"'):]
    assert "<td>ITL</td><td>slow</td><td>4</td>" in section and "specwatch-acceptance" in section, section[:2000]


def test_percentiles_and_sums_by_hand():
    assert percentile([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0 and percentile([], 50) is None
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0
    spec = {"acceptance_histogram": [1, 0, 2], "num_spec_steps": 3, "num_accepted_draft_tokens": 4,
            "num_draft_tokens": 6}
    rows = [RequestResult("code", True, False, 0.0, 2.0, 0.1, 0.01, [0.01, 0.02], 10, 5, spec),
            RequestResult("code", True, True, 0.0, 1.0, 9.0, 9.0, [], 10, 5, spec),  # warm-up: left out
            RequestResult("code", False, False, 0.0, 1.0, error="HTTP 500: x")]
    s = summarise(rows)["tasks"]["code"]
    assert (s["requests"], s["failures"], s["output_tokens"]) == (2, 1, 10)
    assert s["ttft_ms"]["p50"] == 100.0 and s["acceptance"]["C"] == 4 and s["errors"] == ["HTTP 500: x"]
    assert s["acceptance"]["acceptance_rate"] == 4 / 6
