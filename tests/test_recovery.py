"""A study recovers from a noisy machine: what others took while a block ran (`specwatch.experiment.disturbance`),
read from /proc, marks the block disturbed, and the runner measures its round again at the end, up to the plan's
`max_extra_rounds`; the quiet path measures nothing more. The planted noise is `tests/hog.py`'s busy processes,
started by this test, outside the study's process tree (the study runs as its own process, as a user runs it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specwatch.config import Home
from specwatch.experiment import PlanError, disturbance, parse_plan
from specwatch.report import results
from tests.hog import Hog

NGRAM = "{method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 4}"
# blocks of about 2 s on the simulator: long enough for a hog's share of them to be measured
ROUNDS = f"""
backend: {{kind: sim, args: ["--sim-time-scale", "3"]}}
model: Qwen/Qwen3-8B
tasks: {{chat: article}}
warmup_requests: 0
acceptance: {{rows: 2, max_tokens: 16}}
performance: {{concurrencies: [1], requests: 6, warmup: 0, max_tokens: 24}}
design: interleaved
rounds: 3
max_extra_rounds: 1
variants:
  baseline: {{}}
  ngram:
    speculative_config: {NGRAM}
"""


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


def test_a_hog_outside_the_tree_reads_as_outside_cores_and_inside_it_as_the_studys_own() -> None:
    study = sleeper()  # a stand-in for the study's process tree: the hog is not under it
    try:
        before = disturbance.read(study.pid)
        with Hog(seconds=30, processes=2):
            time.sleep(1.5)
            after = disturbance.read(study.pid)
        machine = disturbance.between(before, after)
        assert machine is not None and machine.outside_cores > 1.0, machine  # two spinners: nearly two cores
        assert machine.disturbed(0.5) is not None and "processes outside the study used" in str(machine.disturbed(0.5))
        before = disturbance.read()  # this process's tree: the hog, its child, is the study's own now
        with Hog(seconds=30, processes=2):
            time.sleep(1.5)
            after = disturbance.read()
        assert before is not None and after is not None
        own = (after.own - before.own) / os.sysconf("SC_CLK_TCK") / (after.at - before.at)
        assert own > 1.0, own  # the two spinners are counted as the study's, whatever else the machine runs
    finally:
        study.kill()
        study.wait()


def test_a_docker_study_is_not_watched_and_says_why() -> None:
    assert disturbance.unwatchable({"baseline": "sim", "ngram": "vllm_cpu"}) is None
    why = disturbance.unwatchable({"baseline": "docker", "ngram": "docker"})
    assert why is not None and why.startswith("baseline, ngram run in a container")


def run_study(folder: Path, plan: str, hog_from: int, hog_until: int) -> tuple[Path, str]:
    """The study in its own process, a hog planted from the `hog_from`-th performance block's start until the
    `hog_until`-th block starts (0: no hog)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.yaml").write_text(plan)
    run = folder / "r" / "s"
    log = folder / "experiment.log"
    command = [sys.executable, "-m", "specwatch.cli", "experiment", str(folder / "plan.yaml"), "--out",
               str(folder / "r"), "--run-id", "s", "--no-prometheus"]

    def started() -> int:
        return len(list(run.glob("variants/*/perf/c*/rounds/r*")))

    with log.open("w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            if hog_from:
                while proc.poll() is None and started() < hog_from:
                    time.sleep(0.05)
                with Hog(seconds=120, processes=2):
                    while proc.poll() is None and started() < hog_until:
                        time.sleep(0.05)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, log.read_text()[-3000:]
    return run, log.read_text()


def blocks(run: Path, name: str) -> list[dict[str, Any]]:
    return list(json.loads((run / "variants" / name / "status.json").read_text())["blocks"])


@pytest.mark.servers
def test_a_round_disturbed_by_a_hog_is_measured_again_and_the_quiet_rounds_are_kept(tmp_path: Path) -> None:
    run, log = run_study(tmp_path / "noisy", ROUNDS, hog_from=1, hog_until=2)  # the hog over round 1's first block
    for name in ("baseline", "ngram"):
        by_round = {b["round"]: b for b in blocks(run, name)}
        assert sorted(by_round) == [1, 2, 3, 4], by_round
        assert all(b["machine"]["seconds"] > 0.5 for b in by_round.values())
        assert by_round[1]["replaced_by"] == 4 and by_round[4]["replaces"] == 1
        assert all("replaced_by" not in by_round[r] for r in (2, 3, 4))
        rows = [json.loads(line) for line in (run / "variants" / name / "perf/c1/requests.jsonl").read_text()
                .splitlines()]
        assert sorted({r["round"] for r in rows}) == [2, 3, 4]  # the replaced round is left out of the pass
        assert sum(1 for r in rows if not r["warmup"]) == 6  # round 4 took round 1's share: 2 requests
        assert (run / "variants" / name / "perf/c1/rounds/r1/requests.jsonl").is_file()  # kept on disk
        # the server served the replaced round too: the reconciliation counts it, and the counters still add up
        recon = json.loads((run / "variants" / name / "reconciliation.json").read_text())
        assert recon["ok"] and "perf/c1/rounds/r1/requests.jsonl" in recon["sources"], recon
        if name == "ngram":  # the acceptance pass's 2, and every block's 2 of 4 rounds, each with its field
            assert recon["per_request"]["requests"] == 2 + 8, recon
    first = blocks(run, "baseline")[0]  # the rotation's first block of round 1: wholly under the hog
    assert first["round"] == 1 and first["machine"]["outside_cores"] > 0.5
    assert first["disturbed"].startswith("processes outside the study used ")
    replaced = json.loads((run / "run.json").read_text())["recovery"]["replaced"]
    assert [(x["concurrency"], x["round"], x["replaced_by"]) for x in replaced] == [(1, 1, 4)], replaced
    assert replaced[0]["reason"] and replaced[0]["outside_cores"] > 0.5
    assert "round 1 at concurrency 1 was disturbed (processes outside the study used" in log
    ngram = results.load(run).variant("ngram")
    assert ngram is not None and sorted({r.round for rows in ngram.requests[1].values() for r in rows}) == [2, 3, 4]


@pytest.mark.servers
def test_a_quiet_study_measures_nothing_more_and_a_long_hog_stops_at_the_budget(tmp_path: Path) -> None:
    quiet, log = run_study(tmp_path / "quiet", ROUNDS, hog_from=0, hog_until=0)
    for name in ("baseline", "ngram"):
        got = blocks(quiet, name)
        assert sorted(b["round"] for b in got) == [1, 2, 3], got
        assert all(b["disturbed"] is None and b["machine"]["outside_cores"] < 0.5 for b in got), got
    record = json.loads((quiet / "run.json").read_text())
    assert record["recovery"]["replaced"] == [] and record["recovery"]["not_watched"] is None
    # run.json names each server's vLLM version (the simulator answers /version as vLLM 0.32.0 does)
    assert {n: x["vllm_version"] for n, x in record["servers"].items()} == {"baseline": "0.32.0", "ngram": "0.32.0"}
    assert "was disturbed" not in log
    # a hog over every block: one extra round (the budget), and the disturbed rounds that remain stay in the pass
    loud, _ = run_study(tmp_path / "loud", ROUNDS, hog_from=1, hog_until=10 ** 6)
    for name in ("baseline", "ngram"):
        got = blocks(loud, name)
        assert sorted(b["round"] for b in got) == [1, 2, 3, 4], got
        kept = {b["round"] for b in got if "replaced_by" not in b}
        assert kept == {2, 3, 4} and all(b["disturbed"] for b in got), got


@pytest.mark.servers
def test_a_sequential_study_measures_a_disturbed_block_again_at_once(tmp_path: Path) -> None:
    plan = ROUNDS.replace("design: interleaved\nrounds: 3\n", "design: sequential\n")
    run, _ = run_study(tmp_path / "seq", plan, hog_from=1, hog_until=2)  # the hog over the first variant's block
    first = blocks(run, "baseline")
    assert [(b["round"], b.get("replaced_by"), b.get("replaces")) for b in first] == [(1, 2, None), (2, None, 1)]
    assert first[0]["disturbed"] and not first[1]["disturbed"]
    assert [b["round"] for b in blocks(run, "ngram")] == [1]  # the next variant's block was quiet: measured once
    rows = (run / "variants" / "baseline" / "perf/c1/requests.jsonl").read_text().splitlines()
    assert {json.loads(line)["round"] for line in rows} == {2} and len(rows) == 6


@pytest.mark.parametrize(("change", "message"), [
    ("max_extra_rounds: -1", r"plan.max_extra_rounds: expected an integer >= 0, got int -1"),
    ("max_extra_rounds: two", r"plan.max_extra_rounds: expected an integer >= 0"),
    ("disturbed_above_cores: 0", r"disturbed_above_cores: expected a positive number of cores"),
])
def test_the_recovery_keys_are_checked(tmp_path: Path, change: str, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        parse_plan(ROUNDS.replace("max_extra_rounds: 1", change), tmp_path, Home(tmp_path / "home"))


def test_the_budget_defaults_to_half_the_rounds(tmp_path: Path) -> None:
    home = Home(tmp_path / "home")
    plan = parse_plan(ROUNDS.replace("max_extra_rounds: 1\n", "").replace("rounds: 3", "rounds: 4"), tmp_path, home)
    assert (plan.max_extra_rounds, plan.disturbed_above_cores) == (2, 0.5)
    off = parse_plan(ROUNDS.replace("max_extra_rounds: 1", "max_extra_rounds: 0"), tmp_path, home)
    assert off.max_extra_rounds == 0
