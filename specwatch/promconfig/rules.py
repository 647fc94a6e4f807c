"""The recording rules as data: vLLM's counters and the exporter's, turned into windowed figures.

`specwatch/data/prometheus/rules/specwatch-recording.yml` is written from here, with the alerts of
`specwatch.promconfig.alerts` next to it (`make generate`, or `python -m specwatch.promconfig.rules
`, which writes there by default), and a test fails when a committed file differs from a fresh rendering.
Windows, family names and variants come from `specwatch.monitoring`. Names follow
`level:metric:operations`; numerators and denominators are summed (over engines, replicas and the
labels a level drops) before dividing, and every ratio is a ratio of `rate()` sums over one window,
so it never reads a lifetime total and a counter reset (a server restart) costs at most one scrape
interval, in numerator and denominator alike. A denominator of zero gives no sample (`> 0`), never
0 % or NaN.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specwatch import resources
from specwatch.files import write_or_check
from specwatch.monitoring import MONITORING
from specwatch.promconfig import alerts

S = MONITORING
V, E = S.vllm, S.exporter
RULES_FILE = "specwatch-recording.yml"


@dataclass(frozen=True)
class RecordingRule:
    """One recording rule: its name, PromQL, the comment above it and what kind of figure it records."""

    record: str
    expr: str
    comment: str
    kind: str  # "rate" (a per-second figure), "ratio" (unitless, reset-proof), "gauge"
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[RecordingRule, ...]


def _sum_rate(metric: str, by: str, window: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[{window}]))"


def _positive(expr: str) -> str:
    return f"({expr} > 0)"


def record_metric(family: str) -> str:
    """The metric part of a recording rule's name: `vllm:x_total` -> `vllm_x` (no colon, no `_total`)."""
    return family.replace(":", "_").removesuffix("_total")


def _shifted_positions(series: str) -> str:
    """`series` with position p relabelled p + 1, so `x / shifted` divides position p by p - 1."""
    terms = [f'label_replace({series}{{position="{p}"}}, "position", "{p + 1}", "position", ".*")'
             for p in range(S.max_conditional_position)]
    return "(\n    " + "\n  or ".join(terms) + "\n)"


def _acceptance_rules(level: str, prefix: str, by: str, window: str,
                      names: dict[str, str]) -> list[RecordingRule]:
    """Rate, mean length, unconditional and conditional per position, from the recorded rates in `names`."""
    r = f"rate{window}"
    per_pos = names["per_pos"]
    unconditional = f"{level}_position:{prefix}_acceptance_unconditional:ratio_{r}"
    return [
        RecordingRule(f"{level}:{prefix}_acceptance_rate:ratio_{r}",
                      f"{names['accepted']}\n/\n{_positive(names['draft_tokens'])}",
                      "Draft acceptance rate: accepted draft tokens / draft tokens.", "ratio"),
        RecordingRule(f"{level}:{prefix}_mean_acceptance_length:ratio_{r}",
                      f"1 + {names['accepted']}\n/\n{_positive(names['steps'])}",
                      "Mean acceptance length, bonus token included: 1 + accepted tokens / drafts (verify steps).",
                      "ratio"),
        RecordingRule(unconditional,
                      f"{per_pos}\n/ ignoring (position) group_left ()\n{_positive(names['steps'])}",
                      "P(accepted length >= position + 1): steps accepting position p / drafts.", "ratio"),
        RecordingRule(f"{level}_position:{prefix}_acceptance_conditional:ratio_{r}",
                      f"{per_pos}\n/ on ({by}, position)\n({_shifted_positions(per_pos)} > 0)\n"
                      f'or\n{unconditional}{{position="0"}}',
                      "P(position p accepted | position p - 1 accepted); position 0 is the unconditional rate.",
                      "ratio"),
    ]


def _latency_rules(level: str, by: str, metric: str, window: str, what: str) -> list[RecordingRule]:
    r = f"rate{window}"
    name = record_metric(metric)
    rules = [RecordingRule(f"{level}_quantile:{name}:histogram_quantile_{r}",
                           f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))",
                           f"{what}, quantile {q} of the requests in the window.", "ratio", {"quantile": q})
             for q in S.quantiles]
    rules.append(RecordingRule(f"{level}:{name}:mean_{r}",
                               f"{_sum_rate(metric + '_sum', by, window)}\n/\n"
                               f"{_positive(_sum_rate(metric + '_count', by, window))}",
                               f"{what}, mean (rate of the sum / rate of the count).", "ratio"))
    return rules


