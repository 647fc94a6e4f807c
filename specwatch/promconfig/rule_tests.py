"""promtool unit tests for every recording rule, from a scenario whose answers are known by arithmetic.

The scenario is two vLLM variants (the candidate on two engines, so sums across engines are
exercised) and the exporter's per-task counters, all growing linearly, so every rate is its
slope and every expected figure follows from the slopes with plain fractions here, never from
running the rules. The candidate restarts at 7m15s (its counters drop to 0): the 5m window
evaluated at 10m spans that reset, and there only the ratios are checked, which must not move.
Values are compared after `round(x, 2^-20)`, which Prometheus and this module compute with
the same IEEE operations, so the check is exact without depending on the order of float sums.

`specwatch/data/prometheus/tests/recording.test.yml` is written from here next to the rules it tests.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from specwatch import resources
from specwatch.exporter.labels import OUTCOMES
from specwatch.files import write_or_check
from specwatch.monitoring import MONITORING as S
from specwatch.promconfig import rules as R
from specwatch.promconfig.cost_rules import StepCost, batch_ranges

INTERVAL_S = 15
STEPS = 40                 # samples 0..40: ten minutes
RESET_STEP = 29            # the candidate's counters start again from 0 at this sample (7m15s)
ROUND_TO = 2.0 ** -20      # written as the exact decimal below; a power of two keeps round() exact
ROUND_TO_TEXT = "0.00000095367431640625"
FAST, SLOW = S.fast.duration, S.slow.duration
EVALS = ((300, FAST), (300, SLOW), (600, FAST), (600, SLOW))  # (seconds, window)
RESET_SPANNED = {(600, SLOW)}

Labels = tuple[tuple[str, str], ...]


def _labels(**kw: str) -> Labels:
    return tuple(sorted(kw.items()))


# --- the scenario (counter slopes per 15 s sample interval) -------------------------------------

@dataclass(frozen=True)
class SpecCounters:
    """The speculative-decoding counter slopes vLLM (per engine) and the exporter (per variant and task) both keep."""

    steps: int  # verify steps that carried a draft (vLLM's num_drafts)
    draft_tokens: int
    accepted: int
    per_pos: tuple[int, ...]


@dataclass(frozen=True)
class EngineCounters(SpecCounters):
    """One vLLM engine's counter slopes and gauge values."""

    generation: int
    success: dict[str, int]
    preemptions: int
    kv: float
    running: int
    waiting: int


@dataclass(frozen=True)
class TaskCounters(SpecCounters):
    """The exporter's counter slopes for one variant and task."""

    by_accepted: tuple[int, ...]
    decode: int
    completion: int
    requests: dict[str, int]
    missing: int
    mirror: tuple[int, int] | None  # identical, different
    reaching: tuple[int, ...] | None = None  # detailed mode: steps whose draft reached each position
    without_per_step: int = 0  # steps of requests that came without per-step data (summary mode)


VLLM_ENGINES = {  # (variant, engine)
    ("baseline", "0"): EngineCounters(20, 80, 40, (16, 12, 8, 4), 240, {"length": 2, "stop": 1}, 0, 0.5, 4, 0),
    ("candidate", "0"): EngineCounters(30, 90, 50, (22, 16, 12), 200, {"length": 1, "stop": 1}, 3, 0.25, 2, 1),
    ("candidate", "1"): EngineCounters(15, 45, 25, (11, 8, 6), 100, {"length": 1}, 0, 0.75, 1, 0),
}
VLLM_HIST_BOUNDS = {S.vllm.ttft: (0.05, 0.1, 0.2, 0.5), S.vllm.tpot: (0.01, 0.02, 0.05, 0.1),
                    S.vllm.itl: (0.005, 0.01, 0.02, 0.05), S.vllm.e2e: (1.0, 2.0, 5.0, 10.0)}
VLLM_HIST_COUNTS = {("baseline", "0"): ((20, 50, 90, 99, 100), 30),
                    ("candidate", "0"): ((10, 20, 40, 50, 50), 12),
                    ("candidate", "1"): ((0, 10, 30, 48, 50), 20)}

