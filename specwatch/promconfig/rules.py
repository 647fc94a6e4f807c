"""The recording rules as data: vLLM's counters and the exporter's, turned into windowed figures.

`prometheus/rules/specwatch-recording.yml` is written from here (`make generate`, or
`python -m specwatch.promconfig.rules --out prometheus/rules`) and a test fails when the committed
file differs from a fresh rendering. Names follow `level:metric:operations`; numerators and
denominators are summed (over engines, replicas and the labels a level drops) before dividing, and
every ratio is a ratio of `rate()` sums over one window, so it never reads a lifetime total and a
counter reset (a server restart) costs at most one scrape interval, in numerator and denominator
alike. A denominator of zero gives no sample (`> 0`), never 0 % or NaN.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specwatch.exporter import labels as exporter_labels
from specwatch.generated import write_or_check

FAST = "1m"  # live panels
SLOW = "5m"  # alerts, canary ratios, reports
WINDOWS = (FAST, SLOW)
QUANTILES = ("0.5", "0.95", "0.99")
# The conditional per-position acceptance shifts the position label by one with label_replace;
# positions beyond this get the unconditional figure only (vLLM configs rarely draft more than 8).
MAX_CONDITIONAL_POSITION = 15
# Canary ratios compare these two variants (the route names of the exporter and the compose file).
BASELINE, CANDIDATE = "baseline", "candidate"
ERROR_OUTCOMES = "|".join(exporter_labels.ERROR_OUTCOMES)

VLLM_LATENCIES = {
    "vllm_time_to_first_token_seconds": "vllm:time_to_first_token_seconds",
    "vllm_request_time_per_output_token_seconds": "vllm:request_time_per_output_token_seconds",
    "vllm_inter_token_latency_seconds": "vllm:inter_token_latency_seconds",
    "vllm_e2e_request_latency_seconds": "vllm:e2e_request_latency_seconds",
}
EXPORTER_LATENCIES = ("specwatch_ttft_seconds", "specwatch_tpot_seconds", "specwatch_itl_seconds",
                      "specwatch_e2e_seconds")


@dataclass(frozen=True)
class Rule:
    record: str
    expr: str
    comment: str
    kind: str  # "rate" (a per-second figure), "ratio" (unitless, reset-proof), "gauge"
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Rule, ...]


def _sum_rate(metric: str, by: str, window: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}{selector}[{window}]))"


def _positive(expr: str) -> str:
    return f"({expr} > 0)"


def _shifted_positions(series: str) -> str:
    """`series` with position p relabelled p + 1, so `x / shifted` divides position p by p - 1."""
    terms = [f'label_replace({series}{{position="{p}"}}, "position", "{p + 1}", "position", ".*")'
             for p in range(MAX_CONDITIONAL_POSITION)]
    return "(\n    " + "\n  or ".join(terms) + "\n)"


def _acceptance_rules(level: str, prefix: str, by: str, window: str, names: dict[str, str]) -> list[Rule]:
    """Rate, mean length, unconditional and conditional per position, from the recorded rates in `names`."""
    r = f"rate{window}"
    per_pos = names["per_pos"]
    unconditional = f"{level}_position:{prefix}_acceptance_unconditional:ratio_{r}"
    return [
        Rule(f"{level}:{prefix}_acceptance_rate:ratio_{r}",
             f"{names['accepted']}\n/\n{_positive(names['draft_tokens'])}",
             "Draft acceptance rate: accepted draft tokens / draft tokens.", "ratio"),
        Rule(f"{level}:{prefix}_mean_acceptance_length:ratio_{r}",
             f"1 + {names['accepted']}\n/\n{_positive(names['steps'])}",
             "Mean acceptance length, bonus token included: 1 + accepted tokens / drafts (verify steps).",
             "ratio"),
        Rule(unconditional,
             f"{per_pos}\n/ ignoring (position) group_left ()\n{_positive(names['steps'])}",
             "P(accepted length >= position + 1): steps accepting position p / drafts.", "ratio"),
        Rule(f"{level}_position:{prefix}_acceptance_conditional:ratio_{r}",
             f"{per_pos}\n/ on ({by}, position)\n({_shifted_positions(per_pos)} > 0)\n"
             f'or\n{unconditional}{{position="0"}}',
             "P(position p accepted | position p - 1 accepted); position 0 is the unconditional rate.",
             "ratio"),
    ]


def _latency_rules(level: str, by: str, record_metric: str, metric: str, window: str,
                   what: str) -> list[Rule]:
    r = f"rate{window}"
    rules = [Rule(f"{level}_quantile:{record_metric}:histogram_quantile_{r}",
                  f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket[{window}])))",
                  f"{what}, quantile {q} of the requests in the window.", "ratio", {"quantile": q})
             for q in QUANTILES]
    rules.append(Rule(f"{level}:{record_metric}:mean_{r}",
                      f"{_sum_rate(metric + '_sum', by, window)}\n/\n"
                      f"{_positive(_sum_rate(metric + '_count', by, window))}",
                      f"{what}, mean (rate of the sum / rate of the count).", "ratio"))
    return rules


def vllm_rules(window: str) -> list[Rule]:
    """Server side, per variant, from vLLM 0.32.0's own families (summed over engines and replicas)."""
    r = f"rate{window}"
    by = "variant"
    names = {
        "steps": f"variant:vllm_spec_decode_num_drafts:{r}",
        "draft_tokens": f"variant:vllm_spec_decode_num_draft_tokens:{r}",
        "accepted": f"variant:vllm_spec_decode_num_accepted_tokens:{r}",
        "per_pos": f"variant_position:vllm_spec_decode_num_accepted_tokens_per_pos:{r}",
    }
    rules = [
        Rule(names["steps"], _sum_rate("vllm:spec_decode_num_drafts_total", by, window),
             "Drafts (verify steps that carried a draft) per second.", "rate"),
        Rule(names["draft_tokens"], _sum_rate("vllm:spec_decode_num_draft_tokens_total", by, window),
             "Draft tokens proposed per second.", "rate"),
        Rule(names["accepted"], _sum_rate("vllm:spec_decode_num_accepted_tokens_total", by, window),
             "Draft tokens accepted per second (the bonus token not included).", "rate"),
        Rule(names["per_pos"],
             _sum_rate("vllm:spec_decode_num_accepted_tokens_per_pos_total", "variant, position", window),
             "Steps per second that accepted the draft at position p (0-based) and all before it.", "rate"),
        *_acceptance_rules("variant", "vllm_spec_decode", by, window, names),
        Rule(f"variant:vllm_generation_tokens:{r}", _sum_rate("vllm:generation_tokens_total", by, window),
             "Output tokens per second.", "rate"),
        Rule(f"variant:vllm_request_success:{r}", _sum_rate("vllm:request_success_total", by, window),
             "Finished requests per second (every finished_reason).", "rate"),
        Rule(f"variant:vllm_num_preemptions:{r}", _sum_rate("vllm:num_preemptions_total", by, window),
             "Preemptions per second (KV cache pressure).", "rate"),
    ]
    whats = {"vllm_time_to_first_token_seconds": "Server TTFT",
             "vllm_request_time_per_output_token_seconds": "Server TPOT",
             "vllm_inter_token_latency_seconds": "Server ITL",
             "vllm_e2e_request_latency_seconds": "Server end-to-end latency"}
    for record_metric, metric in VLLM_LATENCIES.items():
        rules += _latency_rules("variant", by, record_metric, metric, window, whats[record_metric])
    return rules


