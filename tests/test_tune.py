"""`specwatch tune`: the fit and the recommendation on planted data, the simulator's timing and table, a sweep end to
end on the simulator (experiment, then tune, which measures the proof) and a short one on the real vLLM CPU build."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from specwatch import cli
from specwatch.config import Home
from specwatch.experiment import PlanError, parse_plan
from specwatch.experiment.runner import variant_args
from specwatch.load.results import RequestResult
from specwatch.models.build import ModelFolders
from specwatch.simulator import timing
from specwatch.simulator.args import parse_sim_args
from specwatch.simulator.engine import EngineRequest
from specwatch.simulator.main import build
from specwatch.simulator.spec_config import k_for_batch, parse_speculative_config
from specwatch.simulator.target import generate
from specwatch.simulator.tokens import tokenize
from specwatch.tune import fit, proof
from specwatch.tune.sweep import Sample, sample
from specwatch.workloads import article_rows
from tests.test_makefile import make_as_typed

REPO = Path(__file__).parents[1]
KS = (0, 1, 2, 3, 4)


def planted(acceptance: tuple[float, ...], verify_growth: dict[int, float], plain: float = 0.005) -> fit.Model:
    """A model whose step at batch b with k drafts costs plain * (1 + growth[b] * k)."""
    seconds = {(b, k): plain * (1 + g * k) for b, g in verify_growth.items() for k in KS}
    return fit.Model(KS, {"code": 1.0}, {"code": acceptance}, fit.CostTable(tuple(sorted(verify_growth)), seconds))


# -- the fit and the recommendation ---------------------------------------------------------------

def test_verification_that_grows_with_the_batch_gives_a_smaller_k_at_large_batch() -> None:
    model = planted((0.7, 0.5, 0.35, 0.25), {1: 0.02, 8: 0.05, 32: 0.2, 64: 0.45})
    choices, ranges = fit.recommend(model, 64)
    by_batch = {c.batch: c.k for c in choices}
    assert by_batch[1] == 4 and by_batch[64] < by_batch[1], ranges
    assert by_batch[64] <= 1
    assert ranges[0][0] == 1 and ranges[-1][1] == 64
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))  # contiguous, non-overlapping
    assert [k for *_, k in ranges] == sorted((k for *_, k in ranges), reverse=True)  # k only falls with the batch
    # E(k) = 1 + sum of the first k P_i
    assert model.tokens_per_step(0) == 1 and math.isclose(model.tokens_per_step(2), 2.2)


def test_acceptance_zero_gives_k_zero_and_no_config() -> None:
    model = planted((0.0, 0.0, 0.0, 0.0), {1: 0.01, 64: 0.3})
    choices, ranges = fit.recommend(model, 64)
    assert {c.k for c in choices} == {0} and ranges == ((1, 64, 0),)
    assert fit.speculative_config({"method": "ngram"}, ranges) is None


def test_the_config_is_valid_for_the_simulators_parser_and_its_table_gives_the_chosen_k() -> None:
    model = planted((0.8, 0.6, 0.45, 0.3), {1: 0.01, 8: 0.04, 32: 0.15, 64: 0.4})
    choices, ranges = fit.recommend(model, 64)
    method = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    config = fit.speculative_config(method, ranges)
    assert config is not None and len(ranges) > 1
    parsed = parse_speculative_config(json.dumps(config))
    assert parsed.num_speculative_tokens == max(k for *_, k in ranges)
    assert parsed.num_speculative_tokens_per_batch_size == ranges
    for c in choices:
        assert k_for_batch(parsed, c.batch) == c.k == proof.table_k(config, c.batch)
    assert k_for_batch(parsed, 500) == ranges[-1][2]  # past the last range: carried forward


def test_the_tpot_objective_can_change_the_choice_and_is_flagged_when_nothing_meets_it() -> None:
    seconds = {(1, k): 0.010 * (1 + 0.3 * k) for k in KS}
    acceptance = {"code": (0.9, 0.85, 0.8, 0.75), "chat": (0.1, 0.0, 0.0, 0.0)}
    model = fit.Model(KS, {"code": 0.5, "chat": 0.5}, acceptance, fit.CostTable((1,), seconds))
    free = fit.choose(model, 1, None, 0.0)
    assert free.k == 4  # code's gain outweighs chat's loss on the mix
    tight = fit.choose(model, 1, 11.0, 0.0)  # chat's TPOT at k = 4 is 22 / 1.1 = 20 ms: too slow
    assert tight.k < free.k and tight.meets_objective and max(tight.tpot_ms.values()) <= 11.0
    impossible = fit.choose(model, 1, 1.0, 0.0)
    assert not impossible.meets_objective and impossible.k == 0  # the lowest worst-task TPOT


def test_acceptance_fit_is_per_decode_step_and_pools_every_k_that_reached_the_position() -> None:
    # n-gram style: 10 decode steps, 4 of them drafted; survival counts steps accepting >= 1, >= 2
    a = Sample("code", 0.01, 11, 6, 10, (4, 2))
    b = Sample("code", 0.01, 11, 2, 10, (2, 0, 0, 0))
    p = fit.fit_acceptance([(2, a), (4, b)], 4)
    assert p == pytest.approx((6 / 20, 2 / 20, 0 / 10, 0 / 10))
    assert fit.expected_tokens(p, 2) == pytest.approx(1.4)


def test_a_request_gives_its_decode_steps_and_step_time() -> None:
    spec = {"num_accepted_draft_tokens": 32, "num_draft_tokens": 60, "num_spec_steps": 30,
            "acceptance_histogram": [10, 8, 12]}
    line = RequestResult("code", ok=True, warmup=False, start=0.0, end=1.0, tpot_s=0.002, completion_tokens=65,
                         spec=spec)
    s = sample(line)
    assert s is not None and s.decode_steps == 64 - 32 and s.survival == (20, 12)
    assert s.step_s == pytest.approx(0.002 * 64 / 32)
    # every decode step drafted: 40 steps (the histogram's sum, as vLLM counts them) for the same 32 accepted
    async_like = replace(line, spec={**spec, "num_spec_steps": 40, "acceptance_histogram": [19, 10, 11]})
    assert (s2 := sample(async_like)) is not None and s2.decode_steps == 40
    assert sample(replace(line, warmup=True)) is None and sample(replace(line, ok=False)) is None
    baseline = sample(replace(line, spec=None))
    assert baseline is not None and baseline.decode_steps == 64 and baseline.step_s == pytest.approx(0.002)


def test_cost_is_linear_in_log_batch_between_measured_sizes_and_flat_outside() -> None:
    table = fit.CostTable((1, 16), {(1, 0): 0.004, (16, 0): 0.008})
    assert table.at(4, 0) == pytest.approx(0.006)  # log 4 is half of log 16
    assert table.at(64, 0) == 0.008 and table.at(1, 0) == 0.004


# -- the simulator: H200 verification cost and the per-batch-size table -------------------------

def test_the_timing_model_makes_batch_32_64_verification_2_to_2_6_times_a_plain_step() -> None:
    for batch in (32, 64):
        ratio = timing.forward_ms("qwen3-8b", batch, 5, 2048) / timing.forward_ms("qwen3-8b", batch, 1, 2048)
        assert 1.8 < ratio < 2.7, (batch, ratio)
    assert timing.forward_ms("qwen3-8b", 64, 5, 2048) / timing.forward_ms("qwen3-8b", 64, 1, 2048) > 2.4
    assert timing.forward_ms("qwen3-8b", 1, 5, 512) / timing.forward_ms("qwen3-8b", 1, 1, 512) < 1.1


def _drafts_per_step(concurrency: int) -> float:
    config = {"method": "eagle3", "model": "x/eagle3", "num_speculative_tokens": 4,
              "num_speculative_tokens_per_batch_size": [[1, 1, 4], [2, 64, 1]]}
    _, engine = build(parse_sim_args(["m", "--speculative-config", json.dumps(config), "--sim-time-scale", "1e-5"]))
    rows = article_rows("code")

    async def go() -> list[EngineRequest]:
        loop = asyncio.create_task(engine.run())
        reqs = [EngineRequest(str(i), tokenize(rows[i].prompt), generate(rows[i].prompt, 48).tokens, 48)
                for i in range(concurrency)]
        for r in reqs:
            engine.add(r)
        while not all(r.finished for r in reqs):
            await asyncio.sleep(0.001)
        loop.cancel()
        return reqs

    stats = [r.spec_stats for r in asyncio.run(go())]
    return sum(s.drafted for s in stats if s) / sum(s.steps for s in stats if s)


def test_the_simulator_honours_the_per_batch_size_table() -> None:
    assert _drafts_per_step(1) == 4
    assert 1 <= _drafts_per_step(6) < 1.3  # batch 6 drafts 1; only the last request's steps alone draft 4


# -- the plan ----------------------------------------------------------------------------------------

SWEEP = """
name: sweep
backend: {kind: sim, args: ["--sim-time-scale", "1"]}
model: Qwen/Qwen3-8B
server: {dtype: bfloat16, enforce_eager: false}
tasks: {code: article, chat: article}
warmup_requests: 1
acceptance: {rows: 1, max_tokens: 16, concurrency: 2}
performance: {concurrencies: [1, 64], requests: {1: 20, 64: 64}, warmup: 1, max_tokens: 32, ignore_eos: true}
sweep:
  method: {method: eagle3, model: RedHatAI/Qwen3-8B-speculator.eagle3}
  ks: [0, 4, 12]