# reaching: candidate code runs detailed (a ratio per position); baseline code's per-step data covers 10 of its 12
# steps (a window that mixes modes: no ratio); the others run summary (no reach, every step without per-step data)
EXPORTER = {  # (variant, task); per_pos and by_accepted agree with each other and with accepted
    ("baseline", "code"): TaskCounters(12, 48, 30, (10, 8, 7, 5), (2, 2, 1, 2, 5), 50, 84, {"ok": 4}, 0, None,
                                       (10, 9, 8, 6), 2),
    ("baseline", "chat"): TaskCounters(8, 32, 10, (5, 3, 1, 1), (3, 2, 2, 0, 1), 70, 84,
                                       {"ok": 4, "bad_response": 1}, 0, None, None, 8),
    ("candidate", "code"): TaskCounters(30, 90, 60, (24, 20, 16), (6, 4, 4, 16), 40, 104,
                                        {"ok": 4, "upstream_error": 1, "client_abort": 1}, 0, (3, 1), (30, 26, 20)),
    ("candidate", "chat"): TaskCounters(15, 45, 15, (9, 4, 2), (6, 5, 2, 2), 60, 79, {"ok": 4}, 1, (2, 2), None, 15),
}
EXPORTER_HIST_BOUNDS = {S.exporter.ttft: (0.05, 0.1, 0.2, 0.5), S.exporter.tpot: (0.01, 0.02, 0.05, 0.1),
                        S.exporter.itl: (0.005, 0.01, 0.02, 0.05), S.exporter.e2e: (1.0, 2.0, 5.0, 10.0)}
EXPORTER_HIST_COUNTS = {("baseline", "code"): ((10, 30, 36, 40, 40), 16),
                        ("baseline", "chat"): ((0, 8, 30, 39, 40), 24),
                        ("candidate", "code"): ((20, 30, 35, 38, 40), 10),
                        ("candidate", "chat"): ((2, 4, 20, 30, 40), 40)}

# A step-cost table as `specwatch tune` writes it, planted as its constant series. The candidate runs 1.5
# requests per engine (its row: batch size 2), the baseline 4 (its row: 8). At the candidate's row k = 4 is the
# cheapest, but the candidate drafts 3 positions, so k = 4 has no expected tokens and must not win; the other
# rows are cheap where a wrong row would change the answer.
COST_TABLE = (
    *(StepCost("candidate", 1, k, s) for k, s in enumerate((0.01, 0.001, 0.001, 0.001))),
    *(StepCost("candidate", 2, k, s) for k, s in enumerate((0.01, 0.011, 0.012, 0.013, 0.001))),
    *(StepCost("candidate", 16, k, s) for k, s in enumerate((0.01, 0.1, 0.1, 0.1))),
    *(StepCost("baseline", 1, k, s) for k, s in enumerate((0.01, 0.011, 0.011, 0.011, 0.011))),
    *(StepCost("baseline", 8, k, s) for k, s in enumerate((0.02, 0.03, 0.04, 0.05, 0.06))),
    StepCost("baseline", 64, 0, 0.5), StepCost("baseline", 64, 4, 0.001),
)


def _resets(variant: str) -> bool:
    return variant == S.candidate


def _le(bound: float) -> str:
    return repr(bound)


# --- input series --------------------------------------------------------------------------------

def _counter_values(slope: int, resets: bool) -> str:
    if resets:
        return f"0+{slope}x{RESET_STEP - 1} 0+{slope}x{STEPS - RESET_STEP}"
    return f"0+{slope}x{STEPS}"


def _series(name: str, labels: dict[str, str]) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{body}}}"