def vllm_gauge_rules() -> list[Rule]:
    """Window-free server figures per variant."""
    return [
        Rule("variant:vllm_kv_cache_usage_perc:max", "max by (variant) (vllm:kv_cache_usage_perc)",
             "KV cache usage of the fullest engine (a fraction 0..1, despite the name).", "gauge"),
        Rule("variant:vllm_num_requests_running:sum", "sum by (variant) (vllm:num_requests_running)",
             "Requests in the running batch.", "gauge"),
        Rule("variant:vllm_num_requests_waiting:sum", "sum by (variant) (vllm:num_requests_waiting)",
             "Requests waiting to be scheduled.", "gauge"),
    ]


def exporter_rules(window: str) -> list[Rule]:
    """Per variant and task, from the exporter's per-request sums."""
    r = f"rate{window}"
    by = "variant, task"
    names = {
        "steps": f"variant_task:specwatch_spec_steps:{r}",
        "draft_tokens": f"variant_task:specwatch_draft_tokens:{r}",
        "accepted": f"variant_task:specwatch_accepted_tokens:{r}",
        "per_pos": f"variant_task_position:specwatch_accepted_tokens_per_pos:{r}",
    }
    decode = f"variant_task:specwatch_decode_steps:{r}"
    completion = f"variant_task:specwatch_completion_tokens:{r}"
    by_accepted = f"variant_task_accepted:specwatch_spec_steps_by_accepted:{r}"
    requests = f"variant_task:specwatch_requests:{r}"
    errors, ok, identical = f'{{outcome=~"{ERROR_OUTCOMES}"}}', '{outcome="ok"}', '{result="identical"}'
    rules = [
        Rule(names["steps"], _sum_rate("specwatch_spec_steps_total", by, window),
             "Verify steps with a draft per second (sum of the per-request R).", "rate"),
        Rule(names["draft_tokens"], _sum_rate("specwatch_draft_tokens_total", by, window),
             "Draft tokens per second (sum of the per-request D).", "rate"),
        Rule(names["accepted"], _sum_rate("specwatch_accepted_tokens_total", by, window),
             "Accepted draft tokens per second (sum of the per-request C).", "rate"),
        Rule(names["per_pos"], _sum_rate("specwatch_accepted_tokens_per_pos_total", "variant, task, position", window),
             "Steps per second that accepted position p and all before it.", "rate"),
        Rule(decode, _sum_rate("specwatch_decode_steps_total", by, window),
             "Decode steps per second, with or without a draft.", "rate"),
        Rule(completion, _sum_rate("specwatch_completion_tokens_total", by, window),
             "Output tokens per second (usage.completion_tokens).", "rate"),
        Rule(by_accepted, _sum_rate("specwatch_spec_steps_by_accepted_total", "variant, task, accepted", window),
             "Verify steps per second that accepted exactly `accepted` drafts.", "rate"),
        Rule(requests, _sum_rate("specwatch_requests_total", by, window),
             "Requests per second through the tap, every outcome.", "rate"),
        *_acceptance_rules("variant_task", "specwatch", by, window, names),
        Rule(f"variant_task:specwatch_draft_coverage:ratio_{r}", f"{names['steps']}\n/\n{_positive(decode)}",
             "Draft coverage: share of decode steps that carried a draft.", "ratio"),
        Rule(f"variant_task:specwatch_tokens_per_decode_step:ratio_{r}",
             f"1 + {names['accepted']}\n/\n{_positive(decode)}",
             "Effective tokens per decode step: 1 + accepted drafts / decode steps.", "ratio"),
        Rule(f"variant_task_accepted:specwatch_acceptance_length_share:ratio_{r}",
             f"{by_accepted}\n/ ignoring (accepted) group_left ()\n{_positive(names['steps'])}",
             "Acceptance-length distribution: share of verify steps that accepted exactly `accepted` drafts.",
             "ratio"),
        Rule(f"variant_task:specwatch_error:ratio_{r}",
             f"{_sum_rate('specwatch_requests_total', by, window, errors)}\n/\n{_positive(requests)}",
             "Error ratio: upstream errors and bad responses / all requests.", "ratio"),
        Rule(f"variant_task:specwatch_spec_metrics_missing:ratio_{r}",
             f"{_sum_rate('specwatch_spec_metrics_missing_total', by, window)}\n/\n"
             f"{_positive(_sum_rate('specwatch_requests_total', by, window, ok))}",
             "Share of ok responses that came without metrics.speculative_decoding.", "ratio"),
        Rule(f"variant_task:specwatch_output_tokens_per_request_second:ratio_{r}",
             f"{completion}\n/\n{_positive(_sum_rate('specwatch_e2e_seconds_sum', by, window))}",
             "Output tokens per second of request time (a per-stream speed, independent of the traffic share).",
             "ratio"),
        Rule(f"variant_task:specwatch_mirror_identical:ratio_{r}",
             f"{_sum_rate('specwatch_mirror_outputs_total', by, window, identical)}\n/\n"
             f"{_positive(_sum_rate('specwatch_mirror_outputs_total', by, window))}",
             "Mirror mode, greedy requests: share whose candidate output equalled the primary's.", "ratio"),
    ]
    whats = {"specwatch_ttft_seconds": "Client-side TTFT (at the tap)", "specwatch_tpot_seconds": "Client-side TPOT",
             "specwatch_itl_seconds": "Client-side ITL", "specwatch_e2e_seconds": "Client-side end-to-end latency"}
    for metric in EXPORTER_LATENCIES:
        rules += _latency_rules("variant_task", by, metric, metric, window, whats[metric])
    return rules