def _rate_rule(level: str, by: str, family: str, window: str, comment: str) -> RecordingRule:
    """The summed per-second rate of one counter family, named after it."""
    return RecordingRule(f"{level}:{record_metric(family)}:rate{window}", _sum_rate(family, by, window), comment,
                         "rate")


def _rate_rules(level: str, by: str, window: str, table: tuple[tuple[str, str, str, str], ...]
                ) -> dict[str, RecordingRule]:
    """`_rate_rule` for each (key, extra label, family, comment) of `table`, by key: an extra label joins the
    level and `by` (`variant_position`, `variant, position`)."""
    return {key: _rate_rule(f"{level}_{extra}" if extra else level, f"{by}, {extra}" if extra else by, family,
                            window, comment)
            for key, extra, family, comment in table}


def vllm_rules(window: str) -> list[RecordingRule]:
    """Server side, per variant, from vLLM 0.32.0's own families (summed over engines and replicas)."""
    by = "variant"
    rates = _rate_rules(by, by, window, (
        ("steps", "", V.drafts, "Drafts (verify steps that carried a draft) per second."),
        ("draft_tokens", "", V.draft_tokens, "Draft tokens proposed per second."),
        ("accepted", "", V.accepted, "Draft tokens accepted per second (the bonus token not included)."),
        ("per_pos", "position", V.accepted_per_pos,
         "Steps per second that accepted the draft at position p (0-based) and all before it."),
    ))
    names = {key: rule.record for key, rule in rates.items()}
    rules = [
        *rates.values(),
        *_acceptance_rules("variant", "vllm_spec_decode", by, window, names),
        _rate_rule(by, by, V.generation_tokens, window, "Output tokens per second."),
        _rate_rule(by, by, V.request_success, window, "Finished requests per second (every finished_reason)."),
        _rate_rule(by, by, V.preemptions, window, "Preemptions per second (KV cache pressure)."),
    ]
    whats = {V.ttft: "Server TTFT", V.tpot: "Server TPOT", V.itl: "Server ITL", V.e2e: "Server end-to-end latency"}
    for metric in V.latencies():
        rules += _latency_rules("variant", by, metric, window, whats[metric])
    return rules


def vllm_gauge_rules() -> list[RecordingRule]:
    """Window-free server figures per variant."""
    return [
        RecordingRule(f"variant:{record_metric(V.kv_cache_usage)}:max", f"max by (variant) ({V.kv_cache_usage})",
                      "KV cache usage of the fullest engine (a fraction 0..1, despite the name).", "gauge"),
        RecordingRule(f"variant:{record_metric(V.running)}:sum", f"sum by (variant) ({V.running})",
                      "Requests in the running batch.", "gauge"),
        RecordingRule(f"variant:{record_metric(V.waiting)}:sum", f"sum by (variant) ({V.waiting})",
                      "Requests waiting to be scheduled.", "gauge"),
    ]