def input_series() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []

    def counter(name: str, labels: dict[str, str], slope: int, resets: bool) -> None:
        out.append((_series(name, labels), _counter_values(slope, resets)))

    def histograms(families: Mapping[str, tuple[float, ...]], counts: tuple[tuple[int, ...], int],
                   labels: dict[str, str], resets: bool) -> None:
        """Bucket, count and sum series of each histogram family: `counts` is (cumulative bucket slopes, sum slope)."""
        cumulative, sum_slope = counts
        for metric, bounds in families.items():
            for bound, n in zip((*map(_le, bounds), "+Inf"), cumulative, strict=True):
                counter(f"{metric}_bucket", {**labels, "le": bound}, n, resets)
            counter(f"{metric}_count", labels, cumulative[-1], resets)
            counter(f"{metric}_sum", labels, sum_slope, resets)

    for (variant, engine), c in VLLM_ENGINES.items():
        base = {"job": S.jobs.vllm, "variant": variant, "model_name": "spec-demo", "engine": engine}
        rs = _resets(variant)
        counter("vllm:spec_decode_num_drafts_total", base, c.steps, rs)
        counter("vllm:spec_decode_num_draft_tokens_total", base, c.draft_tokens, rs)
        counter("vllm:spec_decode_num_accepted_tokens_total", base, c.accepted, rs)
        for p, slope in enumerate(c.per_pos):
            counter("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**base, "position": str(p)}, slope, rs)
        counter("vllm:generation_tokens_total", base, c.generation, rs)
        for reason, slope in c.success.items():
            counter("vllm:request_success_total", {**base, "finished_reason": reason}, slope, rs)
        counter("vllm:num_preemptions_total", base, c.preemptions, rs)
        histograms(VLLM_HIST_BOUNDS, VLLM_HIST_COUNTS[(variant, engine)], base, rs)
        for name, value in (("vllm:kv_cache_usage_perc", c.kv), ("vllm:num_requests_running", c.running),
                            ("vllm:num_requests_waiting", c.waiting)):
            out.append((_series(name, base), f"{value}+0x{STEPS}"))

    for (variant, task), e in EXPORTER.items():
        base = {"job": S.jobs.exporter, "variant": variant, "task": task}
        rs = _resets(variant)
        counter("specwatch_spec_steps_total", base, e.steps, rs)
        counter("specwatch_spec_steps_without_per_step_total", base, e.without_per_step, rs)
        counter("specwatch_draft_tokens_total", base, e.draft_tokens, rs)
        counter("specwatch_accepted_tokens_total", base, e.accepted, rs)
        for p, slope in enumerate(e.per_pos):
            counter("specwatch_accepted_tokens_per_pos_total", {**base, "position": str(p)}, slope, rs)
        for p, slope in enumerate(e.reaching or ()):
            counter("specwatch_drafts_reaching_pos_total", {**base, "position": str(p)}, slope, rs)
        for a, slope in enumerate(e.by_accepted):
            counter("specwatch_spec_steps_by_accepted_total", {**base, "accepted": str(a)}, slope, rs)
        counter("specwatch_decode_steps_total", base, e.decode, rs)
        counter("specwatch_completion_tokens_total", base, e.completion, rs)
        for outcome in OUTCOMES:
            counter("specwatch_requests_total", {**base, "outcome": outcome}, e.requests.get(outcome, 0), rs)
        counter("specwatch_spec_metrics_missing_total", base, e.missing, rs)
        if e.mirror is not None:
            for result, slope in zip(("identical", "different"), e.mirror, strict=True):
                counter("specwatch_mirror_outputs_total", {**base, "result": result}, slope, rs)
        histograms(EXPORTER_HIST_BOUNDS, EXPORTER_HIST_COUNTS[(variant, task)], base, rs)

    def constant(name: str, labels: dict[str, str], value: float) -> None:
        out.append((_series(name, labels), f"{'+Inf' if value == math.inf else repr(value)}+0x{STEPS}"))

    table = S.cost_table
    for cost in COST_TABLE:
        constant(table.step_cost, {"variant": cost.variant, "batch_size": str(cost.batch_size), "k": str(cost.k)},
                 cost.seconds)
    for (variant, size), (lower, upper) in batch_ranges(COST_TABLE).items():
        constant(table.batch_lower, {"variant": variant, "batch_size": str(size)}, lower)
        constant(table.batch_upper, {"variant": variant, "batch_size": str(size)}, upper)
    return out


# --- the oracle: expected samples by arithmetic on the slopes -------------------------------------

Expected = dict[Labels, Fraction]


def _per_s(slope: int) -> Fraction:
    return Fraction(slope, INTERVAL_S)


def _quantile(q: Fraction, bounds: tuple[float, ...], cumulative: tuple[int, ...]) -> Fraction:
    """histogram_quantile's linear interpolation inside the bucket that holds rank q * count."""
    rank = q * cumulative[-1]
    i = next(j for j, n in enumerate(cumulative) if n >= rank)
    n = cumulative[i]
    if i == len(bounds):          # the +Inf bucket: the highest finite bound
        return Fraction(bounds[-1])
    start = Fraction(0) if i == 0 else Fraction(bounds[i - 1])
    below = 0 if i == 0 else cumulative[i - 1]
    return start + (Fraction(bounds[i]) - start) * (rank - below) / (n - below)


def _ratio(num: Expected, den: Expected, keep: Callable[[Labels], Labels] = lambda k: k) -> Expected:
    return {k: v / den[keep(k)] for k, v in num.items() if den.get(keep(k), 0) > 0}


def _drop(label: str) -> Callable[[Labels], Labels]:
    return lambda k: tuple(kv for kv in k if kv[0] != label)


def _conditional(per_pos: Expected, steps: Expected) -> Expected:
    out: Expected = {}
    for k, v in per_pos.items():
        d = dict(k)
        p = int(d["position"])
        if p == 0:
            if steps.get(_drop("position")(k), 0) > 0:
                out[k] = v / steps[_drop("position")(k)]
            continue
        prev = per_pos.get(tuple(sorted({**d, "position": str(p - 1)}.items())), Fraction(0))
        if prev > 0 and p <= S.max_conditional_position:
            out[k] = v / prev
    return out


class Oracle:
    """Per-second rates of every input counter, summed to each level, and the figures built on them."""

    def __init__(self) -> None:
        self.v: dict[str, Expected] = {}
        self.vt: dict[str, Expected] = {}
        for (variant, _engine), c in VLLM_ENGINES.items():
            k = _labels(variant=variant)
            self._add(self.v, "drafts", k, c.steps)
            for key in ("draft_tokens", "accepted", "generation", "preemptions"):
                self._add(self.v, key, k, getattr(c, key))
            self._add(self.v, "success", k, sum(c.success.values()))
            for p, s in enumerate(c.per_pos):
                self._add(self.v, "per_pos", _labels(variant=variant, position=str(p)), s)
        for (variant, task), e in EXPORTER.items():
            k = _labels(variant=variant, task=task)
            for key in ("steps", "draft_tokens", "accepted", "decode", "completion", "missing", "without_per_step"):
                self._add(self.vt, key, k, getattr(e, key))
            self._add(self.vt, "requests", k, sum(e.requests.values()))
            self._add(self.vt, "ok", k, e.requests.get("ok", 0))
            self._add(self.vt, "errors", k, sum(e.requests.get(o, 0) for o in S.error_outcomes))
            self._add(self.vt, "e2e_sum", k, EXPORTER_HIST_COUNTS[(variant, task)][1])
            for p, s in enumerate(e.per_pos):
                self._add(self.vt, "per_pos", _labels(variant=variant, task=task, position=str(p)), s)
            for a, s in enumerate(e.by_accepted):
                self._add(self.vt, "by_accepted", _labels(variant=variant, task=task, accepted=str(a)), s)
            for p, s in enumerate(e.reaching or ()):
                self._add(self.vt, "reaching", _labels(variant=variant, task=task, position=str(p)), s)
            if e.mirror is not None:
                self._add(self.vt, "identical", k, e.mirror[0])
                self._add(self.vt, "mirrored", k, sum(e.mirror))

    @staticmethod
    def _add(into: dict[str, Expected], key: str, labels: Labels, slope: int) -> None:
        series = into.setdefault(key, {})
        series[labels] = series.get(labels, Fraction(0)) + _per_s(slope)

    def acceptance(self, level: dict[str, Expected], steps_key: str) -> dict[str, Expected]:
        steps = level[steps_key]
        return {
            "acceptance_rate": _ratio(level["accepted"], level["draft_tokens"]),
            "mean_acceptance_length": {k: 1 + v for k, v in _ratio(level["accepted"], steps).items()},
            "acceptance_unconditional": _ratio(level["per_pos"], steps, _drop("position")),
            "acceptance_conditional": _conditional(level["per_pos"], steps),
        }

    def latency(self, counts: dict[tuple[str, ...], tuple[tuple[int, ...], int]],
                bounds: tuple[float, ...], key: Callable[[tuple[str, ...]], Labels]) -> dict[str, Expected]:
        summed: dict[Labels, tuple[list[int], int]] = {}
        for series, (cumulative, sum_slope) in counts.items():
            k = key(series)
            acc, total = summed.get(k, ([0] * len(cumulative), 0))
            summed[k] = ([a + b for a, b in zip(acc, cumulative, strict=True)], total + sum_slope)
        out: dict[str, Expected] = {}
        for q in S.quantiles:
            out[q] = {tuple(sorted(k + (("quantile", q),))): _quantile(Fraction(q), bounds, tuple(c))
                      for k, (c, _) in summed.items()}
        out["mean"] = {k: Fraction(s, c[-1]) for k, (c, s) in summed.items()}
        return out


def expected_by_record(window: str) -> dict[str, Expected]:
    """What each recording rule of `window` must return in the scenario, by record name."""
    o = Oracle()
    r = f"rate{window}"
    x: dict[str, Expected] = {}
    # vLLM, per variant
    for key, name in (("drafts", "vllm_spec_decode_num_drafts"), ("draft_tokens", "vllm_spec_decode_num_draft_tokens"),
                      ("accepted", "vllm_spec_decode_num_accepted_tokens"), ("generation", "vllm_generation_tokens"),
                      ("success", "vllm_request_success"), ("preemptions", "vllm_num_preemptions")):
        x[f"variant:{name}:{r}"] = o.v[key]
    x[f"variant_position:vllm_spec_decode_num_accepted_tokens_per_pos:{r}"] = o.v["per_pos"]
    for fig, values in o.acceptance(o.v, "drafts").items():
        level = "variant_position" if "conditional" in fig else "variant"
        x[f"{level}:vllm_spec_decode_{fig}:ratio_{r}"] = values
    for metric, bounds in VLLM_HIST_BOUNDS.items():
        lat = o.latency({k: v for k, v in VLLM_HIST_COUNTS.items()}, bounds, lambda s: _labels(variant=s[0]))
        record_metric = metric.replace("vllm:", "vllm_")
        x[f"variant_quantile:{record_metric}:histogram_quantile_{r}"] = {
            k: v for q in S.quantiles for k, v in lat[q].items()}
        x[f"variant:{record_metric}:mean_{r}"] = lat["mean"]
    # exporter, per variant and task
    for key, name in (("steps", "specwatch_spec_steps"), ("draft_tokens", "specwatch_draft_tokens"),
                      ("accepted", "specwatch_accepted_tokens"), ("decode", "specwatch_decode_steps"),
                      ("completion", "specwatch_completion_tokens"), ("requests", "specwatch_requests")):
        x[f"variant_task:{name}:{r}"] = o.vt[key]
    x[f"variant_task_position:specwatch_accepted_tokens_per_pos:{r}"] = o.vt["per_pos"]
    x[f"variant_task_accepted:specwatch_spec_steps_by_accepted:{r}"] = o.vt["by_accepted"]
    x[f"variant_task_position:specwatch_drafts_reaching_pos:{r}"] = o.vt["reaching"]
    x[f"variant_task:specwatch_spec_steps_without_per_step:{r}"] = o.vt["without_per_step"]
    covered = {vt for vt, n in o.vt["without_per_step"].items() if n == 0}  # detailed throughout the window
    x[f"variant_task_position:specwatch_acceptance_of_reached:ratio_{r}"] = {
        k: v for k, v in _ratio(o.vt["per_pos"], o.vt["reaching"]).items()
        if tuple(sorted(item for item in k if item[0] != "position")) in covered}
    for fig, values in o.acceptance(o.vt, "steps").items():
        level = "variant_task_position" if "conditional" in fig else "variant_task"
        x[f"{level}:specwatch_{fig}:ratio_{r}"] = values
    x[f"variant_task:specwatch_draft_coverage:ratio_{r}"] = _ratio(o.vt["steps"], o.vt["decode"])
    x[f"variant_task:specwatch_tokens_per_decode_step:ratio_{r}"] = {
        k: 1 + v for k, v in _ratio(o.vt["accepted"], o.vt["decode"]).items()}
    x[f"variant_task_accepted:specwatch_acceptance_length_share:ratio_{r}"] = _ratio(
        o.vt["by_accepted"], o.vt["steps"], _drop("accepted"))
    x[f"variant_task:specwatch_error:ratio_{r}"] = _ratio(o.vt["errors"], o.vt["requests"])
    x[f"variant_task:specwatch_spec_metrics_missing:ratio_{r}"] = _ratio(o.vt["missing"], o.vt["ok"])
    x[f"variant_task:specwatch_output_tokens_per_request_second:ratio_{r}"] = _ratio(
        o.vt["completion"], o.vt["e2e_sum"])
    x[f"variant_task:specwatch_mirror_identical:ratio_{r}"] = _ratio(o.vt["identical"], o.vt["mirrored"])
    for metric, bounds in EXPORTER_HIST_BOUNDS.items():
        lat = o.latency({k: v for k, v in EXPORTER_HIST_COUNTS.items()}, bounds,
                        lambda s: _labels(variant=s[0], task=s[1]))
        x[f"variant_task_quantile:{metric}:histogram_quantile_{r}"] = {
            k: v for q in S.quantiles for k, v in lat[q].items()}
        x[f"variant_task:{metric}:mean_{r}"] = lat["mean"]
    # cross-checks
    exporter_steps: Expected = {}
    for k, v in o.vt["steps"].items():
        vk = _labels(variant=dict(k)["variant"])
        exporter_steps[vk] = exporter_steps.get(vk, Fraction(0)) + v
    x[f"variant:specwatch_reconciliation:ratio_{r}"] = _ratio(exporter_steps, o.v["drafts"])
    for metric, q in (("specwatch_tpot_seconds", "0.95"), ("specwatch_ttft_seconds", "0.95"),
                      ("specwatch_itl_seconds", "0.99")):
        x[f"task_quantile:{metric}:candidate_over_baseline_{r}"] = _canary(
            x[f"variant_task_quantile:{metric}:histogram_quantile_{r}"], lambda a, b: a / b, q)
    x[f"task:specwatch_output_tokens_per_request_second:candidate_over_baseline_{r}"] = _canary(
        x[f"variant_task:specwatch_output_tokens_per_request_second:ratio_{r}"], lambda a, b: a / b)
    x[f"task:specwatch_acceptance_rate:candidate_minus_baseline_{r}"] = _canary(
        x[f"variant_task:specwatch_acceptance_rate:ratio_{r}"], lambda a, b: a - b)
    x.update(_tuning(window, x[f"variant_task_position:specwatch_acceptance_unconditional:ratio_{r}"],
                     x[f"variant_task:specwatch_draft_coverage:ratio_{r}"]))
    return x


def _running_per_engine() -> Expected:
    engines: dict[Labels, list[int]] = {}
    for (variant, _engine), c in VLLM_ENGINES.items():
        engines.setdefault(_labels(variant=variant), []).append(c.running)
    return {k: Fraction(sum(v), len(v)) for k, v in engines.items()}


def _tuning(window: str, unconditional: Expected, coverage: Expected) -> dict[str, Expected]:
    """Expected tokens per step by k, and with the cost table the cost, speed and best k at the running batch."""
    r = f"rate{window}"
    by_vt: dict[Labels, dict[int, Fraction]] = {}
    for labels, value in unconditional.items():
        d = dict(labels)
        by_vt.setdefault(_labels(variant=d["variant"], task=d["task"]), {})[int(d["position"])] = value
    expected: Expected = {}
    for vt, positions in by_vt.items():
        for k in range(S.max_expected_k + 1):
            if all(p in positions for p in range(k)):   # no invented values beyond the drafted positions
                expected[tuple(sorted((*vt, ("k", str(k)))))] = 1 + sum((positions[p] for p in range(k)), Fraction(0))
    running = _running_per_engine()
    cost_now: Expected = {}
    for (variant, size), (lower, upper) in batch_ranges(COST_TABLE).items():
        batch = running.get(_labels(variant=variant))
        if batch is not None and lower < batch <= upper:
            for cell in COST_TABLE:
                if (cell.variant, cell.batch_size) == (variant, size):
                    cost_now[_labels(variant=variant, k=str(cell.k))] = Fraction(str(cell.seconds))
    per_stream: Expected = {}
    for labels, tokens in expected.items():
        d = dict(labels)
        cost = cost_now.get(_labels(variant=d["variant"], k=d["k"]))
        cov = coverage.get(_labels(variant=d["variant"], task=d["task"]))
        if cost is not None and cov is not None:
            per_stream[labels] = (1 + (tokens - 1) * cov) / cost
    best: dict[Labels, tuple[Fraction, int]] = {}
    for labels, speed in per_stream.items():
        d = dict(labels)
        vt, k = _labels(variant=d["variant"], task=d["task"]), int(d["k"])
        if vt not in best or speed > best[vt][0] or (speed == best[vt][0] and k < best[vt][1]):
            best[vt] = (speed, k)
    return {
        f"variant:vllm_num_requests_running:avg_over_time{window}": running,
        R.expected_tokens_record(window): expected,
        f"variant_k:specwatch_step_cost_seconds:at_running_batch_{r}": cost_now,
        f"variant_task_k:specwatch_expected_stream_tokens_per_second:ratio_{r}": per_stream,
        R.best_k_record(window): {vt: Fraction(k) for vt, (_, k) in best.items()},
    }


def _canary(per_variant: Expected, op: Callable[[Fraction, Fraction], Fraction],
            quantile: str | None = None) -> Expected:
    out: Expected = {}
    for k, v in per_variant.items():
        d = dict(k)
        if d["variant"] != S.candidate or (quantile is not None and d.get("quantile") != quantile):
            continue
        rest = {a: b for a, b in d.items() if a != "variant"}
        base = per_variant.get(tuple(sorted({**rest, "variant": S.baseline}.items())))
        if base is not None:
            out[tuple(sorted(rest.items()))] = op(v, base)
    return out


def expected_gauges() -> dict[str, Expected]:
    kv: Expected = {}
    running: Expected = {}
    waiting: Expected = {}
    for (variant, _engine), c in VLLM_ENGINES.items():
        k = _labels(variant=variant)
        kv[k] = max(kv.get(k, Fraction(0)), Fraction(c.kv))
        running[k] = running.get(k, Fraction(0)) + c.running
        waiting[k] = waiting.get(k, Fraction(0)) + c.waiting
    return {"variant:vllm_kv_cache_usage_perc:max": kv, "variant:vllm_num_requests_running:sum": running,
            "variant:vllm_num_requests_waiting:sum": waiting,
            R.K_VALUE: {_labels(k=str(k)): Fraction(k) for k in range(S.max_expected_k + 1)}}


# --- rendering -----------------------------------------------------------------------------------

def _rounded(value: Fraction) -> float:
    inverse = 1.0 / ROUND_TO
    return math.floor(float(value) * inverse + 0.5) / inverse


def _case(record: str, at_s: int, samples: Expected) -> list[str]:
    out = [f"      - expr: round({record}, {ROUND_TO_TEXT})", f"        eval_time: {at_s // 60}m"]
    if not samples:
        return [*out, "        exp_samples: []"]
    out.append("        exp_samples:")
    for labels, value in sorted(samples.items()):
        body = ",".join(f'{k}="{v}"' for k, v in labels)
        out += [f"          - labels: '{{{body}}}'", f"            value: {_rounded(value)!r}"]
    return out


def render() -> str:
    rule_kinds = {rule.record: rule.kind for group in R.recording_groups() for rule in group.rules}
    out = ["# Generated by specwatch/promconfig/rule_tests.py (make generate): every recording rule, with",
           "# answers from arithmetic on the scenario's slopes. The candidate restarts at 7m15s.",
           f"rule_files: [../rules/{R.RULES_FILE}]",
           f"evaluation_interval: {INTERVAL_S}s",
           "tests:",
           f"  - interval: {INTERVAL_S}s",
           "    input_series:"]
    for series, values in input_series():
        out += [f"      - series: '{series}'", f"        values: '{values}'"]
    out.append("    promql_expr_test:")
    for record, samples in expected_gauges().items():
        out += _case(record, 300, samples)
    for at_s, window in EVALS:
        for record, samples in expected_by_record(window).items():
            if (at_s, window) in RESET_SPANNED and rule_kinds[record] == "rate":
                continue  # a rate across a restart loses one interval; the ratios must not move
            out += _case(record, at_s, samples)
    return "\n".join(out) + "\n"


TESTS_FILE = "recording.test.yml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.promconfig.rule_tests", description=__doc__)
    parser.add_argument("--out", type=Path, default=resources.RULE_TESTS, help="folder for " + TESTS_FILE)
    parser.add_argument("--check", action="store_true", help="exit 3 when the committed file is not current")
    args = parser.parse_args(argv)
    return write_or_check(args.out / TESTS_FILE, render(), args.check)


if __name__ == "__main__":
    sys.exit(main())
