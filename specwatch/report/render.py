"""The report as Markdown (`report.md` beside its PNGs) and one self-contained HTML page (PNGs inlined)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from specwatch.acceptance import OF_REACHED, PER_DRAFT
from specwatch.load.results import percentile
from specwatch.report import rounds
from specwatch.report.judgements import TITLES, Judgements
from specwatch.report.plots import DASHBOARD_QUERIES_PNG
from specwatch.report.quality import NEAR_TIE_NATS, code_correct_share, identity
from specwatch.report.results import RunResults
from specwatch.report.verdict import Verdict
from specwatch.stats import median


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _judged(run: RunResults, baseline: str, judgements: Judgements) -> list[str]:
    """Every candidate, task, concurrency and metric: the judge's effect, interval, n, p and finding."""
    rules = judgements.policy.rules
    lines = ["", "## Performance against the baseline (the judge)", "",
             f"Candidate / baseline per request sample: Mann-Whitney U (p) and the Hodges-Lehmann ratio with its "
             f"{rules.confidence:.0%} interval, judged only with at least {rules.min_samples} requests per side "
             f"(alpha {rules.alpha:g}); a change counts when it is significant and its whole interval lies beyond "
             "the tolerance (the canary policy's).", "",
             "In rounds (an interleaved design) the effect is estimated within rounds: each round's requests aligned "
             "on the round's centre before the test, and the rounds' own effects give the second interval, over rounds "
             "(Student's t); a change then needs both intervals beyond the tolerance.", "",
             "| variant | baseline | task | concurrency | metric | effect [CI over requests] | CI over rounds | "
             "n (b / c) | p | finding |",
             "|---|---|---|--:|---|---|---|---|--:|---|"]
    for v, base in run.candidates(baseline):
        if base is None or v.state != "done":
            continue
        for c in sorted(set(v.requests) | set(v.perf)):
            for task in sorted(set(v.requests.get(c, {})) | set(v.perf.get(c, {}))):
                for m in judgements.perf(v.name, task, c):
                    cmp = m.comparison
                    assert cmp is not None
                    e = cmp.effect
                    effect = "-" if e is None else f"{e.estimate:.3f}x [{e.low:.3f}, {e.high:.3f}]"
                    o = cmp.over_rounds
                    rounds = "-" if o is None else f"[{o.low:.3f}, {o.high:.3f}] ({cmp.rounds} rounds)"
                    p = "-" if cmp.p_value is None else f"{cmp.p_value:.2g}"
                    lines.append(f"| {v.name} | {base.name} | {task} | {c} | {TITLES[m.metric]} | {effect} | "
                                 f"{rounds} | {cmp.n_baseline} / {cmp.n_candidate} | {p} | {m.finding} |")
    return lines


def _median(values: list[float]) -> float | None:
    return median(values) if values else None


def _clock(run: RunResults, concurrency: int, task: str) -> bool:
    """TPOT from the servers' own clocks where every variant's server timed every request of the cell: then every
    comparison the judge made in it used that clock (`specwatch.report.judgements.server_clock`)."""
    cells = [v for v in run.variants if v.requests.get(concurrency, {}).get(task)]
    return bool(cells) and all(v.server_clock(concurrency, task) for v in cells)


