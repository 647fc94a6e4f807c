"""The monitoring settings in one place: names, selectors, windows, thresholds and alert timing.

As the monitoring mixins keep one `config.libsonnet`, specwatch keeps one frozen `MONITORING`:
the recording rules and alerts (`specwatch.promconfig`), their promtool tests, the Grafana
dashboards, the Kubernetes PrometheusRule, the canary's error outcomes and `specwatch up` read it,
and `make generate` carries a change made here into every committed file. Values that are
contracts (job names, alert names, windows that name recording rules) change only with a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from specwatch.exporter.families import ExporterFamilies
from specwatch.exporter.labels import ERROR_OUTCOMES

Severity = Literal["warning", "critical"]


@dataclass(frozen=True)
class Window:
    """A rule window: the PromQL duration and the suffix it gives recording rule names."""

    duration: str  # a PromQL duration: "1m"

    @property
    def rate(self) -> str:
        """The operation suffix of recording rules over this window (`..._rate5m`)."""
        return f"rate{self.duration}"

    @property
    def seconds(self) -> float:
        units = {"s": 1, "m": 60, "h": 3600}
        return float(self.duration[:-1]) * units[self.duration[-1]]


@dataclass(frozen=True)
class Jobs:
    """The Prometheus job names, shared by prometheus.yml, the k8s monitors, the rules and the alerts."""

    vllm: str = "vllm"                       # every vLLM (or simulator) server, one `variant` per target
    exporter: str = "specwatch-exporter"

    def selector(self) -> str:
        """A matcher for the targets of both jobs."""
        return f'job=~"{self.vllm}|{self.exporter}"'


@dataclass(frozen=True)
class VllmFamilies:
    """vLLM 0.32.0's families the rules and alerts read (counters with `_total`, as exposed)."""

    drafts: str = "vllm:spec_decode_num_drafts_total"
    draft_tokens: str = "vllm:spec_decode_num_draft_tokens_total"
    accepted: str = "vllm:spec_decode_num_accepted_tokens_total"
    accepted_per_pos: str = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    generation_tokens: str = "vllm:generation_tokens_total"
    request_success: str = "vllm:request_success_total"
    preemptions: str = "vllm:num_preemptions_total"
    kv_cache_usage: str = "vllm:kv_cache_usage_perc"
    running: str = "vllm:num_requests_running"
    waiting: str = "vllm:num_requests_waiting"
    ttft: str = "vllm:time_to_first_token_seconds"               # histograms: the family name
    tpot: str = "vllm:request_time_per_output_token_seconds"
    itl: str = "vllm:inter_token_latency_seconds"
    e2e: str = "vllm:e2e_request_latency_seconds"

    def latencies(self) -> tuple[str, ...]:
        return (self.ttft, self.tpot, self.itl, self.e2e)


@dataclass(frozen=True)
class CostTableNames:
    """The record names of a step-cost table (`promconfig.cost_rules` writes them, the best-k rules read them).

    A cost table is a static rule file of constants: the median step time per variant, batch size and draft
    length k, and per variant and batch size the range of running batch sizes it stands for (lower exclusive,
    upper inclusive), so PromQL can pick the row of the current batch with two comparisons.
    """

    step_cost: str = "variant_batch_size_k:specwatch_step_cost_seconds:median"
    batch_lower: str = "variant_batch_size:specwatch_step_cost_batch_range:lower"
    batch_upper: str = "variant_batch_size:specwatch_step_cost_batch_range:upper"
    # the rule files Prometheus loads besides its own (relative to prometheus.yml): where a cost table goes
    folder: str = "tuned"


@dataclass(frozen=True)
class AlertSetting:
    """One alert's name (a contract: runbook heading, silences, routes), threshold, `for:` and severity."""

    name: str
    threshold: float | None  # None where the condition is a state (`up == 0`), not a level
    for_: str
    severity: Severity

    @property
    def level(self) -> float:
        """The threshold of an alert that has one."""
        if self.threshold is None:
            raise ValueError(f"{self.name} has no threshold")
        return self.threshold


