"""The acceptance dashboard: how well speculation works per task and variant, and whether the data holds."""

from __future__ import annotations

from specwatch.grafana.board import Dashboard, Section
from specwatch.grafana.panels import (
    BY_VT,
    COUNT,
    GREEN,
    NONE,
    ORANGE,
    RATIO,
    RED,
    STEPS_PER_S,
    TOKENS_PER_S,
    TOKENS_PER_STEP,
    VT,
    V,
    barchart,
    heatmap,
    per_variant_task,
    stat,
    targets,
    thresholds,
    timeseries,
)
from specwatch.monitoring import MONITORING, in_words, percent
from specwatch.promconfig.rules import best_k_record, expected_tokens_record

S, A = MONITORING, MONITORING.alerts
UID = "specwatch-acceptance"
LIVE = S.fast.rate   # time series: the live window
STEADY = S.slow.rate  # bar charts: a steadier snapshot of the last five minutes
FAST = S.fast.duration
# red below the collapse alerts' threshold
ACCEPTANCE_STEPS = thresholds(RED, (A.task_acceptance_collapsed.level, ORANGE), (0.3, GREEN))
VT_SERIES = ("variant", "task")


def _per_task() -> Section:
    collapsed = A.task_acceptance_collapsed
    return Section(f"Per task and variant (exporter, {FAST})", [
        timeseries("Acceptance rate", "Accepted draft tokens / draft tokens per variant and task over the last "
                   f"minute, summed over requests before dividing. Higher is better; below {percent(collapsed.level)} "
                   f"for {in_words(collapsed.for_)} fires {collapsed.name}. A variant that does not speculate has no "
                   "line.",
                   per_variant_task(f"specwatch_acceptance_rate:ratio_{LIVE}"),
                   RATIO, min_=0, max_=1, steps=ACCEPTANCE_STEPS),
        timeseries("Mean acceptance length", "Tokens each verify step emits, the bonus token included: 1 + accepted "
                   "drafts / verify steps. 1 means every draft was rejected; the ceiling is k + 1 for k "
                   "speculative tokens.",
                   per_variant_task(f"specwatch_mean_acceptance_length:ratio_{LIVE}"),
                   TOKENS_PER_STEP, min_=1, decimals=2),
        timeseries("Draft coverage", "Share of decode steps that carried a draft (verify steps / decode steps). "
                   "An n-gram proposer drafts only when it finds a match, so coverage is below 100 % and differs "
                   "by task; a draft model covers every step.",
                   per_variant_task(f"specwatch_draft_coverage:ratio_{LIVE}"),
                   RATIO, min_=0, max_=1),
        timeseries("Tokens per decode step", "What speculation buys per engine step: 1 + accepted drafts / all "
                   "decode steps (with or without a draft). 1.0 is plain decoding; the speed-up in tokens per step "
                   "before the cost of drafting and verifying.",
                   per_variant_task(f"specwatch_tokens_per_decode_step:ratio_{LIVE}"),
                   TOKENS_PER_STEP, min_=1, decimals=2),
    ])


def _server() -> Section:
    accepted, drafted = f"{S.vllm.accepted}{{{V}}}[{FAST}]", f"{S.vllm.draft_tokens}{{{V}}}[{FAST}]"
    per_replica = (f"sum by (variant, instance) (rate({accepted}))"
                   f" / (sum by (variant, instance) (rate({drafted})) > 0)")
    return Section(f"Server side (vLLM, per variant, {FAST})", [
        timeseries("Server acceptance rate", "vLLM's own counters: accepted / draft tokens per variant, summed "
                   "over engines and replicas. Covers all traffic of the server, including requests that bypass "
                   "the exporter.",
                   targets((f"variant:vllm_spec_decode_acceptance_rate:ratio_{LIVE}{{{V}}}", "{{variant}}")),
                   RATIO, w=8, min_=0, max_=1, steps=ACCEPTANCE_STEPS),
        timeseries("Server mean acceptance length", "1 + accepted tokens / drafts from vLLM's counters per "
                   "variant (the figure vLLM logs as 'Mean acceptance length').",
                   targets((f"variant:vllm_spec_decode_mean_acceptance_length:ratio_{LIVE}{{{V}}}", "{{variant}}")),
                   TOKENS_PER_STEP, w=8, min_=1, decimals=2),
        timeseries("Draft and accepted tokens per second", "Server throughput of speculation per variant: draft "
                   "tokens proposed and accepted per second. The gap between the two is verification work that "
                   "bought nothing.",
                   targets((f"variant:vllm_spec_decode_num_draft_tokens:{LIVE}{{{V}}}", "drafted {{variant}}"),
                           (f"variant:vllm_spec_decode_num_accepted_tokens:{LIVE}{{{V}}}", "accepted {{variant}}")),
                   TOKENS_PER_S, w=8, min_=0),
        timeseries("Acceptance rate per replica", "The same ratio per scrape target (a vLLM pod or process): "
                   "accepted / draft tokens of each replica over the last minute. Replicas of one variant serve "
                   "the same config, so their lines should overlap; one that stays apart has a different draft, "
                   "model revision or traffic.",
                   targets((per_replica, "{{variant}} · {{instance}}")),
                   RATIO, min_=0, max_=1, steps=ACCEPTANCE_STEPS),
        timeseries("Replica / its variant", "Each replica's acceptance rate divided by its variant's (all replicas "
                   "summed), over the last minute. 1.0 is the peer average; a replica far from 1 for long is the one "
                   "to inspect.",
                   targets((f"({per_replica}) / ignoring (instance) group_left () "
                            f"variant:vllm_spec_decode_acceptance_rate:ratio_{LIVE}{{{V}}}",
                            "{{variant}} · {{instance}}")),
                   RATIO, min_=0, decimals=2),
    ])


