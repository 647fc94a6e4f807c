"""The canary dashboard: candidate against baseline per task, the ratio rules, the verdict and the alerts.

The verdict uses the thresholds and traffic guard of the canary alerts (`specwatch.monitoring`, the
settings both are generated from) on the same slow-window ratio rules, without the alerts' `for:`:
it is the state now, the alerts say whether it lasted.
"""

from __future__ import annotations

from specwatch.canary.policy import DEFAULT_MARGINAL_SCORE, DEFAULT_PASS_SCORE
from specwatch.exporter.metrics import CANARY_VERDICTS
from specwatch.grafana.board import Dashboard, Section
from specwatch.grafana.panels import (
    BLUE,
    BY_VT,
    GREEN,
    ORANGE,
    RATIO,
    RED,
    SECONDS,
    TIMES,
    Json,
    T,
    alertlist,
    stat,
    targets,
    thresholds,
    timeseries,
)
from specwatch.monitoring import MONITORING, in_words
from specwatch.promconfig.alerts import candidate_traffic, from_policy

S, A = MONITORING, MONITORING.alerts
UID = "specwatch-canary"
WINDOW = S.slow.rate  # the window of the canary alerts
TPOT, ITL = from_policy(A.tpot_regression), from_policy(A.itl_regression)  # the levels of the canary alerts
MIN_TRAFFIC = f"{A.min_candidate_requests_per_minute:g}"
PAIR = f'variant=~"{S.baseline}|{S.candidate}",{T}'


def verdict_expr() -> str:
    """Per task: 0 (go) when the canary ratios are within their thresholds, 1 (no-go) when one is above.

    The ITL ratio counts only where the baseline drafts too (the policy's speculation_vs_speculation, as
    for the ITL alert); against a baseline that does not speculate it is a caution, drawn but not a NO-GO.
    No sample when the candidate lacks traffic or no ratio is a number, as for the alerts.
    """
    tpot = f"task_quantile:specwatch_tpot_seconds:candidate_over_baseline_{WINDOW}{{{T}}}"
    itl = f"task_quantile:specwatch_itl_seconds:candidate_over_baseline_{WINDOW}{{{T}}}"
    drafts = f'sum by (task) (variant_task:specwatch_draft_tokens:{WINDOW}{{variant="{S.baseline}",{T}}}) > 0'
    # `x == x` drops NaN ratios (a side without requests in the window): no verdict from them, rather than GO
    return (f"max by (task) (\n  (({tpot} == {tpot}) > bool {TPOT.level:g})\n  or\n"
            f"  ((({itl} == {itl}) > bool {ITL.level:g}) and on (task) ({drafts}))\n)\n"
            f"and on (task)\n({candidate_traffic(T)} >= {MIN_TRAFFIC})")


def _ratio(series: str) -> list[Json]:
    return targets((f"{series}:candidate_over_baseline_{WINDOW}{{{T}}}", "{{task}}"))


def _side_by_side(metric: str, quantile: str, title: str, what: str) -> Json:
    return timeseries(f"{title}: baseline vs candidate", what + f" Client side (exporter), {S.slow.duration} "
                      "window, one line per variant for the task of this row.",
                      targets((f'variant_task_quantile:{metric}:histogram_quantile_{WINDOW}{{{PAIR},quantile="{quantile}"}}',
                               "{{variant}}")), SECONDS, w=6, min_=0)


def _per_task() -> Section:
    return Section("Task $task: baseline vs candidate", [
        _side_by_side(S.exporter.tpot, "0.95", "TPOT p95", "Time per output token, 95th percentile."),
        _side_by_side(S.exporter.itl, "0.99", "ITL p99", "Inter-token latency, 99th percentile: the "
                      "stalls a streaming reader notices."),
        _side_by_side(S.exporter.ttft, "0.95", "TTFT p95", "Time to first token, 95th percentile."),
        timeseries("Acceptance rate: baseline vs candidate", "Accepted / draft tokens per variant for the task of "
                   f"this row ({S.slow.duration}). A baseline without speculation has no line.",
                   targets((f"variant_task:specwatch_acceptance_rate:ratio_{WINDOW}{{{PAIR}}}", "{{variant}}")),
                   RATIO, w=6, min_=0, max_=1),
    ], repeat="task")


def _ratios() -> Section:
    limits = thresholds(GREEN, (TPOT.level, RED))
    return Section(f"Candidate / baseline ({S.slow.duration})", [
        timeseries("TPOT p95 ratio", f"Candidate / baseline client-side TPOT p95 per task. Below 1 the candidate "
                   f"is faster; above {TPOT.level:g} (dashed) for {in_words(TPOT.for_)} fires {TPOT.name}.",
                   _ratio("task_quantile:specwatch_tpot_seconds"),
                   TIMES, w=6, steps=limits, decimals=2),
        timeseries("ITL p99 ratio", f"Candidate / baseline client-side ITL p99 per task. Speculation raises ITL "
                   f"(several tokens per chunk); above {ITL.level:g} (dashed) for {in_words(ITL.for_)} fires "
                   f"{ITL.name} where the baseline speculates too (a caution against one that does not).",
                   _ratio("task_quantile:specwatch_itl_seconds"),
                   TIMES, w=6, steps=thresholds(GREEN, (ITL.level, RED)), decimals=2),
        timeseries("TTFT p95 ratio", "Candidate / baseline client-side TTFT p95 per task. Speculation should "
                   "leave TTFT about equal; well above 1 points at the draft model's prefill or a smaller KV cache.",
                   _ratio("task_quantile:specwatch_ttft_seconds"),
                   TIMES, w=6, decimals=2),
        timeseries("Per-stream speed ratio", "Candidate / baseline output tokens per second of request time per "
                   "task. Above 1 the candidate streams faster: what speculation is for.",
                   _ratio("task:specwatch_output_tokens_per_request_second"), TIMES, w=6, decimals=2),
    ])


