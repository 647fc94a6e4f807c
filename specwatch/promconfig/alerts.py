"""The alerting rules as data: each alert's condition, `for:`, severity and annotations, from the settings.

`prometheus/rules/specwatch-alerts.yml` is written from here by `python -m specwatch.promconfig.rules`
(with the recording rules). Alerts read the recorded series of the slow window, never lifetime
totals; thresholds, `for:`, severities, job names and the runbook come from `specwatch.monitoring`,
the same values the dashboards draw. `prometheus/tests/alerts.test.yml` (written by hand, the
independent check) has a case just before and just after each `for:`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

from specwatch.canary import policy as policy_mod
from specwatch.monitoring import MONITORING, AlertSetting, percent

S = MONITORING
A = S.alerts
ALERTS_FILE = "specwatch-alerts.yml"
GROUP = "specwatch.alerts"


@dataclass(frozen=True)
class AlertingRule:
    """One Prometheus alerting rule: its setting (name, `for:`, severity), PromQL and annotations."""

    setting: AlertSetting
    expr: str
    comment: str  # the lines above the rule: what it means
    summary: str
    description: str

    @property
    def name(self) -> str:
        return self.setting.name


def _excess(setting: AlertSetting) -> str:
    """A ratio threshold as the increase it allows: 1.1 -> "10 %"."""
    return percent(round(setting.level - 1, 9))


# the canary alerts and the policy metric each one's level comes from
POLICY_METRICS = {A.tpot_regression.name: "tpot", A.itl_regression.name: "itl_p95"}


def from_policy(setting: AlertSetting, policy: policy_mod.Policy | None = None) -> AlertSetting:
    """A canary alert's setting with its level read from the canary policy (the default one unless given): the
    candidate / baseline ratio above 1 + the metric's allowed increase, as `specwatch canary` judges it."""
    policy = policy or policy_mod.load()
    allowed = policy.metric(POLICY_METRICS[setting.name]).allowed_increase
    return replace(setting, threshold=round(1 + allowed, 9))


def candidate_traffic(matchers: str = "") -> str:
    """Requests per minute of the candidate per task, the canary alerts' (and verdict's) traffic guard."""
    extra = f",{matchers}" if matchers else ""
    return f'sum by (task) (variant_task:specwatch_requests:{S.slow.rate}{{variant="{S.candidate}"{extra}}}) * 60'


def baseline_drafts() -> str:
    """Per task, the baseline drafts too (a speculative config against another): the policy's
    speculation_vs_speculation, told apart as `specwatch canary` and the report do."""
    return (f'sum by (task) (variant_task:specwatch_draft_tokens:{S.slow.rate}{{variant="{S.baseline}"}}) > 0')


def _canary(setting: AlertSetting, metric: str, what: str, comment: str, only_if: str = "") -> AlertingRule:
    return AlertingRule(
        setting,
        f"task_quantile:{metric}:candidate_over_baseline_{S.slow.rate} > {setting.level:g}\n"
        f"and on (task)\n{candidate_traffic()} >= {A.min_candidate_requests_per_minute:g}"
        + (f"\nand on (task)\n{only_if}" if only_if else ""),
        comment,
        f"Candidate {what} regressed for {{{{ $labels.task }}}}",
        f"For task {{{{ $labels.task }}}} the candidate's {what} is {{{{ $value | printf \"%.2f\" }}}}x the "
        f"baseline's over {S.slow.duration}.")


def _itl_regression(policy: policy_mod.Policy) -> list[AlertingRule]:
    """The ITL alert as the policy's comparison kinds say: none where ITL p95 is a caution in both kinds, only
    where the baseline drafts too where it is a caution against a baseline that does not speculate."""
    itl = from_policy(A.itl_regression, policy)
    none = policy.is_caution("itl_p95", policy_mod.SPECULATION_VS_NONE)
    both = policy.is_caution("itl_p95", policy_mod.SPECULATION_VS_SPECULATION)
    fixed = None if policy.comparison == policy_mod.AUTO else policy.is_caution("itl_p95", policy.comparison)
    if fixed or (none and both):
        return []
    only_if = baseline_drafts() if none and fixed is None else ""
    when = (" when the baseline speculates too (against a baseline that does not, tokens arrive in bursts: the "
            "canary policy's\ncaution, not a regression)") if only_if else ""
    excess = _excess(itl)
    return [_canary(itl, S.exporter.itl, "ITL p99",
                    f"Canary: the candidate's ITL p99 is more than {excess} above the baseline's for a task{when}.",
                    only_if)]


def restarted(window_seconds: float) -> str:
    """Per variant, a vLLM engine of it started within the window: its counters reset inside the window."""
    return f'max by (variant) (process_start_time_seconds{{job="{S.jobs.vllm}"}}) > time() - {window_seconds:g}'