def _decay() -> Section:
    how = ("Bars by draft position (0 = the first drafted token), over the last 5 minutes. ")
    return Section(f"Position-wise decay ({S.slow.duration})", [
        barchart("Acceptance by position of drafts that reached it, per task", how + "Height: verify steps "
                 "that accepted at least position + 1 drafts / verify steps whose draft had at least position + 1 "
                 "tokens (exporter, per variant and task, from vLLM's per_step_drafted). Where drafts vary in "
                 "length (suffix, n-gram, a per-batch-size k) a short draft is no rejection at a position it never "
                 "reached; with a fixed k this equals the per-draft bars below. Only for a server run with "
                 "`--per-request-spec-decode-metrics detailed` (empty under summary).",
                 f"variant_task_position:specwatch_acceptance_of_reached:ratio_{STEADY}{{{VT}}}", "position",
                 VT_SERIES, RATIO, max_=1),
        barchart("Acceptance by position per draft, per task", how + "Height: share of all verify steps that "
                 "accepted at least position + 1 drafts (exporter, per variant and task; every mode). A draft too "
                 "short to reach a position counts as a rejection there, so deep positions read low where drafts "
                 "vary in length. It falls with the position; the sum over positions is the mean acceptance length "
                 "minus 1.",
                 f"variant_task_position:specwatch_acceptance_unconditional:ratio_{STEADY}{{{VT}}}", "position",
                 VT_SERIES, RATIO, max_=1),
        barchart("Conditional acceptance by position, per task", how + "Height: P(position p accepted | position "
                 "p - 1 accepted): steps accepting p / steps accepting p - 1, per variant and task (a step "
                 "that accepted its whole short draft counts as stopping there). Flat bars mean the drafter is "
                 "as good deep into the draft as at its start; a falling profile says fewer speculative tokens "
                 "would do.",
                 f"variant_task_position:specwatch_acceptance_conditional:ratio_{STEADY}{{{VT}}}", "position",
                 VT_SERIES, RATIO, max_=1),
        barchart("Acceptance by position per draft, server-wide", how + "vLLM's per-position counter / its "
                 "drafts, per variant: all traffic of the server, summed over engines. Per draft: vLLM counts no "
                 "drafted tokens by position, so a short draft counts as a rejection at the positions it missed.",
                 f"variant_position:vllm_spec_decode_acceptance_unconditional:ratio_{STEADY}{{{V}}}", "position",
                 ("variant",), RATIO, max_=1),
        barchart("Conditional acceptance by position, server-wide", how + "vLLM's counters, per variant: "
                 "P(position p accepted | p - 1 accepted); position 0 is the unconditional rate.",
                 f"variant_position:vllm_spec_decode_acceptance_conditional:ratio_{STEADY}{{{V}}}", "position",
                 ("variant",), RATIO, max_=1),
    ])