def exporter_rules(window: str) -> list[RecordingRule]:
    """Per variant and task, from the exporter's per-request sums."""
    r = f"rate{window}"
    by, level = "variant, task", "variant_task"
    rates = _rate_rules(level, by, window, (
        ("steps", "", E.spec_steps, "Verify steps with a draft per second (sum of the per-request R)."),
        ("draft_tokens", "", E.draft_tokens, "Draft tokens per second (sum of the per-request D)."),
        ("accepted", "", E.accepted, "Accepted draft tokens per second (sum of the per-request C)."),
        ("per_pos", "position", E.accepted_per_pos, "Steps per second that accepted position p and all before it."),
        ("reaching", "position", E.drafts_reaching,
         "Verify steps per second whose draft had at least p + 1 tokens (vLLM's detailed mode)."),
        ("without_per_step", "", E.steps_without_per_step,
         "Verify steps per second that came without per-step data (vLLM's summary mode)."),
        ("decode", "", E.decode_steps, "Decode steps per second, with or without a draft."),
        ("completion", "", E.completion_tokens, "Output tokens per second (usage.completion_tokens)."),
        ("by_accepted", "accepted", E.spec_steps_by_accepted,
         "Verify steps per second that accepted exactly `accepted` drafts."),
        ("requests", "", E.requests, "Requests per second through the tap, every outcome."),
    ))
    names = {key: rule.record for key, rule in rates.items()}
    errors, ok = f'{{outcome=~"{S.error_outcome_regex()}"}}', '{outcome="ok"}'
    identical = '{result="identical"}'
    rules = [
        *rates.values(),
        *_acceptance_rules(level, "specwatch", by, window, names),
        RecordingRule(f"variant_task_position:specwatch_acceptance_of_reached:ratio_{r}",
                      f"{names['per_pos']}\n/\n{_positive(names['reaching'])}\nand on (variant, task)\n"
                      f"({names['without_per_step']} == 0)",
                      "Acceptance of drafts that reached position p: steps accepting p / steps whose draft had "
                      "p + 1 tokens (a draft too short to reach p is no rejection there). Only where no verify "
                      "step of the window came without per-step data (detailed mode throughout).",
                      "ratio"),
        RecordingRule(f"variant_task:specwatch_draft_coverage:ratio_{r}",
                      f"{names['steps']}\n/\n{_positive(names['decode'])}",
                      "Draft coverage: share of decode steps that carried a draft.", "ratio"),
        RecordingRule(f"variant_task:specwatch_tokens_per_decode_step:ratio_{r}",
                      f"1 + {names['accepted']}\n/\n{_positive(names['decode'])}",
                      "Effective tokens per decode step: 1 + accepted drafts / decode steps.", "ratio"),
        RecordingRule(f"variant_task_accepted:specwatch_acceptance_length_share:ratio_{r}",
                      f"{names['by_accepted']}\n/ ignoring (accepted) group_left ()\n{_positive(names['steps'])}",
                      "Acceptance-length distribution: share of verify steps that accepted exactly `accepted` "
                      "drafts.", "ratio"),
        RecordingRule(f"variant_task:specwatch_error:ratio_{r}",
                      f"{_sum_rate(E.requests, by, window, errors)}\n/\n{_positive(names['requests'])}",
                      "Error ratio: upstream errors and bad responses / all requests.", "ratio"),
        RecordingRule(f"variant_task:specwatch_spec_metrics_missing:ratio_{r}",
                      f"{_sum_rate(E.spec_metrics_missing, by, window)}\n/\n"
                      f"{_positive(_sum_rate(E.requests, by, window, ok))}",
                      "Share of ok responses that came without metrics.speculative_decoding.", "ratio"),
        RecordingRule(f"variant_task:specwatch_output_tokens_per_request_second:ratio_{r}",
                      f"{names['completion']}\n/\n{_positive(_sum_rate(E.e2e + '_sum', by, window))}",
                      "Output tokens per second of request time (a per-stream speed, independent of the traffic "
                      "share).", "ratio"),
        RecordingRule(f"variant_task:specwatch_mirror_identical:ratio_{r}",
                      f"{_sum_rate(E.mirror_outputs, by, window, identical)}\n/\n"
                      f"{_positive(_sum_rate(E.mirror_outputs, by, window))}",
                      "Mirror mode, greedy requests: share whose candidate output equalled the primary's.", "ratio"),
    ]
    whats = {E.ttft: "Client-side TTFT (at the tap)", E.tpot: "Client-side TPOT", E.itl: "Client-side ITL",
             E.e2e: "Client-side end-to-end latency"}
    for metric in E.latencies():
        rules += _latency_rules(level, by, metric, window, whats[metric])
    return rules


def _candidate_over_baseline(series: str, extra: str = "", op: str = "/") -> str:
    return (f'max without (variant) ({series}{{variant="{S.candidate}"{extra}}})\n{op}\n'
            f'max without (variant) ({series}{{variant="{S.baseline}"{extra}}})')


# The canary's candidate / baseline latency ratios: (histogram, quantile, what), read by the canary alerts.
CANARY_LATENCIES = ((E.tpot, "0.95", "TPOT p95"), (E.ttft, "0.95", "TTFT p95"), (E.itl, "0.99", "ITL p99"))


