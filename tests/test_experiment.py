"""`specwatch experiment`: plans end to end on the simulator (and one on the real vLLM CPU), resume, plan errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specwatch import cli, snapshot
from specwatch.backends.base import port_open
from specwatch.config import Home
from specwatch.experiment import PlanError, parse_plan
from specwatch.experiment.layout import VariantFolder
from specwatch.experiment.runner import variant_args
from specwatch.experiment.timeline import Timeline
from specwatch.grafana import key_queries
from specwatch.report import results

REPO = Path(__file__).parents[1]
NGRAM = "{method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 4}"

SMALL = f"""
name: small
backend: {{kind: sim, args: ["--sim-time-scale", "0.02"]}}
model: Qwen/Qwen3-8B
server: {{dtype: bfloat16, enforce_eager: false}}
tasks: {{code: article, chat: article}}
acceptance: {{rows: 3, max_tokens: 48}}
performance: {{concurrencies: [1, 3], requests: 3, warmup: 1, max_tokens: 24}}
variants:
  baseline: {{}}
  ngram:
    speculative_config: {NGRAM}
"""


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _spec_fields(variant: Path) -> list[dict[str, Any] | None]:
    files = sorted((variant / "acceptance").glob("*.jsonl")) + sorted((variant / "perf").glob("c*/requests.jsonl"))
    folder = VariantFolder(variant)  # and a round measured again (a noisy moment): its requests were served too
    files += [path for c in folder.concurrencies() for path in folder.replaced_blocks(c)]
    return [r["spec"] for f in files for r in _lines(f)]


@pytest.mark.servers
def test_a_small_plan_end_to_end_on_the_simulator(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL)
    code = cli.main(["experiment", str(plan), "--out", str(tmp_path / "results"), "--run-id", "r1"])
    assert code == cli.EXIT_OK
    # interleaved (the simulator's default): both servers up at once, and Prometheus scraped both all along
    timeline = json.loads((tmp_path / "results" / "r1" / "timeline.json").read_text())
    rate = timeline["variants"]["ngram"]["series"]["Server acceptance rate"]
    assert rate and all(line["labels"]["variant"] == "ngram" for line in rate)
    for variant in ("baseline", "ngram"):
        assert timeline["variants"][variant]["series"]["TPOT p50 / p95 / p99 (server side)"], variant
    run = tmp_path / "results" / "r1"
    assert (run / "prometheus").is_dir()  # --no-prometheus leaves none: tests/test_report.py
    assert (run / "plan.yaml").read_text() == SMALL
    record = json.loads((run / "run.json").read_text())
    assert record["variants"] == ["baseline", "ngram"] and set(record["inputs_sha256"]) == {
        "plan.yaml", "inputs/code.jsonl", "inputs/chat.jsonl"}
    for name in ("baseline", "ngram"):
        v = run / "variants" / name
        for f in ("environment.json", "server-help.txt", "server.log", "metrics-before.prom", "metrics-after.prom",
                  "acceptance/code.jsonl", "acceptance/chat.jsonl", "perf/c1/summary.json", "perf/c3/summary.json",
                  "perf/c1/requests.jsonl", "reconciliation.json", "status.json"):
            assert (v / f).is_file(), f"{name}/{f}"
        status = json.loads((v / "status.json").read_text())
        assert status["state"] == "done" and status["ok"] and status["stopped"]["port_closed"]
        env = json.loads((v / "environment.json").read_text())
        assert env["server_version"] == "0.32.0" and env["num_gpu_blocks"] > 0
        assert "--host" not in env["argv"] and env["argv"][0] == "Qwen/Qwen3-8B"
        assert not port_open(int(env["url"].rsplit(":", 1)[1]))
        acceptance = _lines(v / "acceptance" / "code.jsonl")
        assert len(acceptance) == 3 and all(r["finish_reason"] in ("stop", "length") for r in acceptance)
        for c in (1, 3):
            summary = json.loads((v / f"perf/c{c}/summary.json").read_text())
            assert summary["config"]["concurrency"] == c and summary["config"]["ignore_eos"]
            assert all(t["requests"] == 3 and t["failures"] == 0 for t in summary["tasks"].values())
        fields = _spec_fields(v)
        # acceptance rows + perf (measured + Locust warm-up), and a round measured again where the machine was noisy
        # (`tests/test_recovery.py`): its block's one request per task once more
        again = sum(1 for b in status["blocks"] if "replaces" in b)
        assert len(fields) == 2 * 3 + 2 * 2 * (3 + 1) + 2 * again
        difference = snapshot.diff(snapshot.read(v / "metrics-before.prom"), snapshot.read(v / "metrics-after.prom"))
        if name == "baseline":
            assert all(f is None for f in fields) and difference.server is None
            continue
        assert all(f is not None for f in fields)
        present = [f for f in fields if f is not None]
        s = difference.server
        assert s is not None and s.draft_tokens > 0
        assert s.accepted == sum(f["num_accepted_draft_tokens"] for f in present)
        assert s.draft_tokens == sum(f["num_draft_tokens"] for f in present)
        assert s.steps == sum(f["num_spec_steps"] for f in present)
        assert list(s.per_position) == [sum(sum(f["acceptance_histogram"][p + 1:]) for f in present)
                                        for p in range(4)]
        assert json.loads((v / "reconciliation.json").read_text())["ok"]
    # greedy: every variant writes what the baseline writes
    texts = {n: [r["text"] for r in _lines(run / "variants" / n / "acceptance" / "code.jsonl")]
             for n in ("baseline", "ngram")}
    assert texts["baseline"] == texts["ngram"]


GAIN = f"""
name: gain
backend: {{kind: sim, args: ["--sim-time-scale", "1"]}}
model: Qwen/Qwen3-8B
tasks: {{code: article}}
warmup_requests: 1
acceptance: {{rows: 2, max_tokens: 32}}
performance: {{concurrencies: [1, 8], requests: 24, warmup: 1, max_tokens: 64, ignore_eos: true}}
design: sequential       # 24 requests per task in one block: at 8 the batch stays full (4 blocks of 6 would drain it)
variants:
  baseline: {{}}
  ngram:
    speculative_config: {NGRAM}
