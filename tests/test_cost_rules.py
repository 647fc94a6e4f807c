"""The step-cost rule file: what `render_cost_rules` writes, what it refuses, and that, loaded beside the generated
recording rules, it gives the expected tokens per step by k and the best k at the running batch size (promtool)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from specwatch import resources
from specwatch.monitoring import MONITORING
from specwatch.promconfig import rules
from specwatch.promconfig.cost_rules import StepCost, batch_ranges, render_cost_rules, write_cost_rules

C = MONITORING.cost_table
SLOW = MONITORING.slow.duration


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("no promtool on PATH: `make prometheus` installs Debian's prometheus package")
    return found


def _rules(text: str) -> list[dict[str, Any]]:
    doc = yaml.safe_load(text)
    assert [g["name"] for g in doc["groups"]] == ["specwatch.cost_table"]
    return list(doc["groups"][0]["rules"])


def _value(rule: dict[str, Any]) -> float:
    expr = str(rule["expr"])
    assert expr.startswith("vector(") and expr.endswith(")"), expr
    return float(expr[len("vector("):-1].replace("+Inf", "inf"))


TABLE = [StepCost("ngram", 1, 0, 0.0123), StepCost("ngram", 1, 3, 0.0151), StepCost("ngram", 8, 0, 0.02),
         StepCost("ngram", 8, 3, 0.031), StepCost("ngram", 64, 3, 1e-05), StepCost("eagle3-x", 4, 2, 0.25)]


def test_every_step_cost_becomes_exactly_one_series() -> None:
    parsed = _rules(render_cost_rules(TABLE))
    costs = [r for r in parsed if r["record"] == C.step_cost]
    assert sorted((r["labels"]["variant"], int(r["labels"]["batch_size"]), int(r["labels"]["k"]), _value(r))
                  for r in costs) == sorted((c.variant, c.batch_size, c.k, c.seconds) for c in TABLE)
    assert all(set(r["labels"]) == {"variant", "batch_size", "k"} for r in costs)
    assert all(isinstance(v, str) for r in parsed for v in r["labels"].values())
    # one lower and one upper bound per variant and measured batch size, and nothing else
    bounds = {(r["record"], r["labels"]["variant"], r["labels"]["batch_size"]): _value(r)
              for r in parsed if r["record"] != C.step_cost}
    assert len(bounds) == len(parsed) - len(costs) == 2 * 4
    assert {(v, b): (bounds[(C.batch_lower, v, b)], bounds[(C.batch_upper, v, b)])
            for _, v, b in bounds} == {("ngram", "1"): (0, 1), ("ngram", "8"): (1, 8),
                                       ("ngram", "64"): (8, math.inf), ("eagle3-x", "4"): (0, math.inf)}


def test_batch_ranges_round_a_running_batch_up_to_the_next_measured_size() -> None:
    ranges = batch_ranges(TABLE)

    def row(variant: str, running: float) -> int:
        [size] = [b for (v, b), (lo, hi) in ranges.items() if v == variant and lo < running <= hi]
        return size

    assert [row("ngram", b) for b in (0.2, 1, 1.5, 8, 9, 64, 500)] == [1, 1, 8, 8, 64, 64, 64]
    assert row("eagle3-x", 100) == 4


def test_the_rendering_is_deterministic_and_passes_promtool(promtool: str, tmp_path: Path) -> None:
    assert render_cost_rules(TABLE) == render_cost_rules(list(reversed(TABLE)))
    path = tmp_path / "specwatch-cost.yml"
    write_cost_rules(TABLE, path)
    assert path.read_text() == render_cost_rules(TABLE)
    assert [p.name for p in tmp_path.iterdir()] == ["specwatch-cost.yml"]  # no temporary file left
    checked = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(TABLE) + 8} rules found" in checked.stdout


@pytest.mark.parametrize(("costs", "message"), [
    ([], "no step costs"),
    ([StepCost("Ngram", 1, 0, 0.01)], "variant 'Ngram' is not a variant name"),
    ([StepCost('a"b', 1, 0, 0.01)], "variant 'a\"b' is not a variant name"),
    ([StepCost("x" * 33, 1, 0, 0.01)], "is not a variant name"),
    ([StepCost("ngram", 0, 0, 0.01)], "batch_size must be a whole number >= 1, got 0"),
    ([StepCost("ngram", 1.5, 0, 0.01)], "batch_size must be a whole number >= 1, got 1.5"),  # type: ignore[arg-type]
    ([StepCost("ngram", True, 0, 0.01)], "batch_size must be a whole number >= 1, got True"),
    ([StepCost("ngram", 1, -1, 0.01)], f"k must be a whole number from 0 to {MONITORING.max_expected_k}"),
    ([StepCost("ngram", 1, MONITORING.max_expected_k + 1, 0.01)], "max_expected_k in specwatch.monitoring"),
    ([StepCost("ngram", 1, 0, 0.0)], "seconds must be a finite number > 0, got 0.0"),
    ([StepCost("ngram", 1, 0, -0.01)], "seconds must be a finite number > 0, got -0.01"),
    ([StepCost("ngram", 1, 0, math.nan)], "seconds must be a finite number > 0, got nan"),
    ([StepCost("ngram", 1, 0, math.inf)], "seconds must be a finite number > 0, got inf"),
    ([StepCost("ngram", 1, 0, "0.01")], "seconds must be a finite number > 0, got '0.01'"),  # type: ignore[arg-type]
    ([StepCost("ngram", 1, 0, 0.01), StepCost("ngram", 1, 0, 0.02)],
     "a second cost for variant 'ngram', batch_size 1, k 0"),
])
def test_bad_input_is_refused_naming_the_entry(costs: list[StepCost], message: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="^" + (r"StepCost\(.*\): " if costs else "") + ".*" + re.escape(message)):
        render_cost_rules(costs)
    with pytest.raises(ValueError):
        write_cost_rules(costs, tmp_path / "cost.yml")
    assert not (tmp_path / "cost.yml").exists()


# -- loaded beside the generated rules: expected tokens by k and the best k, on promtool -----------------------

# Per minute, with one verify step a second: 'code' drafts on every decode step and accepts position p with
# probability 0.8, 0.6, 0.4, 0.2 (E[tokens | k] = 1, 1.8, 2.4, 2.8, 3.0); 'chat' drafts on half of its decode
# steps and accepts 0.5, 0.25, 0.1, 0.05 (tokens per decode step 1, 1.25, 1.375, 1.425, 1.45). The deployment
# drafts k = 4: there is no position 4, so no k = 5 however cheap the table says it is.
PER_POS = {"code": (48, 36, 24, 12), "chat": (30, 15, 6, 3)}
DECODE = {"code": 60, "chat": 120}
EXPECTED_TOKENS = {"code": (1, 1.8, 2.4, 2.8, 3.0), "chat": (1, 1.5, 1.75, 1.85, 1.9)}
# batch 1: verification nearly free; batch 64: each drafted token costs a fifth of a step or more
COST = [*(StepCost("candidate", 1, k, s) for k, s in enumerate((0.010, 0.0105, 0.011, 0.0115, 0.012, 0.001))),
        *(StepCost("candidate", 64, k, s) for k, s in enumerate((0.020, 0.032, 0.045, 0.060, 0.075)))]
# two engines: 1 + 1 running for 12 minutes (per engine 1: the batch-1 row; their sum, 2, would be the 64 row),
# then 60 + 68 (per engine 64)
RUNNING = {"0": "1+0x12 60+0x12", "1": "1+0x12 68+0x12"}
# tokens per decode step / cost: at batch 1 code 100, 171, 218, 243, 250 (k = 4) and chat 100, 119, 125 (k = 2),
# 124, 121; at batch 64 code 50, 56.3 (k = 1), 53, 47, 40 and chat 50 (k = 0), 39, 31, 24, 19
BEST_K = {10: {"code": 4, "chat": 2}, 20: {"code": 1, "chat": 0}}


def _input_series() -> list[dict[str, str]]:
    out = []
    for task, slopes in PER_POS.items():
        base = f'job="{MONITORING.jobs.exporter}",variant="candidate",task="{task}"'
        out.append({"series": f"{MONITORING.exporter.spec_steps}{{{base}}}", "values": "0+60x24"})
        out.append({"series": f"{MONITORING.exporter.decode_steps}{{{base}}}", "values": f"0+{DECODE[task]}x24"})
        out += [{"series": f'{MONITORING.exporter.accepted_per_pos}{{{base},position="{p}"}}', "values": f"0+{s}x24"}
                for p, s in enumerate(slopes)]
    out += [{"series": f'{MONITORING.vllm.running}{{job="{MONITORING.jobs.vllm}",variant="candidate",engine="{e}"}}',
             "values": values} for e, values in RUNNING.items()]
    return out


def _round(expr: str) -> str:
    return f"round({expr}, 0.0001)"


def test_loaded_beside_the_generated_rules_it_gives_the_best_k_per_batch_size(promtool: str, tmp_path: Path) -> None:
    write_cost_rules(COST, tmp_path / "specwatch-cost.yml")
    expected = rules.expected_tokens_record(SLOW)
    best = rules.best_k_record(SLOW)
    cases: list[dict[str, Any]] = [
        {"expr": _round(f'{expected}{{task="{task}"}}'), "eval_time": "10m",
         "exp_samples": [{"labels": f'{{k="{k}",task="{task}",variant="candidate"}}', "value": round(v, 4)}
                         for k, v in enumerate(values)]}
        for task, values in EXPECTED_TOKENS.items()]
    cases += [{"expr": f'{expected}{{k="5"}}', "eval_time": "10m", "exp_samples": []},
              {"expr": _round(f"variant:vllm_num_requests_running:avg_over_time{SLOW}"), "eval_time": "10m",
               "exp_samples": [{"labels": '{variant="candidate"}', "value": 1}]},
              {"expr": _round(f"variant:vllm_num_requests_running:avg_over_time{SLOW}"), "eval_time": "20m",
               "exp_samples": [{"labels": '{variant="candidate"}', "value": 64}]}]
    cases += [{"expr": _round(best), "eval_time": f"{minute}m",
               "exp_samples": [{"labels": f'{{task="{task}",variant="candidate"}}', "value": k}
                               for task, k in sorted(by_task.items())]}
              for minute, by_task in BEST_K.items()]
    (tmp_path / "best-k.test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(resources.RULES / rules.RULES_FILE), "specwatch-cost.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _input_series(), "promql_expr_test": cases}]}, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", "best-k.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_without_a_cost_table_there_is_no_best_k(promtool: str, tmp_path: Path) -> None:
    """The generated rules alone: expected tokens per step by k, and no best k (the panel says no table)."""
    (tmp_path / "no-table.test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(resources.RULES / rules.RULES_FILE)], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _input_series(), "promql_expr_test": [
            {"expr": f'count({rules.expected_tokens_record(SLOW)})', "eval_time": "10m",
             "exp_samples": [{"labels": "{}", "value": 10}]},
            {"expr": rules.best_k_record(SLOW), "eval_time": "10m", "exp_samples": []}]}]}))
    done = subprocess.run([promtool, "test", "rules", "no-table.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