def cross_rules(window: str) -> list[RecordingRule]:
    """Reconciliation of the exporter with vLLM, and the canary's candidate-versus-baseline figures."""
    r = f"rate{window}"
    rules = [
        RecordingRule(f"variant:specwatch_reconciliation:ratio_{r}",
                      f"{_sum_rate(E.spec_steps, 'variant', window)}\n/\n"
                      f"{_positive(f'variant:{record_metric(V.drafts)}:{r}')}",
                      "Exporter verify steps / vLLM drafts: 1.0 when all traffic passes the exporter with n = 1.",
                      "ratio"),
    ]
    for metric, q, what in CANARY_LATENCIES:
        series = f"variant_task_quantile:{metric}:histogram_quantile_{r}"
        rules.append(RecordingRule(f"task_quantile:{metric}:candidate_over_baseline_{r}",
                                   _candidate_over_baseline(series, f',quantile="{q}"'),
                                   f"Canary: candidate / baseline client-side {what} per task (> 1 is slower).",
                                   "ratio"))
    rules += [
        RecordingRule(f"task:specwatch_output_tokens_per_request_second:candidate_over_baseline_{r}",
                      _candidate_over_baseline(f"variant_task:specwatch_output_tokens_per_request_second:ratio_{r}"),
                      "Canary: candidate / baseline output tokens per second of request time per task (> 1 is "
                      "faster).", "ratio"),
        RecordingRule(f"task:specwatch_acceptance_rate:candidate_minus_baseline_{r}",
                      _candidate_over_baseline(f"variant_task:specwatch_acceptance_rate:ratio_{r}", op="-"),
                      "Canary: candidate minus baseline draft acceptance rate per task (both must speculate).",
                      "ratio"),
    ]
    return rules


K_VALUE = "k:specwatch_num_speculative_tokens:constant"


def k_rules() -> list[RecordingRule]:
    """The draft lengths k = 0 .. max_expected_k as numbers, so a rule can turn the winning `k` label into a value."""
    return [RecordingRule(K_VALUE, f"vector({k})", "The draft length k as a value (label k = value).", "gauge",
                          {"k": str(k)})
            for k in range(S.max_expected_k + 1)]


def expected_tokens_record(window: str) -> str:
    return f"variant_task_k:specwatch_expected_tokens_per_step:ratio_rate{window}"


def best_k_record(window: str) -> str:
    return f"variant_task:specwatch_best_k:argmax_rate{window}"