def alerting_rules(policy: policy_mod.Policy | None = None) -> list[AlertingRule]:
    """Every alert, in the order of the rule file and the runbook."""
    policy = policy or policy_mod.load()
    slow, w = S.slow.rate, S.slow.duration
    tpot = from_policy(A.tpot_regression, policy)
    return [
        AlertingRule(
            A.acceptance_collapsed,
            f"variant:vllm_spec_decode_acceptance_rate:ratio_{slow} < {A.acceptance_collapsed.level:g}\n"
            f"and on (variant)\nvariant:vllm_spec_decode_num_drafts:{slow} > {A.min_drafts_per_second:g}",
            f"The server's draft acceptance fell below {percent(A.acceptance_collapsed.level)} while drafts keep "
            "flowing: the drafter no\nlonger predicts the target (wrong or mismatched draft model, changed traffic, "
            "a config change).",
            "Draft acceptance collapsed on {{ $labels.variant }}",
            "vLLM variant {{ $labels.variant }} accepted {{ $value | humanizePercentage }} of its draft tokens "
            f"over {w} while still drafting; speculation now costs more than it saves."),
        AlertingRule(
            A.task_acceptance_collapsed,
            f"variant_task:specwatch_acceptance_rate:ratio_{slow} < {A.task_acceptance_collapsed.level:g}\n"
            f"and on (variant, task)\nvariant_task:specwatch_spec_steps:{slow} > {A.min_drafts_per_second:g}",
            "The same, per task, from the exporter: one task's traffic (say chat) stopped matching.",
            "Draft acceptance collapsed for {{ $labels.task }} on {{ $labels.variant }}",
            "Requests of task {{ $labels.task }} on variant {{ $labels.variant }} accepted "
            f"{{{{ $value | humanizePercentage }}}} of their draft tokens over {w} while drafts flow."),
        AlertingRule(
            A.metrics_missing,
            f"variant_task:specwatch_spec_metrics_missing:ratio_{slow} > {A.metrics_missing.level:g}\n"
            f"and on (variant)\ngroup by (variant) ({S.vllm.drafts})",
            "ok responses without metrics.speculative_decoding on a variant whose vLLM speculates.",
            "Per-request spec-decode metrics missing on {{ $labels.variant }} ({{ $labels.task }})",
            "{{ $value | humanizePercentage }} of the ok responses of task {{ $labels.task }} on speculative "
            "variant {{ $labels.variant }} carried no metrics.speculative_decoding over "
            f"{w}; per-task acceptance is blind."),
        AlertingRule(
            A.reconciliation_drift,
            f"abs(variant:specwatch_reconciliation:ratio_{slow} - 1) > {A.reconciliation_drift.level:g}\n"
            f"unless on (variant)\n{restarted(S.slow.seconds)}",
            "The exporter's summed verify steps no longer match vLLM's drafts counter for a variant. Quiet while an "
            "engine of\nthe variant started within the window (a restart resets its counters and loses what was in "
            "flight):\nit waits out the reset.",
            "Exporter and vLLM disagree on {{ $labels.variant }}",
            "The exporter's verify steps differ from vLLM's drafts by {{ $value | humanizePercentage }} over "
            f"{w} on variant {{{{ $labels.variant }}}}."),
        _canary(tpot, S.exporter.tpot, "TPOT p95",
                f"Canary: the candidate's client-side TPOT p95 is more than {_excess(tpot)} above the "
                "baseline's for a task."),
        *_itl_regression(policy),
        AlertingRule(
            A.preemptions,
            f"variant:vllm_num_preemptions:{slow} > {A.preemptions.level:g}",
            "The scheduler keeps preempting requests: the KV cache is too small for the load.",
            "vLLM preempts requests on {{ $labels.variant }}",
            "Variant {{ $labels.variant }} preempts {{ $value | humanize }} requests per second "
            f"({w})."),
        AlertingRule(
            A.kv_cache_full,
            f"variant:vllm_kv_cache_usage_perc:max > {A.kv_cache_full.level:g}",
            f"The fullest engine's KV cache is above {percent(A.kv_cache_full.level)}.",
            "KV cache near full on {{ $labels.variant }}",
            "The fullest engine of variant {{ $labels.variant }} uses {{ $value | humanizePercentage }} of its "
            "KV cache."),
        AlertingRule(
            A.target_down,
            f"up{{{S.jobs.selector()}}} == 0",
            "Prometheus cannot scrape a vLLM server or the exporter.",
            "{{ $labels.job }} target {{ $labels.instance }} is down",
            "Prometheus has not scraped {{ $labels.instance }} (job {{ $labels.job }}, variant "
            f"{{{{ $labels.variant }}}}) for {A.target_down.for_}."),
        AlertingRule(
            A.upstream_down,
            f"{S.exporter.upstream_up} == 0",
            "The exporter's health probe of an upstream fails: requests to that variant fail with 502.",
            "The exporter cannot reach upstream {{ $labels.variant }}",
            "The exporter's health probe of variant {{ $labels.variant }} has failed for "
            f"{A.upstream_down.for_}."),
    ]


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is a subset of it)."""
    return json.dumps(text, ensure_ascii=False)


def render(rules: list[AlertingRule] | None = None) -> str:
    out = ["# Generated by specwatch/promconfig/alerts.py (make generate); edit that, not this file.",
           f"# The alerts read the recording rules of specwatch-recording.yml ({S.slow.duration} window) and the",
           "# job names of prometheus.yml; each links to its section of docs/runbook.md. Tested by",
           "# prometheus/tests/alerts.test.yml (a case just before and just after each `for:`).",
           "groups:",
           f"  - name: {GROUP}",
           "    rules:"]
    for i, rule in enumerate(alerting_rules() if rules is None else rules):
        if i:
            out.append("")
        out += [f"      # {line}" for line in rule.comment.splitlines()]
        out += [f"      - alert: {rule.name}", "        expr: |-"]
        out += [f"          {line}" for line in rule.expr.splitlines()]
        out += [f"        for: {rule.setting.for_}",
                "        labels:",
                f"          severity: {rule.setting.severity}",
                "        annotations:",
                f"          summary: {_quoted(rule.summary)}",
                f"          description: {_quoted(rule.description)}",
                f"          runbook_url: {_quoted(A.runbook_url(rule.setting))}"]
    return "\n".join(out) + "\n"