def _draft_length() -> Section:
    slow = S.slow.duration
    per_stream = f"variant_task_k:specwatch_expected_stream_tokens_per_second:ratio_{STEADY}{{{VT}}}"
    return Section(f"Draft length: what each k would buy ({slow})", [
        barchart("Expected tokens per step by k", f"Bars by draft length k, over the last {in_words(slow)}: "
                 "1 + P(accepted >= 1) + ... + P(accepted >= k), the tokens a verify step would emit with k "
                 "speculative tokens, from the unconditional acceptance by position (per variant and task). "
                 "k = 0 is plain decoding (1). Where the bars flatten, more draft tokens buy nothing; a k beyond "
                 "the deployed draft length has no bar (no data, never extrapolated).",
                 f"{expected_tokens_record(slow)}{{{VT}}}", "k", VT_SERIES, TOKENS_PER_STEP),
        stat("Best k at the current running batch size", "The draft length with the most output tokens per "
             "second per stream at the running batch size of the last "
             f"{in_words(slow)} (per engine), per variant and task: tokens per decode step for each k (the bars "
             "beside, weighted by draft coverage) / the step time the loaded cost table gives for that k at "
             "that batch size. Empty until a cost table from `specwatch tune` is loaded (docs/prometheus.md, "
             "'Loading a cost table') and traffic flows; 0 means speculation does not pay there.",
             targets((f"{best_k_record(slow)}{{{VT}}}", BY_VT)), NONE, w=12, h=8, decimals=0,
             no_value="No cost table loaded"),
        timeseries("Expected output tokens per second per stream by k", "What the best-k choice compares, per "
                   "variant, task and k: tokens per decode step / the cost table's step time at the current "
                   "running batch size. The highest line is the best k; how far the others are below it is what "
                   "a fixed k gives away. Empty without a cost table.",
                   targets((per_stream, "{{variant}} · {{task}} · k={{k}}")), TOKENS_PER_S, w=24, min_=0),
    ])


def _distributions() -> Section:
    return Section("Distributions", [
        barchart("Acceptance-length distribution", "Share of verify steps that accepted exactly 0, 1, ... k drafts "
                 "over the last 5 minutes, per variant and task (the bars of one series sum to 100 %). A tall bar "
                 "at 0 is wasted verification; a tall bar at k means k could grow.",
                 f"variant_task_accepted:specwatch_acceptance_length_share:ratio_{STEADY}{{{VT}}}", "accepted",
                 VT_SERIES, RATIO, max_=1),
        heatmap("Per-request acceptance rate", "Each column: how many requests in the interval ended with a "
                "per-request acceptance rate (C / D) in each 10 % bucket; darker is more requests. Two bands mean "
                "two populations (say code that repeats its prompt and chat that does not) behind one average. "
                "Requests that drafted nothing are not counted.",
                f'sum by (le) (increase(specwatch_request_acceptance_rate_bucket{{{VT}}}[$__rate_interval]))', RATIO),
    ])


def _quality() -> Section:
    drift = A.reconciliation_drift
    reconciled = thresholds(RED, (round(1 - drift.level, 9), GREEN), (round(1 + drift.level, 9), RED))
    return Section("Data quality", [
        timeseries("Reconciliation: exporter / vLLM", "Verify steps the exporter summed from per-request fields / "
                   f"drafts vLLM counted, per variant ({FAST}). 100 % when all the server's traffic passes the "
                   f"exporter with n = 1; below when clients bypass it; a lasting gap beyond {percent(drift.level)} "
                   f"fires {drift.name}. Ignores the task filter.",
                   targets((f"variant:specwatch_reconciliation:ratio_{LIVE}{{{V}}}", "{{variant}}")),
                   RATIO, w=8, steps=reconciled),
        timeseries("Verify steps: exporter vs vLLM", "The two sides of the reconciliation as rates: the exporter's "
                   "verify steps (summed over tasks) and vLLM's drafts, per variant. The lines overlap when the "
                   "exporter sees everything.",
                   targets((f"sum by (variant) (variant_task:specwatch_spec_steps:{LIVE}{{{V}}})",
                            "exporter {{variant}}"),
                           (f"variant:vllm_spec_decode_num_drafts:{LIVE}{{{V}}}", "vLLM {{variant}}")),
                   STEPS_PER_S, w=8, min_=0),
        timeseries("Responses without spec-decode metrics", "Share of ok responses that came without "
                   f"metrics.speculative_decoding ({FAST}). Expected on a variant that does not speculate; on a "
                   "speculative one it means the per-request flag is off, a stop string cut the stream, or a gateway "
                   "dropped the field, and per-task acceptance is blind.",
                   per_variant_task(f"specwatch_spec_metrics_missing:ratio_{LIVE}"), RATIO, w=8, min_=0, max_=1),
        stat("Missing spec-decode metrics (count)", "How many ok responses in the dashboard's time range had no "
             "metrics.speculative_decoding, per variant and task. 0 on speculative variants is the healthy state.",
             targets((f"sum by (variant, task) (increase({S.exporter.spec_metrics_missing}{{{VT}}}[$__range]))",
                      BY_VT)), COUNT, w=24, h=5, decimals=0),
    ])


def dashboard() -> Dashboard:
    return Dashboard(UID, "specwatch / Speculative decoding — acceptance",
                     "Acceptance rate, mean acceptance length, position-wise decay and distributions per task and "
                     "variant (exporter) and per server (vLLM), with the reconciliation of the two.",
                     [_per_task(), _server(), _decay(), _draft_length(), _distributions(), _quality()])