def _performance(run: RunResults) -> list[str]:
    """Each variant's own requests, per request as the judge reads them (`request_value`): the median (the judge's
    central figure of a side) and TPOT's p95, so the table and the verdicts' lines say the same thing."""
    lines = ["", "## Performance (per request, each variant over its own requests; times in ms)", "",
             "Each figure is over the variant's own measured requests of the cell (warm-ups and replaced rounds left "
             "out), one value per request, as the judge reads them: TPOT = (last token - first token) / (output "
             "tokens - 1) (the server's own mean inter-token latency where every server timed every request: "
             "'server clock'), ITL p95 = the request's own 95th percentile gap, output tok/s = the request's output "
             "tokens / its own time from sending to its last token. p50 is the median over requests, the figure the "
             "judge compares; tok/s is not tokens over a span of the study, which would count other variants' "
             "blocks.", "",
             "| variant | task | concurrency | requests (ok / sent) | TTFT p50 | TPOT p50 | TPOT p95 | ITL p95, p50 "
             "over requests | output tok/s, p50 over requests |",
             "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for v in run.variants:
        for c in sorted(set(v.perf) | set(v.requests)):
            for task in sorted(set(v.perf.get(c, {})) | set(v.requests.get(c, {}))):
                rows = v.requests.get(c, {}).get(task, [])
                clock = _clock(run, c, task)
                ms = {m: [x * 1000 for x in v.samples(c, task, m, clock)] for m in ("tpot", "itl_p95")}
                ttft = [r.ttft_s * 1000 for r in rows if r.ok and r.ttft_s is not None]
                tps = v.samples(c, task, "output_tps", clock)
                tpot = f"{_f(_median(ms['tpot']), '.2f')}{' (server clock)' if clock else ''}"
                lines.append(f"| {v.name} | {task} | {c} | {sum(r.ok for r in rows)} / {len(rows)} | "
                             f"{_f(_median(ttft), '.1f')} | {tpot} | {_f(percentile(ms['tpot'], 95), '.2f')} | "
                             f"{_f(_median(ms['itl_p95']), '.2f')} | {_f(_median(tps), '.2f')} |")
    return lines


def _by_position(run: RunResults) -> list[str]:
    """Acceptance by position of the acceptance pass, under both definitions (`specwatch.acceptance`)."""
    lines = ["", "### Acceptance by position (acceptance pass)", "",
             f"Of drafts that reached it ({OF_REACHED}; from vLLM's `per_step_drafted`, detailed mode) and per "
             f"draft ({PER_DRAFT}). They agree where every draft has k tokens; where drafts vary in length (suffix, "
             "n-gram) only the first says how well a position that was drafted is accepted. '-': summary mode, or "
             "no draft reached the position.", "",
             "| variant | task | steps with per-step data | of drafts that reached it, p = 1..k | drafts reaching p "
             "| per draft, p = 1..k |", "|---|---|--:|---|---|---|"]
    for v in run.variants:
        for task, a in sorted(v.acceptance.items()):
            if not a.steps:
                continue
            reached = " ".join(_f(r) for r in a.per_position_of_reached) if a.detailed else "-"
            lines.append(f"| {v.name} | {task} | {a.detailed_steps}/{a.steps} | {reached} | "
                         f"{' '.join(map(str, a.reached)) if a.detailed else '-'} | "
                         f"{' '.join(_f(r) for r in a.per_position)} |")
    return lines


def _design(run: RunResults) -> list[str]:
    """Which design ran, with how many rounds, and what that lets the verdict cancel."""
    if run.design == "interleaved":
        return [f"**Design: interleaved, {run.rounds} rounds.** Every variant's server was up at once; the performance "
                "pass ran in rounds of one block of requests per variant, the order rotated from round to round, so "
                "whatever slowed the machine in a round slowed every variant of it. Effects are estimated within "
                "rounds; the baseline against itself across rounds is the drift on each line (plot: `drift.png`)."]
    if run.design == "bracketed":
        return [f"**Design: bracketed, {run.rounds} rounds.** One server at a time, started for its block and stopped "
                "after it; the order reversed every other round (baseline, candidates | candidates, baseline | ...), "
                "so the baseline's blocks bracket the others' and a drift linear in time cancels over two rounds. "
                "Effects are estimated within rounds; the baseline against itself across rounds is the drift on "
                "each line (plot: `drift.png`)."]
    return ["**Design: sequential.** Each variant ran alone, one after another: a slowdown of the machine during one "
            "variant's window is neither cancelled nor seen by the comparison. The drift on each line is the "
            "baseline's first half against its second half; a drift beyond the tolerance leaves the verdicts "
            "that rest on it INCONCLUSIVE."]


def _own_baselines(run: RunResults, baseline: str) -> str:
    own = [f"`{v.name}` against `{b.name}`" for v, b in run.candidates(baseline)
           if b is not None and b.name != baseline]
    return f" ({', '.join(own)})" if own else ""


def markdown(run: RunResults, baseline: str, target: int, verdicts: list[Verdict], plots: list[Path],
             judgements: Judgements) -> str:
    """The report's Markdown: `judgements` (the report's judgements) gives the judge's table and the policy it names."""
    policy = judgements.policy
    alone = len(run.variants) == 1  # a one-variant study (`specwatch check-server`): nothing to compare it with
    lines = [f"# specwatch study {run.run_id}", "",
             (f"One variant, `{baseline}`: no baseline to compare it with, so no verdict. " if alone else
              f"Baseline: `{baseline}`{_own_baselines(run, baseline)}; target concurrency: {target}. ") +
             "Acceptance comes from the acceptance pass's "
             "per-request fields (summed first, then divided); performance from Locust at fixed concurrency with "
             "`ignore_eos`; the server figures from exact `/metrics` snapshot differences.", "",
             *_design(run), "",
             "EAGLE-3 runs for real on vLLM's CPU build (a head `specwatch models build --eagle3` trains); MTP exists "
             "only in the simulator (no multi-token-prediction model fits two cores), so an MTP row is simulated.", "",
             "## Variants and backends", "",
             "vLLM: the server's `GET /version`; model runner: V1 or V2 where the server's log said which ('-': not "
             "told). A verdict whose two servers differ in more than their speculative config names it.", "",
             "| variant | state | backend | method | num_gpu_blocks | reconciled | vLLM | model runner |",
             "|---|---|---|---|--:|---|---|---|"]
    for v in run.variants:
        lines.append(f"| {v.name} | {v.state}{': ' + v.error if v.error else ''} | {v.backend or '-'} | "
                     f"{v.method or 'none'} | {v.num_gpu_blocks if v.num_gpu_blocks is not None else '-'} | "
                     f"{'-' if v.reconciled is None else ('yes' if v.reconciled else 'NO')} | "
                     f"{v.server_version or '-'} | {v.model_runner or '-'} |")
    lines += ["", "## Go / no-go", "",
              "GO: TPOT and output tok/s both better than the baseline beyond the tolerance, with evidence; NO-GO: "
              "TPOT or output tok/s worse beyond the tolerance, outputs that differ, or KV capacity lost above the "
              "bound (a worse ITL p95 is a caution: speculation streams in bursts of a verify step); "
              f"INCONCLUSIVE otherwise (fewer than {policy.min_samples} requests per side, no change beyond the "
              "tolerance, an interval that reaches beyond it, or a machine that drifted in a way the design cannot "
              "cancel, or a metric whose requests split into two modes). Each metric: effect [interval], n = "
              "baseline / candidate requests; each line names each side's drift against itself over the study, and "
              "what the two servers differ in beyond speculation.", "",
              "| variant | task | verdict |", "|---|---|---|"]
    lines += [f"| {v.variant} | {v.task} | **{v.label}**: {v.reason} |" for v in verdicts]
    lines += rounds.section(run)
    lines += ["", "## Acceptance (acceptance pass)", "",
              "| variant | task | requests | C | D | R | C/D | 1+C/R | drafted share | histogram 0..k |",
              "|---|---|--:|--:|--:|--:|--:|--:|--:|---|"]
    for v in run.variants:
        for task, a in sorted(v.acceptance.items()):
            lines.append(f"| {v.name} | {task} | {a.requests} | {a.accepted} | {a.drafted} | {a.steps} | "
                         f"{_f(a.acceptance_rate)} | {_f(a.mean_acceptance_length, '.2f')} | "
                         f"{_f(a.drafted_token_share)} | {' '.join(map(str, a.histogram))} |")
    lines += _by_position(run)
    lines += _performance(run)
    lines += _judged(run, baseline, judgements)
    judged_against = {v.name: base for v, base in run.candidates(baseline)}
    lines += ["", "## Quality (greedy outputs of the acceptance pass)", "",
              f"A text that differs is a near-tie when, at its first differing token, the two runs' preferences "
              f"moved by at most {NEAR_TIE_NATS:g} nats (float numerics); any other difference fails the check.", "",
              "| variant | task | identical to its baseline | parting at a near-tie | where the texts part | "
              "code edit correct |", "|---|---|---|---|---|---|"]
    for v in run.variants:
        base = judged_against.get(v.name)
        for task, outputs in sorted(v.outputs.items()):
            same = identity(outputs, base.outputs.get(task, [])) if base and v is not base else None
            correct, judged = code_correct_share(outputs, run.prompts.get(task, []))
            differing = same.compared - same.identical if same else 0
            where = "; ".join(p.describe() for p in same.partings).replace("|", "\\|") if same else ""
            lines.append(f"| {v.name} | {task} | {f'{same.identical}/{same.compared}' if same else '-'} | "
                         f"{f'{same.near_ties}/{differing}' if same and differing else '-'} | {where} | "
                         f"{f'{correct}/{judged}' if judged else '-'} |")
    lines += ["", "## Server counters (snapshot difference over all passes)", "",
              "| variant | C | D | drafts | C/D | 1+C/drafts | per position, per draft (vLLM's counter) |",
              "|---|--:|--:|--:|--:|--:|---|"]
    for v in run.variants:
        if v.server is not None:
            fig = v.server
            lines.append(f"| {v.name} | {fig.accepted:g} | {fig.draft_tokens:g} | {fig.steps:g} | "
                         f"{_f(fig.acceptance_rate)} | {_f(fig.mean_acceptance_length, '.2f')} | "
                         f"{' '.join(f'{r:.3f}' for r in fig.per_position_rate)} |")
    timeline_png = next((p for p in plots if p.name == DASHBOARD_QUERIES_PNG), None)
    lines += ["", "## Plots", ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots if p is not timeline_png]
    lines += _timeline(run, timeline_png)
    return "\n".join(lines) + "\n"


def _timeline(run: RunResults, png: Path | None) -> list[str]:
    lines = ["", "## Dashboard queries over the run", ""]
    timeline = run.timeline
    if not timeline or png is None:
        return lines + ["No Prometheus ran beside this study (`prometheus` not on PATH, or `--no-prometheus`), so "
                        "there are no curves over the run; the figures above come from the saved files alone."]
    prom = timeline.get("prometheus", {})
    spans = ", ".join(f"{name} ({v.get('backend') or '?'}, {v['window'][1] - v['window'][0]:.0f} s)"
                      for name, v in timeline["variants"].items())
    lines += [f"Prometheus {prom.get('version', '?')} scraped each variant's server every "
              f"{prom.get('scrape_interval_seconds', '?'):g} s while it ran and evaluated the repository's recording "
              f"rules; these are the Grafana panels' own queries over each variant's window ({spans}), all "
              "variants overlaid from the moment their server was healthy. Rates are over 1 minute, so a curve "
              "trails its pass; the exact figures are the snapshot differences above.", "",
              "| panel | dashboard | PromQL (variables set to All) |", "|---|---|---|"]
    for q in timeline["queries"]:
        exprs = " ; ".join(f"`{t['expr'].replace('|', '∣')}`" for t in q["targets"])
        lines.append(f"| {q['panel']} | {q['dashboard']} | {exprs} |")
    return lines + ["", f"![{png.stem}]({png.name})"]


def _inline(md: str, folder: Path) -> str:
    body = []
    table: list[str] = []

    def flush() -> None:
        if not table:
            return
        rows = [[html.escape(c.strip()) for c in r.strip("|").split("|")] for r in table if not set(r) <= set("|-: ")]
        body.append("<table><tr>" + "".join(f"<th>{c}</th>" for c in rows[0]) + "</tr>" + "".join(
            "<tr>" + "".join(f"<td>{_bold(c)}</td>" for c in r) + "</tr>" for r in rows[1:]) + "</table>")
        table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if line.startswith("# "):
            body.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.startswith("## "):
            body.append(f"<h2>{html.escape(line[3:])}</h2>")
        elif match := re.fullmatch(r"!\[(.*)\]\((.*)\)", line):
            data = base64.b64encode((folder / match.group(2)).read_bytes()).decode()
            body.append(f'<p><img alt="{html.escape(match.group(1))}" src="data:image/png;base64,{data}"></p>')
        elif line:
            body.append(f"<p>{_bold(html.escape(line))}</p>")
    flush()
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
             "margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}img{max-width:100%}")
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>" + \
        "\n".join(body) + "</body></html>\n"


def _bold(text: str) -> str:
    return re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", re.sub(r"`(.+?)`", r"<code>\1</code>", text))


def write(folder: Path, md: str) -> tuple[Path, Path]:
    (folder / "report.md").write_text(md)
    (folder / "report.html").write_text(_inline(md, folder))
    return folder / "report.md", folder / "report.html"
