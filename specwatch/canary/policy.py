"""The canary policy: a YAML file parsed once into a frozen, validated `Policy`.

Per metric: the direction in which a change is bad, the tolerance that separates "no
meaningful change" from high / low, a weight for the score, and whether its failure fails the
whole verdict. Globally: the minimum samples per side, the test's significance level, the
interval's confidence, and the score thresholds for pass and marginal. Per **comparison kind**
(speculation against none, one speculative config against another): the metrics that are a
caution there, judged and shown but never failing the verdict (ITL p95 against a baseline that
does not speculate: tokens arrive in bursts, which is what speculation looks like). The study, the
canary and the generated alerts read the same file. Errors name the key. The default ships as
package data: `specwatch/data/canary-policy.yaml`.

Every policy valid for an earlier release still loads (`tests/fixtures/canary-policies/`, one file per
shipped version): a policy without `comparisons` gets the default's (ITL p95 a caution against none), and a
caution on a metric the policy does not define (the default's `itl_p95` in a policy without it, or the
user's own) is dropped with a notice in `Policy.notices`, which the CLI prints once; never an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from specwatch import resources
from specwatch.canary.samples import METRICS
from specwatch.judge import MIN_SAMPLES, Rules

Direction = Literal["lower_is_better", "higher_is_better", "no_change"]
SPECULATION_VS_NONE, SPECULATION_VS_SPECULATION = "speculation_vs_none", "speculation_vs_speculation"
KINDS = (SPECULATION_VS_NONE, SPECULATION_VS_SPECULATION)
AUTO = "auto"  # the kind from the data: speculation_vs_speculation when the baseline drafts too
DIRECTIONS: tuple[Direction, ...] = ("lower_is_better", "higher_is_better", "no_change")
DEFAULT_POLICY = resources.CANARY_POLICY


class PolicyError(ValueError):
    """The policy file is invalid; the message names the key."""


@dataclass(frozen=True)
class MetricPolicy:
    name: str
    direction: Direction
    allowed_increase: float  # ratio metrics: a fraction (0.10 = up to 1.10x); others: an absolute difference
    allowed_decrease: float
    weight: float
    critical: bool
    at_least: float | None = None  # candidate-only share metrics (output_identical): the floor

    def fails(self, state: str) -> bool:
        """Whether a high / low classification is a failure for this metric's direction."""
        if state == "high":
            return self.direction in ("lower_is_better", "no_change")
        if state == "low":
            return self.direction in ("higher_is_better", "no_change")
        return False


DEFAULT_PASS_SCORE, DEFAULT_MARGINAL_SCORE = 90.0, 70.0  # Kayenta's usual thresholds; the canary dashboard's too
# a policy without `comparisons` (every one before comparison kinds existed) gets these
DEFAULT_CAUTIONS: Mapping[str, tuple[str, ...]] = {SPECULATION_VS_NONE: ("itl_p95",), SPECULATION_VS_SPECULATION: ()}


@dataclass(frozen=True)
class Policy:
    metrics: tuple[MetricPolicy, ...]
    min_samples: int = MIN_SAMPLES  # per side (baseline and candidate), per task and metric
    alpha: float = 0.05  # significance level of the Mann-Whitney test
    confidence: float = 0.95  # of the Hodges-Lehmann / Newcombe intervals
    pass_score: float = DEFAULT_PASS_SCORE
    marginal_score: float = DEFAULT_MARGINAL_SCORE
    comparison: str = AUTO  # a kind of KINDS, or AUTO
    cautions: Mapping[str, tuple[str, ...]] = field(default_factory=lambda: dict(DEFAULT_CAUTIONS))
    notices: tuple[str, ...] = field(default=(), compare=False)  # what loading dropped, one line each

    def metric(self, name: str) -> MetricPolicy:
        return next(m for m in self.metrics if m.name == name)

    def kind(self, baseline_speculates: bool | None) -> str:
        """The comparison kind: the policy's, or with `auto` the data's (None: not known, as against none)."""
        if self.comparison != AUTO:
            return self.comparison
        return SPECULATION_VS_SPECULATION if baseline_speculates else SPECULATION_VS_NONE

    def is_caution(self, metric: str, kind: str) -> bool:
        return metric in self.cautions.get(kind, ())

    @property
    def rules(self) -> Rules:
        """What the judge needs from the policy: samples per side, alpha, confidence."""
        return Rules(self.min_samples, self.alpha, self.confidence)


def _number(raw: Mapping[str, Any], key: str, where: str, default: float | None = None, low: float = 0.0,
            high: float | None = None) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyError(f"{where}.{key}: expected a number, got {value!r}")
    if value < low or (high is not None and value > high):
        raise PolicyError(f"{where}.{key}: {value} is outside {low}..{high if high is not None else 'inf'}")
    return float(value)


