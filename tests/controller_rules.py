"""What Argo Rollouts v1.9.1 and Flagger v1.44.0 do with the answers they get: their rules, re-implemented.

A Kubernetes API server and the controllers cannot run here, so the parts of their source that decide what an
analysis does with each measurement are transcribed below, each with the file and lines it comes from (read
with `git show v1.9.1:<file>` in argoproj/argo-rollouts and `git show v1.44.0:<file>` in fluxcd/flagger).
Nothing here knows what specwatch means by its answers: the tests feed it the generated objects and the
answers specwatch gives, and read off what the controller would then do.

Argo Rollouts (a step's AnalysisRun):
- `utils/analysis/factory.go` 149-212 `ValidateMetric`: the limits a metric may carry.
- `utils/evaluate/evaluate.go` 18-58 `EvaluateResult`: success / failure conditions to a measurement phase
  (an error while evaluating is an Error measurement); the conditions are `expr` expressions over `result`.
- `metricproviders/webmetric/webmetric.go` 107-108: a non-2xx answer is an Error measurement; 124-148: the
  jsonPath's value is the `result` (not found: Error).
- `metricproviders/prometheus/prometheus.go` 174-182: a vector answer is the list of its sample values.
- `analysis/analysis.go` 382-400 `runMeasurements`: Successful, Failed and Inconclusive measurements count
  (`Count`), an Error only adds to `ConsecutiveError`; 579-656 `assessMetricStatus`; 658-689
  `assessMetricFailureInconclusiveOrError`; 436-577 `assessRunStatus` (the worst metric, once all completed;
  a Failed, Error or Inconclusive metric terminates the run: `utils/analysis/helpers.go` 84-101, and a metric
  with no measurement is then Successful); `utils/analysis/helpers.go` 48-55 the order of phases.
- `utils/defaults/defaults.go` 37: `consecutiveErrorLimit` defaults to 4.
- `rollout/analysis.go` 430-440 `reconcileStepBasedAnalysisRun`: Inconclusive pauses the rollout
  (`PauseReasonInconclusiveAnalysis`), Error or Failed aborts it; Successful lets the step go on.

Flagger (a Canary with `provider: kubernetes`, blue / green):
- `pkg/controller/webhook.go` 90: any status above 202 (or no answer) is a failed webhook.
- `pkg/metrics/providers/prometheus.go` `RunQuery`: status >= 400 is an error; no sample, or NaN, is
  `ErrNoValuesFound`.
- `pkg/controller/scheduler_metrics.go` 316-345: a query error, no values, or a value outside
  `thresholdRange` halts the analysis.
- `pkg/controller/scheduler.go` 752-776 `runAnalysis`: every `rollout` webhook, then the metrics;
  429-438: at `threshold` failed checks it rolls back; 449-466: the first tick (no canary weight yet, no
  iteration) runs the pre-rollout hooks instead of the analysis, every later one runs the analysis and a
  failure adds a failed check and stops there; 682-748 `runBlueGreen`: iterations advance one per tick up to
  `iterations`, then one more tick routes the traffic, and the next promotes.
- `pkg/router/nop.go` 35-40: the `kubernetes` provider's weights: canary 0 before the first iteration, 100
  after.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Phase = Literal["Successful", "Failed", "Inconclusive", "Error", "Running", "Pending"]
ORDER: tuple[Phase, ...] = ("Successful", "Running", "Pending", "Inconclusive", "Error", "Failed")  # best first
Doc = dict[str, Any]


class ExprError(Exception):
    """What `expr` would raise while evaluating a condition (an Error measurement)."""


# -- conditions: the subset of expr (github.com/antonmedv/expr) the generated templates use ------------------------
_TOKEN = re.compile(r'\s*(?:(?P<num>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)|(?P<str>"[^"]*")|(?P<op>&&|\|\||==|!=|<=|>=|<|>|'
                    r'\(|\)|\[|\]|!)|(?P<name>[A-Za-z_]\w*))')


def _translate(condition: str) -> str:
    """An expr condition as the equivalent Python expression; refuses anything outside the subset."""
    out, pos = [], 0
    while pos < len(condition):
        m = _TOKEN.match(condition, pos)
        if not m or m.end() == pos:
            raise ValueError(f"condition {condition!r}: cannot read from {condition[pos:]!r}")
        pos = m.end()
        if m["name"]:
            if m["name"] not in ("result", "len", "isNaN", "true", "false"):
                raise ValueError(f"condition {condition!r}: {m['name']!r} is outside the transcribed subset")
            out.append({"true": "True", "false": "False"}.get(m["name"], m["name"]))
        elif m["op"]:
            out.append({"&&": " and ", "||": " or ", "!": " not "}.get(m["op"], m["op"]))
        else:
            out.append(m["num"] or m["str"])
    return "".join(out)


def condition_holds(condition: str, result: Any) -> bool:
    """Evaluate an expr condition on `result` as `utils/evaluate/evaluate.go` EvalCondition does: `&&` and `||`
    short-circuit; an index out of range or comparing a string with a number raises ExprError."""
    expression = _translate(condition)

    def is_nan(x: Any) -> bool:
        return isinstance(x, float) and math.isnan(x)
    try:
        value = eval(expression, {"__builtins__": {}}, {"result": result, "len": len, "isNaN": is_nan})  # noqa: S307
    except (IndexError, TypeError, KeyError) as exc:
        raise ExprError(f"{condition}: {type(exc).__name__}: {exc}") from None
    if not isinstance(value, bool):
        raise ExprError(f"{condition}: expected bool, got {value!r}")
    return value


def evaluate_result(metric: Doc, result: Any) -> Phase:
    """`utils/evaluate/evaluate.go` 18-58."""
    success, failure = metric.get("successCondition", ""), metric.get("failureCondition", "")
    try:
        ok = condition_holds(success, result) if success else False
        bad = condition_holds(failure, result) if failure else False
    except ExprError:
        return "Error"
    if not success and not failure:
        return "Successful"
    if success and not failure:
        bad = not ok
    if failure and not success:
        ok = not bad
    if bad:
        return "Failed"
    if not ok:
        return "Inconclusive"
    return "Successful"


# -- what a provider measures ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class WebAnswer:
    """An HTTP answer to Argo's web provider (status None: no answer, a timeout or a refused connection)."""

    status: int | None
    body: bytes = b""