def _candidate_over_baseline(series: str, extra: str = "") -> str:
    return (f'max without (variant) ({series}{{variant="{CANDIDATE}"{extra}}})\n/\n'
            f'max without (variant) ({series}{{variant="{BASELINE}"{extra}}})')


def cross_rules(window: str) -> list[Rule]:
    """Reconciliation of the exporter with vLLM, and the canary's candidate-versus-baseline figures."""
    r = f"rate{window}"
    rules = [
        Rule(f"variant:specwatch_reconciliation:ratio_{r}",
             f"{_sum_rate('specwatch_spec_steps_total', 'variant', window)}\n/\n"
             f"{_positive(f'variant:vllm_spec_decode_num_drafts:{r}')}",
             "Exporter verify steps / vLLM drafts: 1.0 when all traffic passes the exporter with n = 1.", "ratio"),
    ]
    for metric, q, what in (("specwatch_tpot_seconds", "0.95", "TPOT p95"),
                            ("specwatch_ttft_seconds", "0.95", "TTFT p95"),
                            ("specwatch_itl_seconds", "0.99", "ITL p99")):
        series = f"variant_task_quantile:{metric}:histogram_quantile_{r}"
        rules.append(Rule(f"task_quantile:{metric}:candidate_over_baseline_{r}",
                          _candidate_over_baseline(series, f',quantile="{q}"'),
                          f"Canary: candidate / baseline client-side {what} per task (> 1 is slower).", "ratio"))
    rules += [
        Rule(f"task:specwatch_output_tokens_per_request_second:candidate_over_baseline_{r}",
             _candidate_over_baseline(f"variant_task:specwatch_output_tokens_per_request_second:ratio_{r}"),
             "Canary: candidate / baseline output tokens per second of request time per task (> 1 is faster).",
             "ratio"),
        Rule(f"task:specwatch_acceptance_rate:candidate_minus_baseline_{r}",
             f'max without (variant) (variant_task:specwatch_acceptance_rate:ratio_{r}{{variant="{CANDIDATE}"}})\n-\n'
             f'max without (variant) (variant_task:specwatch_acceptance_rate:ratio_{r}{{variant="{BASELINE}"}})',
             "Canary: candidate minus baseline draft acceptance rate per task (both must speculate).", "ratio"),
    ]
    return rules


def recording_groups() -> list[Group]:
    """One group per window, ordered so each rule reads only series recorded before it in its group."""
    groups = [Group(f"specwatch.rate{w}", tuple(vllm_rules(w) + exporter_rules(w) + cross_rules(w)))
              for w in WINDOWS]
    return [Group("specwatch.gauges", tuple(vllm_gauge_rules())), *groups]


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render(groups: list[Group]) -> str:
    out = ["# Generated by specwatch/promconfig/rules.py (make generate); edit that, not this file.",
           f"# Windows: {FAST} for live panels, {SLOW} for alerts, canary ratios and reports.",
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


RULES_FILE = "specwatch-recording.yml"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.promconfig.rules", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("prometheus/rules"), help="folder for " + RULES_FILE)
    parser.add_argument("--check", action="store_true", help="exit 3 when the committed file is not current")
    args = parser.parse_args(argv)
    return write_or_check(args.out / RULES_FILE, render(recording_groups()), args.check)


if __name__ == "__main__":
    sys.exit(main())