"""


@pytest.mark.parametrize(("change", "message"), [
    ({"variants": {"a": {}}}, "either `variants`"),
    ({"sweep": {"method": {"method": "ngram"}, "ks": [1, 2]}}, "sweep.ks: expected a list of distinct"),
    ({"sweep": {"method": {"method": "ngram", "num_speculative_tokens": 3}, "ks": [0, 2]}},
     "sweep.method.num_speculative_tokens"),
    ({"sweep": {"method": {"method": "ngram"}, "ks": [0, 2], "max_tpot_ms": -1}}, "sweep.max_tpot_ms"),
    ({"performance": {"concurrencies": [1], "ignore_eos": False}}, "ignore_eos: true"),
    ({"performance": {"concurrencies": [1, 8], "requests": {1: 4}}}, "performance.requests"),
])
def test_sweep_plan_errors_name_the_key(change: dict[str, object], message: str, tmp_path: Path) -> None:
    raw = yaml.safe_load(SWEEP)
    raw.update(change)
    with pytest.raises(PlanError, match=message):
        parse_plan(yaml.safe_dump(raw), tmp_path, Home(tmp_path))


def test_a_sweep_expands_into_one_variant_per_k_against_k0(tmp_path: Path) -> None:
    plan = parse_plan(SWEEP, tmp_path, Home(tmp_path))
    assert [v.name for v in plan.variants] == ["k0", "k4", "k12"]
    assert plan.variants[0].speculative_config is None
    assert plan.variants[2].speculative_config == {"method": "eagle3", "model": "RedHatAI/Qwen3-8B-speculator.eagle3",
                                                   "num_speculative_tokens": 12}
    # the server's own timing, and a batch that can hold the largest concurrency (serve_argv caps it at 16)
    assert all(v.args == ("--enable-per-request-metrics",) for v in plan.variants)
    argv = variant_args(plan, plan.variants[1])
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--max-num-seqs"] == ["64"]
    argv = variant_args(plan, plan.variants[1])
    assert argv[len(argv) - 1 - argv[::-1].index("--max-num-seqs") + 1] == "64"  # the last one wins
    assert all(v.baseline == "k0" for v in plan.variants[1:])
    assert plan.performance is not None and plan.performance.requests_at(64) == 64
    example = parse_plan((REPO / "examples/plans/tune-sim.yaml").read_text(), REPO / "examples/plans", Home(tmp_path))
    assert example.sweep is not None and example.performance is not None
    assert example.performance.concurrencies == (1, 8, 32, 64) and 0 in example.sweep.ks


# -- end to end ------------------------------------------------------------------------------------------

def _check_tune_outputs(run: Path) -> dict[str, object]:
    tune = run / "tune"
    for name in ("speculative-config.json", "recommendation.json", "cost-rules.yml", "tune.md", "tune.png",
                 "proof.md", "proof.json", "proof-mix.json"):
        assert (tune / name).is_file(), name
    config = json.loads((tune / "speculative-config.json").read_text())
    rec = json.loads((tune / "recommendation.json").read_text())
    ranges = rec["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    if config is not None:
        parsed = parse_speculative_config(json.dumps(config))
        assert parsed.num_speculative_tokens == max(k for *_, k in ranges)
    md = (tune / "tune.md").read_text()
    assert "## Recommendation" in md and "**Use " in md and "Why:" in md
    assert "groups:" in (tune / "cost-rules.yml").read_text()
    return {"config": config, "rec": rec, "proof": json.loads((tune / "proof.json").read_text()),
            "mix": json.loads((tune / "proof-mix.json").read_text())}


@pytest.mark.servers
def test_tune_sim_small_end_to_end(tmp_path: Path) -> None:
    """A sweep of EAGLE-3 at k 0, 4, 12 and concurrency 1 and 64 on the simulator at H200 step times: tune keeps
    k = 12 where verifying 13 tokens per sequence is cheap (batch 1) and drops it where it costs several plain steps
    (batch 64); the proof measures the table, and the simulator follows it.

    Run as a user types it: `make tune-sim`, this small plan in place of the long one and the results folder named
    by a path relative to the checkout, as `results` is (issue 43: a relative run folder was joined twice and the
    proof stopped, on every fresh clone). `-o .venv/.installed`: the environment is the one this test runs in."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(SWEEP)
    run = make_as_typed("tune-sim", "TUNE_SIM_PLAN", plan, tmp_path / "results", timeout=1500)
    assert run.name.startswith("tune-sim-"), run
    assert json.loads((run / "run.json").read_text())["variants"] == ["k0", "k4", "k12", "dynamic"]
    got = _check_tune_outputs(run)
    rec = got["rec"]
    assert isinstance(rec, dict)
    chosen = {c["batch"]: c["k"] for c in rec["choices"]}
    assert chosen[1] == 12 and chosen[64] < 12, rec["num_speculative_tokens_per_batch_size"]
    cost = rec["step_cost_seconds"]
    assert cost["64,12"] / cost["64,0"] > 2.5 > 1.6 > cost["1,12"] / cost["1,0"]  # H200: cheap at 1, dear at 64
    rows = got["proof"]
    assert isinstance(rows, list) and {r["concurrency"] for r in rows} == {1, 64}
    at64 = [r for r in rows if r["concurrency"] == 64]
    # the server followed the table: where it gives less than the static k = 12, the dynamic cell drafted well
    # under 12 per step (a server ignoring it drafts exactly 12). Not "at most the table's k at 64": the batch
    # wanders below 64 while users start and the last round drains, and smaller batches get the table's larger k
    # (CI saw 4.39 drafts per step where the table gave k = 0 from some batch size up to 64)
    assert all(r["drafts_per_step"] < 12 - 0.5 for r in at64 if r["table_k"] < 12), at64
    assert any(r["table_k"] < 12 for r in at64), at64
    assert all(r["n_dynamic"] >= 20 for r in rows)
    # at batch 64 the table's smaller k beats the fixed k = 12 a user would pick at concurrency 1 on chat, where most
    # of 12 drafts are rejected (TPOT 0.69 and 0.73 of k = 12's in two runs here, p < 1e-6). Not over the mix: code
    # accepts long runs, so k = 12 does well there, and the mix's ratio moves around 1 (1.05 and 1.16 here, 0.97 in
    # CI's run: no claim to make; the proof prints it with its interval)
    chat64 = next(r for r in rows if r["concurrency"] == 64 and r["task"] == "chat")
    assert chat64["single_k"] == 12 and chat64["vs_single"]["state"] == "low", chat64
    assert chat64["vs_single"]["high"] < 0.9, chat64
    mix = {r["concurrency"]: r for r in got["mix"]}  # type: ignore[attr-defined]
    assert set(mix) == {1, 64} and all(r["single_k"] == 12 and len(r["vs_single"]) == 3 for r in mix.values()), mix
    status = json.loads((run / "variants" / "dynamic" / "status.json").read_text())
    assert status["state"] == "done" and status["speculative_config"] == got["config"]
    # the cost table for the live dashboard carries the deployment's variant label, and only a valid one
    assert cli.main(["tune", str(run), "--out", str(tmp_path / "live"), "--cost-variant", "candidate"]) == 0
    rules = yaml.safe_load((tmp_path / "live" / "cost-rules.yml").read_text())
    variants = {r["labels"]["variant"] for g in rules["groups"] for r in g["rules"] if "variant" in r.get("labels", {})}
    assert variants == {"candidate"}, variants
    assert cli.main(["tune", str(run), "--out", str(tmp_path / "bad"), "--cost-variant", "Bad Name"]) == 2
    # a deployment with data parallel above 1 ignores the per-batch-size table: tune says so where it is read
    assert not json.loads((run / "tune" / "recommendation.json").read_text())["warnings"]
    assert cli.main(["tune", str(run), "--out", str(tmp_path / "dp"), "--data-parallel-size", "2"]) == 0
    assert "data parallel size 2" in json.loads((tmp_path / "dp" / "recommendation.json").read_text())["warnings"][0]
    assert "**Warning:** the deployment runs data parallel size 2" in (tmp_path / "dp" / "tune.md").read_text()
    assert cli.main(["tune", str(run), "--out", str(tmp_path / "dp0"), "--data-parallel-size", "0"]) == 2