def _verdict() -> Section:
    return Section("Verdict", [
        stat("Current verdict", f"Per task, now: GO when the candidate's TPOT p95 is at most {TPOT.level:g}x "
             f"and its ITL p99 at most {ITL.level:g}x the baseline's ({S.slow.duration}, client side), NO-GO when "
             f"either is above (ITL only where the baseline speculates too: against one that does not, longer "
             f"gaps are the bursts of speculation, a caution in the canary policy). The alerts fire only when a "
             f"NO-GO lasts {in_words(TPOT.for_)}. No value: the candidate has less than {MIN_TRAFFIC} request per "
             "minute, or a side has no latency data.",
             targets((verdict_expr(), "{{task}}")), "none", w=8, h=8, steps=thresholds(GREEN, (1, RED)),
             no_value="not enough traffic",
             mappings=[{"type": "value", "options": {"0": {"text": "GO", "color": GREEN, "index": 0},
                                                      "1": {"text": "NO-GO", "color": RED, "index": 1}}}]),
        alertlist("Firing and pending alerts", "The Prometheus alerts of specwatch-alerts.yml (and any other rule "
                  "Grafana sees) that are pending or firing, with their instances. Empty is the healthy state; "
                  "each alert's runbook_url leads to its section of the runbook.", w=10),
        timeseries("Rerouted around a down upstream", "Requests per second the split gave a variant known down "
                   "(its health probe failing, or requests in a row unable to reach it) and the exporter forwarded to "
                   "another instead, by from and to. Pinned requests and the mirror are never rerouted, nor "
                   "mirrored once rerouted; requests in flight when it went down count as upstream errors. Zero is "
                   "the healthy state.",
                   targets((f"sum by (from, to) (rate(specwatch_rerouted_total[{S.slow.duration}]))",
                            "{{from}} -> {{to}}")), "reqps", w=6, h=8, min_=0),
        stat("In the split", "1 while the variant takes its share of the split; 0 while the exporter routes "
             "around it (down until its probe has answered, or without a health endpoint its requests have "
             "failed no more, for up_after_seconds; a variant down again soon after coming back waits twice as "
             "long, up to up_after_max_seconds).",
             targets((f"min by (variant) ({S.exporter.upstream_routable})", "{{variant}}")), "none", w=4, h=8,
             steps=thresholds(RED, (1, GREEN)),
             mappings=[{"type": "value", "options": {"0": {"text": "routed around", "color": RED, "index": 0},
                                                      "1": {"text": "in the split", "color": GREEN, "index": 1}}}]),
        timeseries("Mirror: identical outputs", "Mirror mode with greedy requests (temperature 0): share of "
                   f"requests whose candidate output equalled the baseline's, per task ({S.slow.duration}). "
                   "Speculative decoding is lossless, so anything well below 100 % points at a different model, "
                   "tokenizer or sampling setup on the candidate. No line outside mirror mode.",
                   targets((f'variant_task:specwatch_mirror_identical:ratio_{WINDOW}{{{T}}}', BY_VT)),
                   RATIO, w=6, h=8, min_=0, max_=1, steps=thresholds(RED, (0.9, ORANGE), (0.99, GREEN))),
    ])


VERDICT_COLOURS = {"pass": GREEN, "marginal": ORANGE, "fail": RED, "insufficient": BLUE}


def pushed_verdict_expr() -> str:
    """The verdict `specwatch canary --push-to` set last, per task, as its index in CANARY_VERDICTS."""
    arms = [f'({S.exporter.canary_verdict}{{{T},verdict="{v}"}} == 1) * 0 + {i}' for i, v in enumerate(CANARY_VERDICTS)]
    return "max by (task) (" + " or ".join(arms) + ")"


def _pushed() -> Section:
    pass_score, marginal_score = DEFAULT_PASS_SCORE, DEFAULT_MARGINAL_SCORE
    return Section("Statistical verdict (specwatch canary)", [
        stat("Pushed verdict", "The verdict `specwatch canary --push-to EXPORTER` computed last per task from "
             "per-request samples (Mann-Whitney U, Hodges-Lehmann intervals, error-ratio test; Kayenta-style "
             "pass / marginal / fail), held by the exporter until the next push. No value: nothing pushed since "
             "the exporter started.",
             targets((pushed_verdict_expr(), "{{task}}")), "none", w=12, h=6, no_value="nothing pushed",
             mappings=[{"type": "value", "options": {str(i): {"text": v.upper(), "color": VERDICT_COLOURS[v],
                                                              "index": i}
                                                     for i, v in enumerate(CANARY_VERDICTS)}}]),
        stat("Canary score", f"The score of the last push per task, 0..100: the share of the policy's metrics "
             f"that passed, weighted. The default policy passes at {pass_score:g} and calls {marginal_score:g} "
             "and above marginal.",
             targets((f"{S.exporter.canary_score}{{{T}}}", "{{task}}")), "none", w=12, h=6,
             steps=thresholds(RED, (marginal_score, ORANGE), (pass_score, GREEN)), no_value="nothing pushed",
             decimals=0),
    ])


def dashboard() -> Dashboard:
    return Dashboard(UID, "specwatch / Canary: candidate vs baseline",
                     "Candidate against baseline per task: side-by-side latencies and acceptance, the "
                     "candidate / baseline ratios, the current go / no-go verdict, the alerts that fire and the "
                     "statistical verdict `specwatch canary` pushed last.",
                     [_verdict(), _pushed(), _ratios(), _per_task()])