def tuning_rules(window: str) -> list[RecordingRule]:
    """What each draft length k would buy (expected tokens per verify step, from the per-position acceptance), and,
    when a cost table is loaded (`specwatch.promconfig.cost_rules`), the k that maximises a stream's output tokens per
    second at the current running batch size.

    E[tokens per step | k] = 1 + sum over positions p < k of P(accepted length >= p + 1). Only positions the
    deployment drafted have data: for a k beyond the deployed draft length the rule gives no sample (the count of
    positions present must be k), never the sum of the positions that happen to exist.
    """
    r = f"rate{window}"
    unconditional = f"variant_task_position:specwatch_acceptance_unconditional:ratio_{r}"
    coverage = f"variant_task:specwatch_draft_coverage:ratio_{r}"
    expected = expected_tokens_record(window)
    running = f"variant:{record_metric(V.running)}:avg_over_time{window}"
    cost_now = f"variant_k:specwatch_step_cost_seconds:at_running_batch_{r}"
    per_stream = f"variant_task_k:specwatch_expected_stream_tokens_per_second:ratio_{r}"
    c = S.cost_table
    rules = [
        RecordingRule(running, f"avg by (variant) (avg_over_time({V.running}[{window}]))",
                      "Running batch size per engine: requests in the running batch, averaged over the window and "
                      "over the variant's engines and replicas (the batch one step verifies).", "gauge"),
        RecordingRule(expected, f"1 + 0 * max without (position) ({unconditional}{{position=\"0\"}})",
                      "Expected tokens per verify step at k = 0 (no speculation): 1, for each variant and task "
                      "with acceptance data.", "ratio", {"k": "0"}),
    ]
    for k in range(1, S.max_expected_k + 1):
        positions = f'{unconditional}{{position=~"{"|".join(str(p) for p in range(k))}"}}'
        rules.append(RecordingRule(
            expected, f"(1 + sum without (position) ({positions}))\nand on (variant, task)\n"
                      f"(count without (position) ({positions}) == {k})",
            f"Expected tokens per verify step at k = {k}: 1 + the sum of P(accepted >= i) for i = 1..{k}; "
            f"nothing unless positions 0..{k - 1} all have data.", "ratio", {"k": str(k)}))
    rules += [
        RecordingRule(cost_now,
                      f"max without (batch_size) (\n  {c.step_cost}\n  and on (variant, batch_size)\n"
                      f"  ({c.batch_lower} < on (variant) group_left () {running})\n"
                      f"  and on (variant, batch_size)\n"
                      f"  ({c.batch_upper} >= on (variant) group_left () {running})\n)",
                      "Cost table: the median step time per k at the table's batch size whose range holds the "
                      "current running batch (none without a cost table).", "ratio"),
        RecordingRule(per_stream,
                      f"(1 + ({expected} - 1) * on (variant, task) group_left () {coverage})\n"
                      f"/ on (variant, k) group_left ()\n{cost_now}",
                      "Expected output tokens per second of one stream at k and the current running batch: tokens "
                      "per decode step (1 + draft coverage * (E[tokens per step | k] - 1)) / step time.", "ratio"),
        RecordingRule(best_k_record(window),
                      f"min by (variant, task) (\n  {K_VALUE}\n  + on (k) group_right ()\n"
                      f"  0 * ({per_stream} == on (variant, task) group_left () "
                      f"max by (variant, task) ({per_stream}))\n)",
                      "Best k at the current running batch size: the k with the most output tokens per second "
                      "per stream (the smallest on a tie).", "ratio"),
    ]
    return rules


def recording_groups() -> list[Group]:
    """One group per window, ordered so each rule reads only series recorded before it in its group."""
    groups = [Group(f"specwatch.{w.rate}", tuple(vllm_rules(w.duration) + exporter_rules(w.duration)
                                                   + cross_rules(w.duration) + tuning_rules(w.duration)))
              for w in S.windows]
    return [Group("specwatch.gauges", tuple(vllm_gauge_rules() + k_rules())), *groups]


def recorded(name: str) -> str:
    """`name`, when a recording rule records it: what a query of another system (Argo Rollouts, Flagger) reads is a
    rule of ours by its own name, and a renamed or dropped rule fails the generator instead of the rollout."""
    names = {rule.record for group in recording_groups() for rule in group.rules}
    if name not in names:
        raise KeyError(f"no recording rule records {name!r}")
    return name


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(groups: list[Group]) -> str:
    out = ["# Generated by specwatch/promconfig/rules.py (make generate); edit that, not this file.",
           f"# Windows: {S.fast.duration} for live panels, {S.slow.duration} for alerts, canary ratios and reports.",
           "groups:"]
    for group in groups:
        out += [f"  - name: {group.name}", "    rules:"]
        for rule in group.rules:
            out.append(f"      # {rule.comment}")
            out.append(f"      - record: {rule.record}")
            out.append("        expr: |-")
            out += [f"          {line}" for line in rule.expr.splitlines()]
            if rule.labels:
                out.append("        labels:")
                out += [f"          {k}: {_quote(v)}" for k, v in rule.labels.items()]
    return "\n".join(out) + "\n"


def rule_files() -> dict[str, str]:
    """Every rule file Prometheus loads, by file name: the recording rules and the alerts."""
    return {RULES_FILE: render(recording_groups()), alerts.ALERTS_FILE: alerts.render()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.promconfig.rules", description=__doc__)
    parser.add_argument("--out", type=Path, default=resources.RULES,
                        help=f"folder for {RULES_FILE} and {alerts.ALERTS_FILE}")
    parser.add_argument("--check", action="store_true", help="exit 3 when a committed file is not current")
    args = parser.parse_args(argv)
    return max(write_or_check(args.out / name, text, args.check) for name, text in rule_files().items())


if __name__ == "__main__":
    sys.exit(main())