@pytest.mark.real_vllm
def test_a_short_real_cpu_sweep_tunes_and_proves(home: Home, model_folders: ModelFolders, tmp_path: Path) -> None:
    """The real vLLM 0.32.0 CPU build: n-gram at k 0 and 2, concurrency 1 and 2, then tune, as a user runs them."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"""
backend: vllm_cpu
model: "{{models}}/{model_folders.target.name}"
server: {{dtype: null, enforce_eager: true}}
tasks: {{code: article, chat: article}}
warmup_requests: 1
acceptance: {{rows: 1, max_tokens: 16, concurrency: 1}}
performance: {{concurrencies: [1, 2], requests: 3, warmup: 0, max_tokens: 16, ignore_eos: true}}
sweep:
  method: {{method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 4}}
  ks: [0, 2]
""")
    out = tmp_path / "r"
    code = cli.main(["--home", str(home.root), "experiment", str(plan), "--out", str(out), "--run-id", "s",
                     "--no-prometheus"])
    assert code == cli.EXIT_OK, (out / "s" / "run.json").read_text()[-2000:]
    assert cli.main(["--home", str(home.root), "tune", str(out / "s")]) == cli.EXIT_OK
    rec = json.loads((out / "s" / "tune" / "recommendation.json").read_text())
    assert set(rec["acceptance_per_position"]) == {"code", "chat"}
    assert rec["acceptance_per_position"]["code"][0] > 0  # n-gram drafts and hits on the code edit
    assert {k for k in (c["k"] for c in rec["choices"])} <= {0, 2}
    if rec["speculative_config"] is not None:
        got = _check_tune_outputs(out / "s")
        assert isinstance(got["proof"], list) and {r["concurrency"] for r in got["proof"]} == {1, 2}
        # vLLM 0.32.0's CPU build honours the table: no request drafts more per step than the K of a batch size it
        # could have run at (1 .. its concurrency: on a busy machine two streams at concurrency 2 often do not
        # overlap, and a batch of 1 gets batch 1's K; this session's full run drafted 2.0 where batch 2's K was 0)
        config = got["config"]
        assert isinstance(config, dict)
        assert all(r["drafts_per_step"] <= max(proof.table_k(config, b) for b in range(1, r["concurrency"] + 1)) + 0.5
                   for r in got["proof"]), got["proof"]
        env = json.loads((out / "s" / "variants" / "dynamic" / "environment.json").read_text())
        assert env["server_version"] == "0.32.0"
        assert "num_speculative_tokens_per_batch_size" in " ".join(env["argv"])


def test_tune_on_a_folder_that_is_not_a_sweep_is_a_usage_error(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["tune", str(tmp_path)]) == cli.EXIT_USAGE
    assert "sweep.json: missing" in capsys.readouterr().err


def test_live_acceptance_carries_on_past_the_served_k_with_the_sweeps_conditional_rates() -> None:
    from specwatch.tune.live import extend, queries
    assert extend((0.8, 0.6), (0.9, 0.45, 0.3), 3) == pytest.approx((0.8, 0.6, 0.6 * 0.3 / 0.45))
    assert extend((0.5,), (), 2) == (0.5, 0.0)
    q = queries("1h", "candidate")
    assert 'variant=~"candidate"' in q["per_position"] and "[1h]" in q["decode_steps"]
    assert 'outcome="ok"' in q["requests"]


def test_make_tune_sim_runs_the_example_sweep_then_tune_without_the_vllm_install() -> None:
    from tests.test_makefile import dry_run
    commands = dry_run("tune-sim")
    assert "experiment examples/plans/tune-sim.yaml" in commands and "specwatch tune results/" in commands
    assert "vllm-cpu setup" not in commands and "models build" not in commands