"""


@pytest.mark.servers
def test_on_the_simulator_the_gain_shrinks_from_concurrency_1_to_8_and_prometheus_records_the_run(
        tmp_path: Path) -> None:
    """The article's reading "faster at concurrency 1, less so at 8" through the whole runner with Locust, on the
    simulator's calibration; and the timeline the report plots.

    Two things make n-gram's TPOT gain on code smaller at 8: a k = 4 verify step costs 5.12 / 4.84 = 1.058 x a plain
    step at batch 1 but 5.63 / 5.19 = 1.085 x at batch 8 (../shared/reference/h200-step-times.md, context 512), and
    at 8 each new request's prefill (5.9 ms + 0.021 ms per prompt token) is a step every running stream waits for,
    which costs a 1.4 ms-per-token speculative stream far more than a 6 ms one. With 64-token outputs the prefills
    come often: three runs of this plan gave gain(8) / gain(1) = 0.836-0.882 (gain(1) 4.25-4.27). With 128-token
    outputs they come half as often and the code gain stayed flat (1.02 in one run; chat 0.96): the verify cost
    alone moves it by about 2.5 %, inside run-to-run noise.
    """
    plan = tmp_path / "plan.yaml"
    plan.write_text(GAIN)
    assert cli.main(["experiment", str(plan), "--out", str(tmp_path / "results"), "--run-id", "g"]) == cli.EXIT_OK
    run = results.load(tmp_path / "results" / "g")
    base, ngram = run.variant("baseline"), run.variant("ngram")
    assert base is not None and ngram is not None
    gain = {c: base.perf[c]["code"]["tpot_ms"]["p50"] / ngram.perf[c]["code"]["tpot_ms"]["p50"] for c in (1, 8)}
    assert gain[1] > 3 and gain[8] / gain[1] < 0.95, gain
    # Prometheus scraped both servers under their variant names; the key panels' queries came back
    timeline = run.timeline
    assert timeline is not None and set(timeline["variants"]) == {"baseline", "ngram"}
    assert [(q["dashboard"], q["panel"]) for q in timeline["queries"]] == list(key_queries.KEY_PANELS)
    for q, key in zip(timeline["queries"], key_queries.key_queries(), strict=True):
        assert [t["expr"] for t in q["targets"]] == [key_queries.substitute(e) for e, _ in key.exprs]
    series = {v: timeline["variants"][v]["series"] for v in ("baseline", "ngram")}
    rate = series["ngram"]["Server acceptance rate"]
    assert rate and all(line["labels"]["variant"] == "ngram" for line in rate)
    assert all(0 < value <= 1 for line in rate for _, value in line["points"])
    assert series["baseline"]["Server acceptance rate"] == []  # no drafts, no ratio (`> 0` on the denominator)
    for variant in ("baseline", "ngram"):
        tpot = series[variant]["TPOT p50 / p95 / p99 (server side)"]
        assert {line["labels"]["quantile"] for line in tpot} == {"0.5", "0.95", "0.99"}
        window = timeline["variants"][variant]["window"]
        assert all(0 <= t <= window[1] - window[0] + 11 for line in tpot for t, _ in line["points"])
    assert cli.main(["report", str(tmp_path / "results" / "g")]) == cli.EXIT_OK
    md = (tmp_path / "results" / "g" / "report" / "report.md").read_text()
    assert "## Dashboard queries over the run" in md and "![dashboard_queries](dashboard_queries.png)" in md
    assert "variant:vllm_spec_decode_acceptance_rate:ratio_rate1m{variant=~\".*\"}" in md


def test_a_prometheus_that_dies_does_not_stop_the_study(tmp_path: Path) -> None:
    """The timeline is an extra: when its Prometheus is gone, watching a server says so instead of raising."""
    timeline = Timeline(tmp_path / "prometheus", tmp_path / "timeline.json")
    timeline.start()
    assert timeline.server is not None and timeline.server.proc is not None
    os.killpg(timeline.server.proc.pid, signal.SIGKILL)
    timeline.server.proc.wait(10)
    started = time.monotonic()
    assert timeline.watch("ngram", "http://127.0.0.1:9") is False
    assert time.monotonic() - started < 5
    timeline.stop()
    assert not (tmp_path / "timeline.json").exists()


INTERRUPTIBLE = f"""
backend: {{kind: sim, args: ["--sim-time-scale", "0.3"]}}
model: Qwen/Qwen3-8B
tasks: {{chat: article}}
warmup_requests: 0
acceptance: {{rows: 2, max_tokens: 16}}
performance: {{concurrencies: [1], requests: 2, warmup: 0, max_tokens: 16}}
design: sequential       # the first variant finishes before the second starts
variants:
  first:
    speculative_config: {NGRAM}
  base: {{}}
  second:
    speculative_config: {{method: suffix, num_speculative_tokens: 8}}
