"""The figures behind the web UI's LLM latency and Acceptance tabs, by hand: no server, no Locust process."""

from __future__ import annotations

import math
import random

import pytest

from specwatch.load.acceptance_tab import NONE, AcceptanceView, rows
from specwatch.load.latency import LatencyBook, Series
from specwatch.snapshot import Snapshot, diff


def nearest_rank(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(1, math.ceil(p / 100 * len(ordered))) - 1]


def test_percentiles_are_within_half_a_percent_of_the_exact_nearest_rank():
    rng = random.Random(7)
    for values in ([rng.lognormvariate(0, 2) for _ in range(5000)],          # ms from 0.01 to ~1000
                   [rng.uniform(0.0004, 0.004) for _ in range(300)],         # sub-millisecond gaps
                   [0.0, 0.0, 5.0], [42.0]):
        s = Series()
        for v in values:
            s.add(v)
        assert s.count == len(values) and s.total_ms == pytest.approx(sum(values))
        for p in (50, 95, 99, 100):
            exact, got = nearest_rank(values, p), s.percentile(p)
            assert got is not None
            assert abs(got - exact) <= max(0.005 * exact, 0.001), (p, exact, got)
    assert Series().percentile(50) is None


def test_merged_worker_deltas_equal_one_book_that_saw_everything():
    rng = random.Random(3)
    everything, master = LatencyBook(), LatencyBook()
    workers = [LatencyBook(), LatencyBook()]
    for round_ in range(4):  # four report intervals, each worker sending what it recorded since the last
        for w in workers:
            for _ in range(rng.randint(0, 50)):
                metric, task, s = rng.choice(("TTFT", "TPOT", "ITL")), rng.choice(("code", "chat")), rng.random()
                w.record(metric, task, s)
                everything.record(metric, task, s)
            master.merge(w.take())
            assert w.series == {}, round_  # a take forgets what it sent
    assert [r["count"] for r in master.rows()] == [r["count"] for r in everything.rows()]
    for mine, whole in zip(master.rows(), everything.rows(), strict=True):
        for key in ("metric", "task", "count", "p50", "p95", "p99", "max"):
            assert mine[key] == whole[key], key
        assert mine["mean"] == pytest.approx(whole["mean"])
    # task order, then TTFT, TPOT, ITL
    assert [(r["task"], r["metric"]) for r in master.rows()][:3] == [("chat", "TTFT"), ("chat", "TPOT"),
                                                                      ("chat", "ITL")]
    with pytest.raises(ValueError, match="latency metric 'E2E'"):
        master.record("E2E", "code", 1.0)


def exposition(requests_ok: int, failed: int, steps: int, accepted: int, drafted: int, decode: int,
               per_pos: list[int], reaching: list[int], without: int = 0) -> str:
    sel = 'variant="candidate",task="code"'
    lines = [f'specwatch_requests_total{{{sel},outcome="ok"}} {requests_ok}',
             f'specwatch_requests_total{{{sel},outcome="upstream_error"}} {failed}',
             f'specwatch_requests_total{{{sel},outcome="client_abort"}} 0',
             'specwatch_requests_total{variant="candidate",task="chat",outcome="ok"} 0',
             f"specwatch_spec_steps_total{{{sel}}} {steps}",
             f"specwatch_spec_steps_without_per_step_total{{{sel}}} {without}",
             f"specwatch_accepted_tokens_total{{{sel}}} {accepted}",
             f"specwatch_draft_tokens_total{{{sel}}} {drafted}",
             f"specwatch_decode_steps_total{{{sel}}} {decode}"]
    lines += [f'specwatch_accepted_tokens_per_pos_total{{{sel},position="{i}"}} {v}' for i, v in enumerate(per_pos)]
    lines += [f'specwatch_drafts_reaching_pos_total{{{sel},position="{i}"}} {v}' for i, v in enumerate(reaching)]
    return "\n".join(lines) + "\n"


def test_rows_are_the_window_at_the_exporter_with_both_definitions_by_position():
    url = "http://exporter:9400/metrics"
    before = Snapshot(url, 100.0, exposition(3, 1, 10, 5, 20, 30, [4, 1], [10, 8]))
    # in the window: 7 ok + 2 failed requests, R 40, C 30, D 80, decode steps 80,
    # steps accepting >= 1 / >= 2: 24 / 6, drafts that reached position 1 / 2: 40 / 20
    after = Snapshot(url, 160.0, exposition(10, 3, 50, 35, 100, 110, [28, 7], [50, 28]))
    (row,) = rows(diff(before, after), "src")
    assert (row["variant"], row["task"], row["ok"], row["failed"]) == ("candidate", "code", "7", "2")
    assert (row["accepted"], row["drafted"], row["steps"]) == ("30", "80", "40")
    assert row["rate"] == "0.375" and row["length"] == "1.75" and row["share"] == "0.500"
    assert row["positions"] == "0.600 · 0.150"       # 24 / 40, 6 / 40
    assert row["reached"] == "0.600 · 0.300"         # 24 / 40, 6 / 20
    assert row["source"] == "src"
    # a window with steps that came without per-step arrays: no reach-conditioned figure
    mixed = Snapshot(url, 160.0, exposition(10, 3, 50, 35, 100, 110, [28, 7], [50, 28], without=4))
    assert rows(diff(before, mixed), "src")[0]["reached"] == NONE
    # requests but no draft yet: counts, and no ratio made of nothing
    quiet = Snapshot(url, 160.0, exposition(5, 1, 10, 5, 20, 30, [4, 1], [10, 8]))
    (row,) = rows(diff(before, quiet), "src")
    assert (row["ok"], row["failed"], row["steps"], row["rate"], row["share"]) == ("2", "0", "0", NONE, NONE)


def test_the_view_says_why_it_has_no_figures():
    off = AcceptanceView(None)
    off.start()
    assert "no exporter" in off.rows()[0]["source"]
    down = AcceptanceView("http://127.0.0.1:9/metrics", timeout_s=1)  # port 9 (discard): nothing listens
    down.start()
    (row,) = down.rows()
    assert row["source"].startswith("http://127.0.0.1:9/metrics: no snapshot when the run started")
    assert row["ok"] == NONE