@dataclass(frozen=True)
class PromAnswer:
    """A Prometheus answer: the vector's sample values, or an error (Prometheus down, a bad query)."""

    values: tuple[float, ...] = ()
    error: str = ""


def _json_path(path: str, body: bytes) -> Any:
    """The `{$.a.b}` form of Kubernetes JSONPath that the templates use; KeyError where it finds nothing."""
    m = re.fullmatch(r"\{\$((?:\.\w+)*)\}", path)
    if not m:
        raise ValueError(f"jsonPath {path!r}: outside the transcribed subset")
    value = json.loads(body)
    for key in filter(None, m[1].split(".")):
        value = value[key]
    return value


def web_measurement(metric: Doc, answer: WebAnswer) -> Phase:
    """`metricproviders/webmetric/webmetric.go` 99-148."""
    if answer.status is None or not 200 <= answer.status < 300:
        return "Error"
    try:
        value = _json_path(metric["provider"]["web"].get("jsonPath", "{$}"), answer.body)
    except (ValueError, KeyError, TypeError):
        return "Error"
    return evaluate_result(metric, value)


def prometheus_measurement(metric: Doc, answer: PromAnswer) -> Phase:
    """`metricproviders/prometheus/prometheus.go` 80-100 (an error is an Error measurement) and 174-182."""
    if answer.error:
        return "Error"
    return evaluate_result(metric, list(answer.values))


# -- Argo's counting ------------------------------------------------------------------------------------------------
def _int(metric: Doc, key: str, default: int) -> int:
    value = metric.get(key, default)
    return int(value)