@dataclass(frozen=True)
class Alerts:
    """Every alert's setting, and the traffic guards that keep alerts quiet on idle variants."""

    acceptance_collapsed: AlertSetting = AlertSetting("SpecDecodeAcceptanceCollapsed", 0.1, "10m", "warning")
    task_acceptance_collapsed: AlertSetting = AlertSetting(
        "SpecDecodeTaskAcceptanceCollapsed", 0.1, "10m", "warning")
    metrics_missing: AlertSetting = AlertSetting("SpecDecodePerRequestMetricsMissing", 0.05, "10m", "warning")
    reconciliation_drift: AlertSetting = AlertSetting("SpecwatchReconciliationDrift", 0.05, "15m", "warning")
    # the canary alerts' levels are the canary policy's (1 + the metric's allowed increase), read where they are
    # rendered: `specwatch.promconfig.alerts.from_policy`
    tpot_regression: AlertSetting = AlertSetting("SpecDecodeCandidateTPOTRegression", None, "10m", "critical")
    itl_regression: AlertSetting = AlertSetting("SpecDecodeCandidateITLRegression", None, "10m", "warning")
    preemptions: AlertSetting = AlertSetting("VLLMPreemptionsRising", 0, "10m", "warning")
    kv_cache_full: AlertSetting = AlertSetting("VLLMKVCacheNearFull", 0.9, "5m", "warning")
    target_down: AlertSetting = AlertSetting("SpecwatchTargetDown", None, "1m", "critical")
    upstream_down: AlertSetting = AlertSetting("SpecwatchUpstreamDown", None, "1m", "critical")
    # the acceptance alerts need drafts (verify steps) flowing at this rate, per second
    min_drafts_per_second: float = 0.1
    # the canary alerts (and the canary dashboard's verdict) need this much candidate traffic
    min_candidate_requests_per_minute: float = 1
    # each alert links its section: `### AlertName` in docs/runbook.md
    runbook: str = "https://github.com/specwatch/specwatch/blob/main/docs/runbook.md"

    def runbook_url(self, alert: AlertSetting) -> str:
        return f"{self.runbook}#{alert.name.lower()}"


@dataclass(frozen=True)
class MonitoringSettings:
    """Everything the rules, alerts, dashboards, canary and local stack must agree on."""

    jobs: Jobs = field(default_factory=Jobs)
    vllm: VllmFamilies = field(default_factory=VllmFamilies)
    exporter: ExporterFamilies = field(default_factory=ExporterFamilies)
    fast: Window = Window("1m")   # live panels
    slow: Window = Window("5m")   # alerts, canary ratios, reports
    quantiles: tuple[str, ...] = ("0.5", "0.95", "0.99")
    # the conditional per-position acceptance is recorded up to this position (vLLM configs rarely draft > 8)
    max_conditional_position: int = 15
    # expected tokens per step are recorded for k = 0 .. this, and the best k is searched over the same range
    max_expected_k: int = 15
    cost_table: CostTableNames = field(default_factory=CostTableNames)
    # the canary ratios compare these two variants (the exporter's and compose's route names)
    baseline: str = "baseline"
    candidate: str = "candidate"
    # request outcomes that count as errors of the server (client aborts and rejections do not)
    error_outcomes: tuple[str, ...] = ERROR_OUTCOMES
    alerts: Alerts = field(default_factory=Alerts)

    @property
    def windows(self) -> tuple[Window, ...]:
        return (self.fast, self.slow)

    def error_outcome_regex(self) -> str:
        return "|".join(self.error_outcomes)


MONITORING = MonitoringSettings()


def in_words(duration: str) -> str:
    """A `for:` or window duration as a panel description says it: "1m" -> "a minute", "10m" -> "10 minutes"."""
    if not duration.endswith("m") or not duration[:-1].isdigit():
        raise ValueError(f"duration {duration!r}: expected whole minutes, e.g. 10m")
    minutes = int(duration[:-1])
    return "a minute" if minutes == 1 else f"{minutes} minutes"


def percent(fraction: float) -> str:
    """A fraction as a description says it: 0.1 -> "10 %"."""
    return f"{fraction * 100:g} %"