def _metric(name: str, raw: Any) -> MetricPolicy:
    where = f"metrics.{name}"
    if name not in METRICS:
        raise PolicyError(f"{where}: unknown metric; known: {', '.join(METRICS)}")
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: expected a mapping")
    unknown = set(raw) - {"direction", "allowed_increase", "allowed_decrease", "weight", "critical", "at_least"}
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}")
    direction = raw.get("direction")
    if direction not in DIRECTIONS:
        raise PolicyError(f"{where}.direction: expected one of {', '.join(DIRECTIONS)}, got {direction!r}")
    critical = raw.get("critical", False)
    if not isinstance(critical, bool):
        raise PolicyError(f"{where}.critical: expected true or false")
    at_least = raw.get("at_least")
    if METRICS[name].scale == "share":
        if at_least is None:
            raise PolicyError(f"{where}: a candidate-only share needs `at_least` (e.g. 0.99)")
        at_least = _number(raw, "at_least", where, high=1.0)
    elif at_least is not None:
        shares = ", ".join(k for k, m in METRICS.items() if m.scale == "share")
        raise PolicyError(f"{where}.at_least: only for share metrics ({shares})")
    return MetricPolicy(name, cast(Direction, direction), _number(raw, "allowed_increase", where, 0.0),
                        _number(raw, "allowed_decrease", where, 0.0, high=1.0), _number(raw, "weight", where, 1.0),
                        critical, at_least)


def parse(doc: Any, where: str = "policy") -> Policy:
    """A parsed YAML document to a `Policy`."""
    if not isinstance(doc, Mapping):
        raise PolicyError(f"{where}: expected a mapping at the top level")
    unknown = set(doc) - {"version", "min_samples", "alpha", "confidence", "score", "metrics", "comparison",
                          "comparisons"}
    if unknown:
        raise PolicyError(f"{where}: unknown keys {sorted(unknown)}")
    if doc.get("version", 1) != 1:
        raise PolicyError(f"{where}.version: only version 1 exists")
    raw_metrics = doc.get("metrics")
    if not isinstance(raw_metrics, Mapping) or not raw_metrics:
        raise PolicyError(f"{where}.metrics: expected a mapping of metric names to settings")
    metrics = tuple(_metric(str(k), v) for k, v in raw_metrics.items())
    if sum(m.weight for m in metrics) <= 0:
        raise PolicyError(f"{where}.metrics: the weights add up to 0")
    min_samples = doc.get("min_samples", MIN_SAMPLES)
    if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
        raise PolicyError(f"{where}.min_samples: expected an integer of at least 2")
    score = doc.get("score", {})
    if not isinstance(score, Mapping):
        raise PolicyError(f"{where}.score: expected a mapping with `pass` and `marginal`")
    pass_score = _number(score, "pass", f"{where}.score", DEFAULT_PASS_SCORE, high=100.0)
    marginal = _number(score, "marginal", f"{where}.score", DEFAULT_MARGINAL_SCORE, high=100.0)
    if marginal > pass_score:
        raise PolicyError(f"{where}.score: marginal ({marginal}) above pass ({pass_score})")
    alpha = _number(doc, "alpha", where, 0.05, high=0.5)
    confidence = _number(doc, "confidence", where, 0.95, high=0.9999)
    if alpha == 0 or confidence < 0.5:
        raise PolicyError(f"{where}: alpha must be above 0 and confidence at least 0.5")
    comparison, cautions, notices = _comparisons(doc, where, {m.name for m in metrics})
    return Policy(metrics, min_samples, alpha, confidence, pass_score, marginal, comparison, cautions, notices)


def _comparisons(doc: Mapping[str, Any], where: str,
                 metrics: set[str]) -> tuple[str, dict[str, tuple[str, ...]], tuple[str, ...]]:
    """`comparison` (a kind or auto), `comparisons` ({kind: {cautions: [metric, ...]}}; every kind named; the
    default's where absent) and the notices: a caution on a known metric the policy does not define is dropped."""
    comparison = doc.get("comparison", AUTO)
    if comparison != AUTO and comparison not in KINDS:
        raise PolicyError(f"{where}.comparison: expected {AUTO} or one of {', '.join(KINDS)}, got {comparison!r}")
    given = "comparisons" in doc
    raw = doc["comparisons"] if given else {kind: {"cautions": list(n)} for kind, n in DEFAULT_CAUTIONS.items()}
    if not isinstance(raw, Mapping) or set(raw) != set(KINDS):
        raise PolicyError(f"{where}.comparisons: expected a mapping with exactly {', '.join(KINDS)}")
    cautions: dict[str, tuple[str, ...]] = {}
    notices: list[str] = []
    for kind, body in raw.items():
        if not isinstance(body, Mapping) or set(body) - {"cautions"}:
            raise PolicyError(f"{where}.comparisons.{kind}: expected a mapping with `cautions: [metric, ...]`")
        names = body.get("cautions") or []
        if not isinstance(names, list) or any(not isinstance(n, str) or n not in METRICS for n in names):
            raise PolicyError(f"{where}.comparisons.{kind}.cautions: expected a list of the policy's metrics "
                              f"({', '.join(sorted(metrics))}), got {names!r}")
        origin = f"{where}.comparisons.{kind}.cautions" if given else f"the default caution for {kind}"
        notices += [f"{origin}: {n} is not among the policy's metrics; its caution is dropped"
                    for n in names if n not in metrics]
        cautions[str(kind)] = tuple(n for n in names if n in metrics)
    return str(comparison), cautions, tuple(notices)


def load(path: Path | None = None) -> Policy:
    """Read and validate a policy file (default: the packaged `specwatch/data/canary-policy.yaml`)."""
    path = path or DEFAULT_POLICY
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PolicyError(f"policy {path}: {exc}") from None
    return parse(doc, str(path))