"""


@pytest.mark.servers
def test_an_interrupted_run_resumes_without_redoing_a_finished_variant(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(INTERRUPTIBLE)
    out = tmp_path / "results"
    command = [sys.executable, "-m", "specwatch.cli", "experiment", str(plan), "--out", str(out), "--run-id", "r",
               "--no-prometheus"]
    first = out / "r" / "variants" / "first" / "status.json"
    base = out / "r" / "variants" / "base"
    # its own process group, interrupted as a terminal's Ctrl+C would be (Locust included)
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (first.exists() and (base / "server.log").exists()) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
            time.sleep(0.05)
        assert first.exists()
        time.sleep(1.0)  # the second variant's server is up (or starting): interrupt it mid-way
        os.killpg(proc.pid, signal.SIGINT)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-2000:]
    assert not (base / "status.json").exists()
    kept = first.read_text()
    kept_mtime = os.stat(first).st_mtime_ns
    log = (base / "server.log").read_text()
    port = int(log.split("--port ", 1)[1].split()[0])
    assert not port_open(port)  # the interrupted variant's server was stopped on the way out

    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "first: finished earlier, kept" in done.stderr
    assert first.read_text() == kept and os.stat(first).st_mtime_ns == kept_mtime
    for name in ("first", "base", "second"):
        assert json.loads((out / "r" / "variants" / name / "status.json").read_text())["state"] == "done"
    assert [p.name.rsplit("-", 2)[0] for p in (out / "r" / "interrupted").iterdir()] == ["base"]
    attempts = json.loads((out / "r" / "run.json").read_text())["attempts"]
    assert [a["resume"] for a in attempts] == [False, True] and "finished" in attempts[1]


@pytest.mark.servers
def test_an_interleaved_run_interrupted_mid_round_stops_every_server_and_resumes_them_all(tmp_path: Path) -> None:
    """Every server is up at once in an interleaved run: Ctrl+C in the second round stops them all and writes no
    status; --resume redoes every variant, in rounds of their own."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(INTERRUPTIBLE.replace("design: sequential", "design: interleaved\nmax_extra_rounds: 0")
                    .replace("requests: 2,", "requests: 4,"))  # the four rounds below, however noisy the machine
    out = tmp_path / "results"
    command = [sys.executable, "-m", "specwatch.cli", "experiment", str(plan), "--out", str(out), "--run-id", "r",
               "--no-prometheus"]
    variants = out / "r" / "variants"
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not list(variants.glob("*/perf/c1/rounds/r2")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[0].decode()[-2000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        output = proc.communicate(timeout=60)[0].decode()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output[-2000:]
    for name in ("first", "base", "second"):
        assert not (variants / name / "status.json").exists(), name
        log = (variants / name / "server.log").read_text()
        assert not port_open(int(log.split("--port ", 1)[1].split()[0])), name  # every server was stopped
    done = subprocess.run([*command, "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name.rsplit("-", 2)[0] for p in (out / "r" / "interrupted").iterdir()) == ["base", "first",
                                                                                                 "second"]
    for name in ("first", "base", "second"):
        status = json.loads((variants / name / "status.json").read_text())
        assert status["state"] == "done" and status["design"] == "interleaved"
        assert sorted(b["round"] for b in status["blocks"]) == [1, 2, 3, 4]
        rows = [json.loads(line) for line in (variants / name / "perf/c1/requests.jsonl").read_text().splitlines()]
        assert sorted(r["round"] for r in rows) == [1, 2, 3, 4]  # 4 requests: one per round, tagged


BRACKETED = f"""
backend: {{kind: sim, args: ["--sim-time-scale", "0.05"]}}
model: Qwen/Qwen3-8B
tasks: {{code: article}}
warmup_requests: 1
acceptance: {{rows: 2, max_tokens: 16}}
performance: {{concurrencies: [1], requests: 6, warmup: 0, max_tokens: 16}}
design: bracketed
rounds: 3
max_extra_rounds: 0     # the order below is the plan's alone: a noisy moment re-measures nothing here (test_recovery)
variants:
  baseline: {{}}
  ngram:
    speculative_config: {NGRAM}
"""


@pytest.mark.servers
def test_a_bracketed_run_starts_one_server_at_a_time_and_reconciles_every_lifetime(tmp_path: Path) -> None:
    """Bracketed: baseline, ngram | ngram, baseline | baseline, ngram, one server up at a time, kept up where the next
    block is its own: each lives twice (baseline: round 1, rounds 2-3; n-gram: rounds 1-2, round 3). Each lifetime
    has its own log and snapshots, and the reconciliation adds them up against every request sent."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(BRACKETED)
    assert cli.main(["experiment", str(plan), "--out", str(tmp_path / "results"), "--run-id", "b",
                     "--no-prometheus"]) == cli.EXIT_OK
    run = tmp_path / "results" / "b"
    spans = {}
    for name, lifetimes in (("baseline", 2), ("ngram", 2)):
        folder = run / "variants" / name
        status = json.loads((folder / "status.json").read_text())
        assert status["state"] == "done" and status["ok"] and status["design"] == "bracketed"
        recon = json.loads((folder / "reconciliation.json").read_text())
        assert recon["ok"] and recon["lifetimes"] == lifetimes, recon
        assert (folder / f"server-{lifetimes}.log").is_file() and not (folder / f"server-{lifetimes + 1}.log").exists()
        for n in range(1, lifetimes + 1):
            log = folder / ("server.log" if n == 1 else f"server-{n}.log")
            assert not port_open(int(log.read_text().split("--port ", 1)[1].split()[0])), (name, n)
        spans[name] = {b["round"]: (b["start"], b["end"]) for b in status["blocks"]}
    order = [name for _, name in sorted((spans[n][r][0], n) for n in spans for r in spans[n])]
    assert order == ["baseline", "ngram", "ngram", "baseline", "baseline", "ngram"], order
    # one block at a time: each ends before the next begins
    ordered = sorted(span for v in spans.values() for span in v.values())
    assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:], strict=False)), ordered
    loaded = results.load(run)
    ngram = loaded.variant("ngram")
    assert loaded.design == "bracketed" and loaded.rounds == 3 and ngram is not None and ngram.server is not None
    assert ngram.server.draft_tokens == json.loads((run / "variants/ngram/reconciliation.json").read_text())[
        "per_request"]["D"]  # every lifetime's counters, added up, against every request's fields
    assert cli.main(["report", str(run)]) == cli.EXIT_OK
    assert "**Design: bracketed, 3 rounds.**" in (run / "report" / "report.md").read_text()


def test_the_default_design_is_the_strongest_that_fits(tmp_path: Path) -> None:
    base = "model: m\ntasks: {code: article}\nperformance: {concurrencies: [2], requests: 8}\n"
    home = Home(tmp_path / "home")
    for backend, design, rounds in (("sim", "interleaved", 4), ("vllm_cpu", "interleaved", 4),
                                    ("process", "bracketed", 4), ("docker", "bracketed", 4)):
        plan = parse_plan(f"{base}backend: {backend}\nvariants: {{baseline: {{}}}}\n", tmp_path, home)
        assert (plan.design, plan.rounds) == (design, rounds), backend
    with pytest.raises(PlanError, match="design: interleaved does not fit this plan: .*baseline runs on docker"):
        parse_plan(f"{base}backend: docker\ndesign: interleaved\nvariants: {{baseline: {{}}}}\n", tmp_path, home)
    with pytest.raises(PlanError, match="rounds: a sequential design measures each variant in one block"):
        parse_plan(f"{base}design: sequential\nrounds: 2\nvariants: {{baseline: {{}}}}\n", tmp_path, home)
    with pytest.raises(PlanError, match="rounds: 9 rounds need at least as many requests per task"):
        parse_plan(f"{base}rounds: 9\nvariants: {{baseline: {{}}}}\n", tmp_path, home)


def test_run_folder_conflicts_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL)
    (tmp_path / "results" / "r").mkdir(parents=True)
    (tmp_path / "results" / "r" / "plan.yaml").write_text(SMALL.replace("small", "other"))
    args = ["experiment", str(plan), "--out", str(tmp_path / "results"), "--run-id", "r"]
    assert cli.main(args) == cli.EXIT_USAGE
    assert "already exists: pass --resume" in capsys.readouterr().err
    assert cli.main([*args, "--resume"]) == cli.EXIT_USAGE
    assert "differs from the plan given" in capsys.readouterr().err
    assert cli.main(["experiment", str(plan), "--resume"]) == cli.EXIT_USAGE
    assert cli.main(["experiment", str(tmp_path / "missing.yaml")]) == cli.EXIT_USAGE


BASE = """
model: Qwen/Qwen3-8B
tasks: {code: article}
variants: {baseline: {}}
"""


@pytest.mark.parametrize("change, message", [
    ({"acceptance": {"rowz": 3}}, "acceptance.rowz: unknown key; expected one of rows, max_tokens, concurrency"),
    ({"acceptance": {"rows": 0}}, "acceptance.rows: expected an integer >= 1, got int 0"),
    ({"performance": {"concurrencies": [1, 1]}}, "performance.concurrencies: expected a list of distinct integers"),
    ({"backend": "kubernetes"}, "backend.kind: expected one of vllm_cpu, sim, process, docker"),
    ({"backend": {"kind": "docker", "gpus": 2}}, "backend.gpus: expected \"all\" or a list of device ids"),
    ({"tasks": {"code": "nope.jsonl"}}, "tasks.code: no JSONL file at"),
    ({"tasks": {"qa": "article"}}, "tasks.qa: the article's built-in sets are code, chat"),
    ({"tasks": []}, "tasks: expected a mapping of task name"),
    ({"lang": "fr"}, "lang: expected one of en, zh"),
    ({"server": {"args": "--seed 1"}}, "server.args: expected a list of strings"),
    ({"variants": {"b": {"model": "other"}, "ngram": {"speculative_config": {"method": "ngram"}}}},
     "variants.ngram.baseline: ngram serves Qwen/Qwen3-8B, and no variant without speculative_config"),
    ({"variants": {"baseline": {}, "x": {"speculative_config": "ngram"}}},
     "variants.x.speculative_config: expected a mapping"),
    ({"variants": {"baseline": {}, "x": {"speculative_config": {"num_speculative_tokens": 2}}}},
     "variants.x.speculative_config.method: expected a method name"),
    ({"variants": {"baseline": {}, "mtp": {"model": "XiaomiMiMo/MiMo-7B-Base", "baseline": "baseline",
                                           "speculative_config": {"method": "mtp"}}}},
     "variants.mtp.baseline: 'baseline' serves Qwen/Qwen3-8B, mtp serves XiaomiMiMo/MiMo-7B-Base"),
    ({"variants": {"a/b": {}}}, "variants.a/b: a variant name is letters"),
    ({"colour": "blue"}, "plan.colour: unknown key"),
])
def test_plan_errors_name_the_key_and_what_was_expected(change: dict[str, Any], message: str, tmp_path: Path) -> None:
    import yaml
    raw = yaml.safe_load(BASE)
    raw.update(change)
    with pytest.raises(PlanError) as caught:
        parse_plan(yaml.safe_dump(raw), tmp_path, Home(tmp_path))
    assert message in str(caught.value)


def test_a_bad_plan_exits_2_with_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(BASE.replace("variants: {baseline: {}}", "variants: {baseline: {args: 3}}"))
    assert cli.main(["experiment", str(plan)]) == cli.EXIT_USAGE
    assert "variants.baseline.args: expected a list of strings" in capsys.readouterr().err


def test_plans_resolve_models_baselines_and_argv(tmp_path: Path) -> None:
    text = """
model: "{models}/target"
served_model_name: demo
server: {enforce_eager: false, dtype: bfloat16, args: ["--gpu-memory-utilization", "0.85"]}
tasks: {code: article, mine: data.jsonl}
variants:
  baseline: {}
  draft: {speculative_config: {method: draft_model, model: "{models}/draft"}}
  mimo-baseline: {model: XiaomiMiMo/MiMo-7B-Base}
  mtp: {model: XiaomiMiMo/MiMo-7B-Base, speculative_config: {method: mtp, num_speculative_tokens: 1}}
"""
    (tmp_path / "data.jsonl").write_text('{"prompt": "hi"}\n')
    plan = parse_plan(text, tmp_path, Home(tmp_path / "home"))
    assert plan.model == str(tmp_path / "home" / "models" / "target")
    assert plan.variant("draft").speculative_config == {"method": "draft_model",
                                                        "model": str(tmp_path / "home" / "models" / "draft")}
    assert [(v.name, v.baseline) for v in plan.variants] == [
        ("baseline", None), ("draft", "baseline"), ("mimo-baseline", None), ("mtp", "mimo-baseline")]
    assert plan.tasks[1].path == tmp_path / "data.jsonl"
    argv = variant_args(plan, plan.variant("mtp"))
    assert argv[0] == "XiaomiMiMo/MiMo-7B-Base" and "--host" not in argv and "--port" not in argv
    assert "--enforce-eager" not in argv and argv[argv.index("--served-model-name") + 1] == "demo"
    assert argv[argv.index("--dtype") + 1] == "bfloat16" and argv[-2:] == ["--gpu-memory-utilization", "0.85"]
    assert argv[argv.index("--per-request-spec-decode-metrics") + 1] == "detailed"


def test_variant_args_drop_serve_argvs_host_and_port_by_name_wherever_they_are(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from specwatch.experiment import runner

    serve_argv = runner.serve_argv

    def shuffled_serve_argv(model: str, **kwargs: Any) -> list[str]:
        # host and port after the common flags, one of them in the `--flag=value` form
        argv = serve_argv(model, **kwargs)
        at = argv.index("--host")
        rest = argv[:at] + argv[at + 4:]
        return [*rest[:4], "--port", "8000", *rest[4:], "--host=127.0.0.1"]

    monkeypatch.setattr(runner, "serve_argv", shuffled_serve_argv)
    text = """
model: m
server: {enforce_eager: true, args: ["--max-num-seqs", "4"]}
tasks: {code: article}
variants:
  baseline: {}
"""
    plan = parse_plan(text, tmp_path, Home(tmp_path / "home"))
    argv = variant_args(plan, plan.variant("baseline"))
    assert argv[0] == "m" and "--enforce-eager" in argv
    assert not [a for a in argv if a.split("=")[0] in ("--host", "--port")], argv
    assert "127.0.0.1" not in argv and "8000" not in argv and argv[-2:] == ["--max-num-seqs", "4"]


def test_a_plan_above_16_streams_gets_a_batch_that_holds_them_unless_it_sets_its_own(tmp_path: Path) -> None:
    """serve_argv caps the batch at 16; a performance pass at 32 would measure a queue, not a batch of 32."""
    def last_max_num_seqs(text: str, variant: str = "baseline") -> str:
        plan = parse_plan(text, tmp_path, Home(tmp_path / "home"))
        argv = variant_args(plan, plan.variant(variant))
        flags = [a for a in argv if a.split("=")[0] == "--max-num-seqs"]
        assert len(flags) == 1, argv  # one batch size, not serve_argv's 16 overridden by a later flag
        return argv[len(argv) - 1 - argv[::-1].index("--max-num-seqs") + 1]

    base = "model: m\ntasks: {code: article}\nperformance: {concurrencies: [1, 32]}\n"
    assert last_max_num_seqs(base + "variants:\n  baseline: {}\n") == "32"
    assert last_max_num_seqs(base.replace("[1, 32]", "[1, 8]") + "variants:\n  baseline: {}\n") == "16"
    assert last_max_num_seqs(base + "server: {args: [--max-num-seqs, '24']}\nvariants:\n  baseline: {}\n") == "24"
    assert last_max_num_seqs(base + "variants:\n  baseline: {}\n  ngram: {args: ['--max-num-seqs=8']}\n",
                             "baseline") == "32"
    plan = parse_plan(base + "variants:\n  baseline: {}\n  ngram: {args: ['--max-num-seqs=8']}\n", tmp_path,
                      Home(tmp_path / "home"))
    assert variant_args(plan, plan.variant("ngram"))[-1] == "--max-num-seqs=8"


def test_the_example_plans_parse(tmp_path: Path) -> None:
    for name in ("cpu-study.yaml", "article-sim.yaml"):
        path = REPO / "examples" / "plans" / name
        plan = parse_plan(path.read_text(), path.parent, Home(tmp_path))
        assert plan.variants[0].speculative_config is None