def validate_metric(metric: Doc) -> None:
    """`utils/analysis/factory.go` 149-200: ValueError where Argo refuses the template."""
    count, failure = _int(metric, "count", 0), _int(metric, "failureLimit", 0)
    success, inconclusive = _int(metric, "consecutiveSuccessLimit", 0), _int(metric, "inconclusiveLimit", 0)
    if success < 0 or failure < -1 or inconclusive < 0 or _int(metric, "consecutiveErrorLimit", 0) < 0:
        raise ValueError(f"{metric['name']}: a negative limit")
    if success == 0 and failure == -1:
        raise ValueError(f"{metric['name']}: failureLimit and consecutiveSuccessLimit cannot both be disabled")
    if count > 0:
        if failure >= 0 and count < failure + success:
            raise ValueError(f"{metric['name']}: count must be >= failureLimit + consecutiveSuccessLimit")
        if failure < 0 and count < success:
            raise ValueError(f"{metric['name']}: count must be >= consecutiveSuccessLimit")
        if count < inconclusive:
            raise ValueError(f"{metric['name']}: count must be >= inconclusiveLimit")
    if count > 1 and not metric.get("interval"):
        raise ValueError(f"{metric['name']}: interval must be specified when count > 1")


@dataclass
class MetricResult:
    """`MetricResult` of an AnalysisRun's status: the counters `runMeasurements` keeps."""

    count: int = 0
    successful: int = 0
    failed: int = 0
    inconclusive: int = 0
    error: int = 0
    consecutive_error: int = 0
    consecutive_success: int = 0
    measurements: list[Phase] = field(default_factory=list)
    phase: Phase = "Running"


def record(result: MetricResult, phase: Phase) -> None:
    """`analysis/analysis.go` 382-400."""
    result.measurements.append(phase)
    if phase == "Successful":
        result.successful += 1
        result.count += 1
        result.consecutive_error = 0
        result.consecutive_success += 1
    elif phase == "Failed":
        result.failed += 1
        result.count += 1
        result.consecutive_error = result.consecutive_success = 0
    elif phase == "Inconclusive":
        result.inconclusive += 1
        result.count += 1
        result.consecutive_error = result.consecutive_success = 0
    elif phase == "Error":
        result.error += 1
        result.consecutive_error += 1
        result.consecutive_success = 0


def failure_inconclusive_or_error(metric: Doc, result: MetricResult) -> Phase | None:
    """`analysis/analysis.go` 658-689 (the later checks win, as there)."""
    phase: Phase | None = None
    failure_limit = _int(metric, "failureLimit", 0)
    if failure_limit >= 0 and result.failed > failure_limit:
        phase = "Failed"
    if result.inconclusive > _int(metric, "inconclusiveLimit", 0):
        phase = "Inconclusive"
    if result.consecutive_error > _int(metric, "consecutiveErrorLimit", 4):  # defaults.go 37
        phase = "Error"
    return phase


def effective_count(metric: Doc) -> int | None:
    """`pkg/apis/rollouts/v1alpha1/analysis_types.go` 159-169."""
    count = _int(metric, "count", 0)
    if count == 0:
        return None if metric.get("interval") else 1
    return count


def assess_metric(metric: Doc, result: MetricResult) -> Phase:
    """`analysis/analysis.go` 579-656 (not terminating; every measurement here is completed)."""
    if result.phase in ("Successful", "Failed", "Inconclusive", "Error"):
        return result.phase
    if not result.measurements:
        return "Pending"
    ended = failure_inconclusive_or_error(metric, result)
    if ended:
        return ended
    success_limit = _int(metric, "consecutiveSuccessLimit", 0)
    if success_limit > 0 and result.consecutive_success >= success_limit:
        return "Successful"
    count = effective_count(metric)
    if count is not None and result.count >= count:
        failure_applicable = _int(metric, "failureLimit", 0) >= 0 or "failureLimit" not in metric
        if failure_applicable and success_limit > 0:
            return "Inconclusive"
        if success_limit > 0:
            return "Failed"
        return "Successful"
    return "Running"


@dataclass(frozen=True)
class RunOutcome:
    """How an AnalysisRun ended, per metric, and what the Rollout then does."""

    phase: Phase
    metrics: dict[str, Phase]
    measurements: dict[str, list[Phase]]

    @property
    def rollout(self) -> str:
        """`rollout/analysis.go` 430-440: what the step does with the run."""
        return {"Successful": "next step", "Inconclusive": "pause", "Failed": "abort", "Error": "abort"}.get(
            self.phase, "wait")


def run_analysis(metrics: Sequence[Doc], measure: Mapping[str, Iterable[Phase]]) -> RunOutcome:
    """An AnalysisRun of `metrics`, each measured in turn (one interval per tick) from its phases in `measure`;
    ends when the run completes (`assessRunStatus`, 436-577) or a metric's phases run out (then Running)."""
    for metric in metrics:
        validate_metric(metric)
    results = {m["name"]: MetricResult() for m in metrics}
    feeds = {name: iter(phases) for name, phases in measure.items()}
    while True:
        for metric in metrics:
            result = results[metric["name"]]
            if result.phase in ("Successful", "Failed", "Inconclusive", "Error"):
                continue
            phase = next(feeds[metric["name"]], None)
            if phase is None:
                return RunOutcome("Running", {n: r.phase for n, r in results.items()},
                                  {n: r.measurements for n, r in results.items()})
            record(result, phase)
            result.phase = assess_metric(metric, result)
        phases = {n: r.phase for n, r in results.items()}
        terminating = any(p in ("Failed", "Error", "Inconclusive") for p in phases.values())  # helpers.go 84-101
        if terminating:  # the metrics still running end Successful (analysis.go 599-605, 651-655)
            phases = {n: (p if p in ("Failed", "Error", "Inconclusive") else "Successful") for n, p in phases.items()}
        if terminating or all(p not in ("Running", "Pending") for p in phases.values()):
            worst = max(phases.values(), key=ORDER.index)
            return RunOutcome(worst, phases, {n: r.measurements for n, r in results.items()})


# -- Flagger --------------------------------------------------------------------------------------------------------
def webhook_passes(status: int | None) -> bool:
    """`pkg/controller/webhook.go` 80-93: an answer of at most 202."""
    return status is not None and status <= 202


def metric_passes(bounds: Doc, answer: PromAnswer) -> bool:
    """`pkg/metrics/providers/prometheus.go` RunQuery and `pkg/controller/scheduler_metrics.go` 316-345."""
    if answer.error or not answer.values or math.isnan(answer.values[-1]):
        return False  # a query error, or ErrNoValuesFound
    value = answer.values[-1]  # RunQuery keeps the last sample's value
    if "min" in bounds and value < bounds["min"]:
        return False
    return not ("max" in bounds and value > bounds["max"])


@dataclass
class CanaryStatus:
    iterations: int = 0
    failed_checks: int = 0
    phase: str = "Progressing"
    log: list[str] = field(default_factory=list)


def flagger_tick(canary: Doc, status: CanaryStatus, webhooks: dict[str, int | None],
                 queries: dict[str, PromAnswer]) -> None:
    """One scheduling interval of `advanceCanary` for a `kubernetes` provider Canary, from the point it is
    Progressing (`pkg/controller/scheduler.go`). `webhooks`: each rollout webhook's status this tick; `queries`:
    each metric's answer by its templateRef name."""
    analysis = canary["spec"]["analysis"]
    if status.phase != "Progressing":
        return
    if status.failed_checks >= int(analysis.get("threshold", 1) or 1):  # 429-438, canary.go 655-660
        status.phase = "RolledBack"
        status.log.append(f"rolled back: {status.failed_checks} failed checks")
        return
    canary_weight = 100 if status.iterations > 0 else 0  # router/nop.go 35-40
    if not (canary_weight == 0 and status.iterations == 0):  # 449-466
        passed = all(webhook_passes(webhooks[h["name"]]) for h in analysis.get("webhooks", [])
                     if h.get("type", "rollout") == "rollout")
        if passed:
            passed = all(metric_passes(m.get("thresholdRange", {}), queries[m["templateRef"]["name"]])
                         for m in analysis.get("metrics", []))
        if not passed:
            status.failed_checks += 1
            status.log.append("failed check")
            return
    iterations = int(analysis.get("iterations") or 10)  # 475-479
    if iterations > status.iterations:  # 682-705
        status.iterations += 1
        status.log.append(f"iteration {status.iterations}/{iterations}")
        return
    if iterations == status.iterations:  # 712-733 (no confirm-promotion hooks generated)
        status.iterations += 1
        status.log.append("routing all traffic to the canary")
        return
    status.phase = "Promoting"  # 735-748
    status.log.append("promoted")
