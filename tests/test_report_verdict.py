"""The study's verdict and plots on planted per-request samples (no servers): the judge decides, the lines say why."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import matplotlib.colors
import pytest
import yaml
from matplotlib.figure import Figure

from specwatch import judge, resources
from specwatch.acceptance import Acceptance
from specwatch.canary import policy as policy_mod
from specwatch.load.results import RequestResult
from specwatch.report import judgements, plots, quality, render, verdict
from specwatch.report.results import Output, RunResults, Token, VariantResults
from specwatch.stats import Shift

REPO = Path(__file__).resolve().parents[1]
DEMO_REQUESTS = yaml.safe_load((REPO / "examples/plans/cpu-study.yaml").read_text())["performance"]["requests"]
TARGET = 2
LINE = re.compile(r"TPOT [+-]\d+ % \[[+-]\d+ %, [+-]\d+ %\], n = (\d+) / (\d+): (better|worse|no change)")


def _requests(task: str, n: int, tpot: float, rng: random.Random, sigma: float = 0.12, tokens: int = 16
              ) -> list[RequestResult]:
    """Requests as the real CPU server gives them: a per-request TPOT spread (log sd ~0.1), ITLs around it."""
    out = []
    for i in range(n):
        mean = tpot * rng.lognormvariate(0, sigma)
        itl = [mean * rng.lognormvariate(0, 0.2) for _ in range(tokens - 1)]
        ttft = 0.3 * rng.lognormvariate(0, 0.1)
        start = 10.0 * i
        out.append(RequestResult(task, True, False, start, start + ttft + sum(itl), ttft, sum(itl) / (tokens - 1),
                                 itl, tokens, 200))
    return out


def _variant(name: str, n: int, tpot: float, seed: int, *, text: str = "same", blocks: int = 100,
             accepted: int = 0, state: str = "done") -> VariantResults:
    rng = random.Random(f"{name}-{seed}")
    v = VariantResults(name, state, speculative=name != "baseline", num_gpu_blocks=blocks)
    v.requests = {TARGET: {"code": _requests("code", n, tpot, rng)}}
    v.outputs = {"code": [Output("code", i, text, "length", 10) for i in range(3)]}
    if name != "baseline":
        v.acceptance = {"code": Acceptance(3, 0, accepted, 10, 5, (1, 1, 1, 1, 1), 30)}
        v.spec_requests = {"code": [(accepted // 3, 3), (accepted // 3, 3), (accepted - 2 * (accepted // 3), 4)]}
    return v


def _run(*variants: VariantResults, timeline: dict[str, Any] | None = None) -> RunResults:
    return RunResults(Path("."), "t", {}, list(variants), {"code": []}, timeline)


def _judged(run: RunResults) -> tuple[list[verdict.Verdict], judgements.Judgements]:
    """The verdicts at TARGET against `baseline`, and the report's judgements they read (the default policy)."""
    table = judgements.build(run, "baseline", TARGET)
    return verdict.verdicts(run, "baseline", TARGET, table), table


def _one(*variants: VariantResults) -> verdict.Verdict:
    (only,), _ = _judged(_run(*variants))
    return only


def test_the_demo_plan_gives_every_cell_the_judges_minimum() -> None:
    need = yaml.safe_load(resources.CANARY_POLICY.read_text())["min_samples"]
    assert need == judge.MIN_SAMPLES and DEMO_REQUESTS >= need


@pytest.mark.parametrize("n", [3, 10, DEMO_REQUESTS, 60])
def test_identical_distributions_give_neither_go_nor_no_go(n: int) -> None:
    for seed in range(4):
        v = _one(_variant("baseline", n, 0.06, seed), _variant("same", n, 0.06, seed + 100))
        assert v.outcome == "inconclusive" and v.label == "INCONCLUSIVE", v.reason
        tpot = next(m for m in v.metrics if m.metric == "tpot")
        if n < judge.MIN_SAMPLES:
            assert tpot.finding == "insufficient data", tpot.text
        else:  # "no change" only when the whole interval lies inside the band; one that reaches out is undecided
            assert tpot.finding in ("no change", "undecided") and tpot.comparison is not None, tpot.text
            e = tpot.comparison.effect
            assert e is not None and (tpot.finding == "no change") == (0.9 <= e.low and e.high <= 1.1), tpot.text
        assert f"n = {n} / {n}" in tpot.text


@pytest.mark.parametrize("seed", range(5))
def test_a_planted_30_percent_tpot_regression_is_no_go_at_the_demos_sample_size(seed: int) -> None:
    v = _one(_variant("baseline", DEMO_REQUESTS, 0.06, seed), _variant("slow", DEMO_REQUESTS, 0.078, seed))
    assert v.outcome == "no-go" and v.label == "NO-GO", v.reason
    tpot = next(m for m in v.metrics if m.metric == "tpot")
    assert tpot.finding == "worse" and tpot.comparison is not None and tpot.comparison.state == "high"
    assert "TPOT" in v.reason and "worse than the baseline beyond the tolerance" in v.reason


def test_a_planted_gain_is_go_with_its_interval_and_n() -> None:
    v = _one(_variant("baseline", DEMO_REQUESTS, 0.06, 1), _variant("fast", DEMO_REQUESTS, 0.04, 1))
    assert v.go and v.outcome == "go", v.reason
    match = LINE.search(v.reason)
    assert match and match.groups() == (str(DEMO_REQUESTS), str(DEMO_REQUESTS), "better"), v.reason
    assert re.search(r"output tok/s \+\d+ % \[\+\d+ %, \+\d+ %\], n = \d+ / \d+: better", v.reason)
    # drafts, none accepted; 3 requests are too few for an interval over requests
    assert "acceptance 0% (no interval: 8 requests needed), n = 3 requests (acceptance pass, C / D)" in v.reason
    assert "outputs identical to the baseline's (3/3)" in v.reason


def test_too_few_samples_are_inconclusive_never_go_or_no_go() -> None:
    few = judge.MIN_SAMPLES - 1
    for tpot in (0.03, 0.06, 0.12):  # twice as fast, the same, twice as slow
        v = _one(_variant("baseline", few, 0.06, 2), _variant("cand", few, tpot, 2))
        assert v.outcome == "inconclusive", v.reason
        assert f"(medians, no interval), n = {few} / {few}: insufficient data (the judge needs " \
               f"{judge.MIN_SAMPLES} per side)" in v.reason
    empty = _one(_variant("baseline", 0, 0.06, 2), _variant("cand", 0, 0.06, 2))
    assert empty.outcome == "inconclusive" and "TPOT: no samples, n = 0 / 0: insufficient data" in empty.reason


def test_the_exact_rules_still_decide() -> None:
    n = DEMO_REQUESTS
    base = _variant("baseline", n, 0.06, 3)
    changed = _one(base, _variant("fast", n, 0.04, 3, text="other"))
    assert changed.outcome == "no-go" and "outputs differ" in changed.reason
    smaller = _one(base, _variant("fast", n, 0.04, 3, blocks=50))
    assert smaller.outcome == "no-go" and "capacity loss above the 25% bound" in smaller.reason
    failed = _one(base, _variant("broken", n, 0.04, 3, state="failed"))
    assert failed.outcome == "no-go" and "did not finish" in failed.reason
    high = _one(base, _variant("draft", n, 0.06, 4, accepted=9))
    assert high.outcome == "inconclusive" and "high acceptance (90%) without an end-to-end gain" in high.reason
    assert "acceptance 90% (no interval" in high.reason and "n = 3 requests (acceptance pass, C / D)" in high.reason
    low_only = _variant("lowonly", n, 0.06, 5)
    low_only.requests[1] = {"code": _requests("code", n, 0.03, random.Random(6))}
    base.requests[1] = {"code": _requests("code", n, 0.06, random.Random(7))}
    lower = _one(base, low_only)
    assert lower.outcome == "inconclusive" and "gains only at concurrency 1, below the target" in lower.reason


def test_the_report_says_the_verdict_with_its_lines(tmp_path: Path) -> None:
    n = DEMO_REQUESTS
    run = _run(_variant("baseline", n, 0.06, 1), _variant("fast", n, 0.04, 1))
    verdicts, table = _judged(run)
    md = render.markdown(run, "baseline", TARGET, verdicts, [], table)
    assert re.search(r"\| fast \| code \| \*\*GO\*\*: at concurrency 2: TPOT -\d+ % \[-\d+ %, -\d+ %\], "
                     rf"n = {n} / {n}: better", md), md
    judged = (rf"\| fast \| baseline \| code \| 2 \| TPOT \| 0\.\d+x \[0\.\d+, 0\.\d+\] \| - \| {n} / {n} \| "
              r"[\d.e-]+ \| better \|")
    assert re.search(judged, md), md


def _timeline(names: list[str]) -> dict[str, Any]:
    return {"queries": [{"panel": "Server acceptance rate", "unit": "percentunit"}],
            "variants": {n: {"series": {"Server acceptance rate": [{"name": "", "points": [[0, 0.5], [5, 0.6]]}]}}
                         for n in names}}


def _colour_of(artist: Any) -> set[str]:
    """The visible colour(s) of a bar, line, point set or line set (transparent fills skipped: hollow markers)."""
    for name in ("get_color", "get_facecolor", "get_edgecolor"):
        if not hasattr(artist, name):
            continue
        rgba = matplotlib.colors.to_rgba_array(getattr(artist, name)())
        visible = {matplotlib.colors.to_hex(c) for c in rgba if c[3] > 0}
        if visible:
            return visible
    return set()


def test_every_figure_of_a_report_gives_a_variant_the_same_colour(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    names = ["baseline", "ngram", "suffix", "draft"]
    variants = [_variant(name, 24, 0.06 * (1 + i / 10), 1, accepted=6 * (i > 0)) for i, name in enumerate(names)]
    for v in variants:
        v.requests[1] = {"code": _requests("code", 5, 0.05, random.Random(v.name))}  # too few: hollow markers
    run = _run(*variants, timeline=_timeline(list(reversed(names))))  # another order in the timeline
    figures: list[tuple[str, Figure]] = []
    save = plots._save

    def keep(fig: Figure, path: Path) -> Path:
        figures.append((path.name, fig))
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    made = plots.all_plots(run, "baseline", tmp_path, judgements.build(run, "baseline", TARGET))
    assert len(made) == len(figures) == 8 and all(p.exists() for p in made)
    expected = plots.colours(run, "baseline")
    assert expected["baseline"] == plots.BASELINE_COLOUR and len(set(expected.values())) == len(names)
    seen: dict[str, set[str]] = {}  # variant -> figures it appears in
    for png, fig in figures:
        for artist in fig.findobj(lambda a: a.get_gid() in expected):
            gid = str(artist.get_gid())
            colours = _colour_of(artist)
            assert colours == {expected[gid]}, (png, artist, colours)
            seen.setdefault(gid, set()).add(png)
    assert seen["baseline"] >= {"performance_spread.png", "kv_capacity.png", "dashboard_queries.png"}
    for name in names[1:]:
        assert seen[name] >= {"acceptance.png", "position_decay.png", "length_histograms.png", "coverage.png",
                              "performance_spread.png", "relative_performance.png", "kv_capacity.png",
                              "dashboard_queries.png"}, (name, seen[name])


def test_a_variant_with_its_own_baseline_is_judged_against_it_and_that_baseline_is_no_candidate() -> None:
    """The article's MTP runs on MiMo and is compared with MiMo's plain model, not with the study's baseline."""
    qwen = _variant("baseline", DEMO_REQUESTS, 0.06, 1)
    ngram = _variant("ngram", DEMO_REQUESTS, 0.06, 2)
    ngram.baseline = "baseline"
    mimo = _variant("mimo-baseline", DEMO_REQUESTS, 0.10, 3, text="mimo", blocks=80)
    mimo.speculative = False
    mtp = _variant("mtp", DEMO_REQUESTS, 0.06, 4, text="mimo", blocks=80)  # 40 % faster than MiMo, as fast as Qwen
    mtp.baseline = "mimo-baseline"
    run = _run(qwen, ngram, mimo, mtp)
    assert [(v.name, b.name if b else None) for v, b in run.candidates("baseline")] == [
        ("ngram", "baseline"), ("mtp", "mimo-baseline")]
    judged, table = _judged(run)
    verdicts = {v.variant: v for v in judged}
    assert set(verdicts) == {"ngram", "mtp"}
    assert verdicts["mtp"].outcome == "go", verdicts["mtp"].reason  # against Qwen's baseline it would be no change
    assert "outputs identical to the baseline's (3/3)" in verdicts["mtp"].reason
    assert "KV capacity +0% (80 vs 80 blocks)" in verdicts["mtp"].reason
    md = render.markdown(run, "baseline", TARGET, judged, [], table)
    assert "| mtp | mimo-baseline | code | 2 | TPOT |" in md and "| mimo-baseline | baseline |" not in md


def test_a_faster_variant_that_streams_in_bursts_is_go_with_a_caution_not_no_go() -> None:
    """Speculation delivers several tokens per chunk: per-chunk gaps are whole (longer) verify steps."""
    rng = random.Random("bursts")
    fast = _variant("bursty", DEMO_REQUESTS, 0.04, 7)
    for r in fast.requests[TARGET]["code"]:
        step = (r.tpot_s or 0.04) * 3  # three tokens per verify step: two gaps of ~0 and one of a whole step
        r.itl_s = [step * rng.lognormvariate(0, 0.1) if i % 3 == 2 else 0.0005 for i in range(len(r.itl_s))]
    v = _one(_variant("baseline", DEMO_REQUESTS, 0.06, 7), fast)
    found = {m.metric: m.finding for m in v.metrics}
    assert found["itl_p95"] == "worse" and found["tpot"] == "better" and found["output_tps"] == "better", v.reason
    assert v.outcome == "go", v.reason
    assert "caution: ITL p95 worse beyond the tolerance" in v.reason
    assert "a caution when comparing speculation vs none" in v.reason


def test_the_same_bursts_against_a_baseline_that_speculates_too_are_no_go() -> None:
    """One speculative config against another (the policy's speculation_vs_speculation): ITL p95 is a gate."""
    rng = random.Random("bursts")
    fast = _variant("bursty", DEMO_REQUESTS, 0.04, 7)
    for r in fast.requests[TARGET]["code"]:
        step = (r.tpot_s or 0.04) * 3
        r.itl_s = [step * rng.lognormvariate(0, 0.1) if i % 3 == 2 else 0.0005 for i in range(len(r.itl_s))]
    base = _variant("baseline", DEMO_REQUESTS, 0.06, 7)
    base.speculative = True  # say k = 3 against the candidate's k = 5
    v = _one(base, fast)
    assert {m.metric: m.finding for m in v.metrics}["itl_p95"] == "worse"
    assert v.outcome == "no-go", v.reason
    assert "ITL p95 worse than the baseline beyond the tolerance" in v.reason and "caution" not in v.reason
    forced = policy_mod.parse({**yaml.safe_load(resources.CANARY_POLICY.read_text()),
                               "comparison": "speculation_vs_none"})
    assert verdict.deciding(forced, True) == (("tpot", "output_tps"), "speculation_vs_none")  # the policy's word wins


def _tokens(texts: list[str], chosen: list[float], runner_up: list[tuple[str, float]]) -> tuple[Token, ...]:
    """Greedy tokens: each chosen with its logprob, the runner-up beside it in the top two."""
    return tuple(Token(t, lp, ((t, lp), alt)) for t, lp, alt in zip(texts, chosen, runner_up, strict=True))


# The parting measured on the real CPU server (SmolLM2-135M, bfloat16; chat row 1, token 35): the baseline
# chose " using" 0.125 nats above " a", the n-gram run had the two exactly tied and took " a".
BASE_TOKENS = _tokens(["A", " method", " using"], [-0.1, -0.2, -1.8725], [("B", -3.0), (" way", -2.5), (" a", -1.9975)])
TIED = _tokens(["A", " method", " a"], [-0.1, -0.2, -1.9524], [("B", -3.0), (" way", -2.5), (" using", -1.9524)])


def _with_outputs(v: VariantResults, *outputs: Output) -> VariantResults:
    v.outputs = {"code": list(outputs)}
    return v


def test_a_text_that_parts_at_a_near_tie_is_numerics_and_any_other_difference_fails() -> None:
    n = DEMO_REQUESTS
    same = Output("code", 0, "A method using", "length", 3, BASE_TOKENS)
    base = _with_outputs(_variant("baseline", n, 0.06, 8), same, Output("code", 1, "A method using", "length", 3,
                                                                        BASE_TOKENS))
    tie = Output("code", 1, "A method a", "length", 3, TIED)
    v = _one(base, _with_outputs(_variant("fast", n, 0.04, 8), same, tie))
    assert v.outcome == "go", v.reason
    assert ("outputs identical to the baseline's in 1 of 2 requests; the other 1 parts at a near-tie (the two "
            f"runs' top two within {quality.NEAR_TIE_NATS:g} nats: numerics, not quality)") in v.reason, v.reason
    (parting,) = quality.identity([same, tie], base.outputs["code"]).partings
    assert (parting.index, parting.position, parting.baseline_token, parting.variant_token) == (1, 2, " using", " a")
    assert parting.swing == pytest.approx(0.125) and parting.near_tie()
    # the variant preferred its token by two nats where the baseline's margin was small: not numerics
    far = Output("code", 1, "A method a", "length", 3,
                 TIED[:2] + (Token(" a", -0.5, ((" a", -0.5), (" using", -2.5))),))
    v = _one(base, _with_outputs(_variant("fast", n, 0.04, 8), same, far))
    assert v.outcome == "no-go" and "outputs differ from the baseline's in 1 of 2 requests (quality check fails)" \
        in v.reason and "near-tie" not in v.reason, v.reason
    # the baseline's token is not in the variant's top list at all: no margin to read, a difference
    unseen = Output("code", 1, "A method a", "length", 3,
                    TIED[:2] + (Token(" a", -1.9524, ((" a", -1.9524), (" by", -1.96))),))
    assert quality.identity([unseen], base.outputs["code"]).quality_differences == 1
    # without logprobs (a run from before they were asked for, a server that sends none) every difference counts
    bare = Output("code", 1, "A method a", "length", 3)
    assert quality.identity([bare], base.outputs["code"]).partings == ()
    assert _one(base, _with_outputs(_variant("fast", n, 0.04, 8), same, bare)).outcome == "no-go"
    # no request in common with the baseline: nothing shown identical, so no GO on quality
    other_rows = _with_outputs(_variant("fast", n, 0.04, 8), Output("code", 7, "A method using", "length", 3))
    assert _one(base, other_rows).outcome == "no-go"
    # one stopped earlier: its tokens agree as far as they go, no parting token, a difference
    short = Output("code", 1, "A method", "stop", 2, BASE_TOKENS[:2])
    assert quality.parting(short, base.outputs["code"][1]) is None
    assert quality.identity([short], base.outputs["code"]).quality_differences == 1


def test_the_report_shows_where_each_text_parts(tmp_path: Path) -> None:
    n = DEMO_REQUESTS
    base = _with_outputs(_variant("baseline", n, 0.06, 9), Output("code", 0, "A method using", "length", 3,
                                                                  BASE_TOKENS))
    run = _run(base, _with_outputs(_variant("fast", n, 0.04, 9), Output("code", 0, "A method a", "length", 3, TIED)))
    verdicts, table = _judged(run)
    md = render.markdown(run, "baseline", TARGET, verdicts, [], table)
    assert "| fast | code | 0/1 | 1/1 | row 0, token 2: ' using' vs ' a' (swing 0.125 nats) | - |" in md, md


# -- drift: the study in rounds, and the baseline against itself ---------------------------------------------------

ROUNDS = 4


def _in_rounds(name: str, per_round: int, tpot: float, seed: int, slow: dict[int, float] | None = None,
               step_at: float | None = None, sigma: float = 0.12, rounds: int = ROUNDS) -> VariantResults:
    """A variant measured in `rounds` rounds of `per_round` requests (each round 60 s after the last); `slow`
    multiplies the TPOT of some rounds, `step_at` (a fraction of the requests, in time order) all requests after it
    by 1.5; `sigma`: the per-request spread (log sd)."""
    v = _variant(name, 0, tpot, seed)
    rng = random.Random(f"{name}-rounds-{seed}")
    rows: list[RequestResult] = []
    for r in range(1, rounds + 1):
        for row in _requests("code", per_round, tpot * (slow or {}).get(r, 1.0), rng, sigma):
            row.round, row.start, row.end = r, row.start + 60 * r, row.end + 60 * r
            rows.append(row)
    if step_at is not None:
        rows = _stepped(rows, step_at)
    v.requests = {TARGET: {"code": rows}}
    return v


def _stepped(rows: list[RequestResult], at: float, factor: float = 1.5) -> list[RequestResult]:
    """The requests after the first `at` of them (in time order) slowed by `factor`: a hog that starts mid-window."""
    cut = int(len(rows) * at)
    for row in sorted(rows, key=lambda r: r.start)[cut:]:
        row.itl_s = [x * factor for x in row.itl_s]
        row.tpot_s = (row.tpot_s or 0) * factor
        row.end = row.start + (row.ttft_s or 0) + sum(row.itl_s)
    return rows


def _blocked(*variants: VariantResults) -> verdict.Verdict:
    run = _run(*variants)
    run.design, run.rounds = "interleaved", ROUNDS
    (only,), _ = _judged(run)
    return only


@pytest.mark.parametrize("seed", range(4))
def test_a_50_percent_step_in_the_middle_of_a_sequential_baseline_is_inconclusive_with_the_drift(seed: int) -> None:
    base = _variant("baseline", DEMO_REQUESTS, 0.06, seed)
    base.requests[TARGET]["code"] = _stepped(base.requests[TARGET]["code"], 0.5)
    for cand in (_variant("fast", DEMO_REQUESTS, 0.03, seed), _variant("slow", DEMO_REQUESTS, 0.12, seed),
                 _variant("same", DEMO_REQUESTS, 0.06, seed + 50)):
        v = _one(base, cand)
        assert v.outcome == "inconclusive", v.reason
        assert re.match(r"the machine drifted: baseline TPOT \+\d+ % between the first half of its block and the "
                        r"second half of its block; a sequential design cannot cancel it", v.reason), v.reason


@pytest.mark.parametrize("seed", range(4))
def test_a_50_percent_step_on_the_baseline_alone_in_rounds_is_inconclusive_with_the_drift(seed: int) -> None:
    """Interleaved, but the slowdown hit only the baseline's blocks of rounds 3 and 4: the rounds disagree."""
    base = _in_rounds("baseline", 10, 0.06, seed, slow={3: 1.5, 4: 1.5})  # the demo's 5 per task, its 2 tasks pooled
    v = _blocked(base, _in_rounds("fast", 10, 0.045, seed))
    assert v.outcome == "inconclusive", v.reason
    assert v.reason.startswith("the machine drifted: baseline TPOT +"), v.reason
    assert re.search(r"between round \d and round \d", v.reason), v.reason


@pytest.mark.parametrize("seed", range(4))
def test_50_percent_on_every_variant_of_one_round_is_cancelled_only_where_measured_alike(seed: int) -> None:
    """Measured narrowly (40 requests a round, a tight spread) the two sides' moves are alike: the verdict stands and
    the line names both moves. With the demo's 5 a round the moves' intervals are too wide to tell them alike: the
    blocking is not credited with cancelling what nobody could see cancel, INCONCLUSIVE, saying why."""
    cases = {"fast": 0.03, "slow": 0.12, "same": 0.06}
    for name, tpot in cases.items():
        quiet = _blocked(_in_rounds("baseline", 40, 0.06, seed, sigma=0.03), _in_rounds(name, 40, tpot, seed,
                                                                                       sigma=0.03))
        noisy = _blocked(_in_rounds("baseline", 40, 0.06, seed, slow={2: 1.5}, sigma=0.03),
                         _in_rounds(name, 40, tpot, seed, slow={2: 1.5}, sigma=0.03))
        assert noisy.outcome == quiet.outcome, (quiet.reason, noisy.reason)
        assert quiet.outcome == {"fast": "go", "slow": "no-go", "same": "inconclusive"}[name], quiet.reason
        # the line names each side's move between the rounds that moved most (round 2, planted) and the blocking
        assert re.search(rf"drift: baseline TPOT [+-]\d+ % between (round 2 and round \d|round \d and round 2) against "
                         rf"{name} [+-]\d+ % between the same rounds: alike \(their ratio [+-]\d+ % \[[+-]\d+ %, "
                         r"[+-]\d+ %\], inside the tolerance\).*the blocking cancels it", noisy.reason), noisy.reason
        tpot_line = next(m for m in noisy.metrics if m.metric == "tpot")
        assert f"over {ROUNDS} rounds, n = 160 / 160" in tpot_line.text, tpot_line.text
        few = _blocked(_in_rounds("baseline", 5, 0.06, seed, slow={2: 1.5}), _in_rounds(name, 5, tpot, seed,
                                                                                       slow={2: 1.5}))
        assert few.outcome == "inconclusive", few.reason
        # either side's move beyond the tolerance, named with the other side's between the same rounds
        assert re.match(rf"the machine drifted: (baseline|{name}) TPOT [+-]\d+ % between (round 2 and round \d|"
                        rf"round \d and round 2) against ({name}|baseline) [+-]\d+ % between the same rounds",
                        few.reason), few.reason
        assert "too few requests per round to tell whether both moved alike" in few.reason, few.reason


@pytest.mark.parametrize("seed", range(8))
def test_identical_variants_in_rounds_give_neither_go_nor_no_go(seed: int) -> None:
    for slow in (None, {1: 1.5}, {4: 2.0}):
        v = _blocked(_in_rounds("baseline", 5, 0.06, seed, slow=slow), _in_rounds("same", 5, 0.06, seed + 9, slow=slow))
        assert v.outcome == "inconclusive", v.reason


def test_an_interval_that_straddles_the_tolerance_is_undecided_not_no_change() -> None:
    """output tok/s +16 % [+5 %, +23 %] is not "no change (within -10% .. +10%)"."""
    mp = policy_mod.load().metric("output_tps")
    straddling = judge.Comparison("pass", "ratio", 24, 24, Shift(1.16, 1.05, 1.23, 0.95), 0.01, 1.0, 1.16, True)
    inside = judge.Comparison("pass", "ratio", 24, 24, Shift(1.01, 0.95, 1.06, 0.95), 0.6, 1.0, 1.01, False, True)
    assert judgements._finding(straddling, mp) == "undecided"
    assert judgements._finding(inside, mp) == "no change"


def test_tpot_comes_from_the_servers_clock_where_both_sides_timed_every_request() -> None:
    """A sweep's servers time each request (`--enable-per-request-metrics`); at 64 streams on 2 cores the client reads
    its streams late and in bunches, so its TPOT is not the server's. Planted: the client sees no difference, the
    servers' own clocks a 40 % gain."""
    base, fast = _variant("baseline", DEMO_REQUESTS, 0.06, 11), _variant("fast", DEMO_REQUESTS, 0.06, 12)
    for v, itl_ms in ((base, 50.0), (fast, 30.0)):
        for i, r in enumerate(v.requests[TARGET]["code"]):
            r.server = {"mean_itl_ms": itl_ms * (1 + 0.01 * (i % 5))}
    tpot = next(m for m in _one(base, fast).metrics if m.metric == "tpot")
    assert tpot.text.startswith("TPOT (server clock) -40 %") and tpot.finding == "better", tpot.text
    fast.requests[TARGET]["code"][0].server = None  # one request the server did not time: both sides on the client's
    tpot = next(m for m in _one(base, fast).metrics if m.metric == "tpot")
    assert tpot.text.startswith("TPOT ") and "server clock" not in tpot.text and tpot.finding != "better", tpot.text


def test_rounds_that_disagree_on_a_decided_effect_are_named_as_drift() -> None:
    """A candidate faster in three rounds and slowed alone in the fourth (its block there saw a busier machine): decided
    over requests, not over rounds; the line says the rounds disagree, as drift, and gives no GO."""
    base = _in_rounds("baseline", 10, 0.06, 21)
    v = _blocked(base, _in_rounds("fast", 10, 0.04, 21, slow={4: 2.2}))
    assert v.outcome == "inconclusive", v.reason
    assert re.match(r"the machine drifted: .*the rounds disagree on TPOT \(-\d+ % \.\. \+\d+ % by round\): no decision",
                    v.reason), v.reason


def test_two_bfloat16_steps_read_through_a_float32_log_softmax_are_still_a_near_tie() -> None:
    """Two rounding steps of 0.125 read 0.2502 once on the real CPU server (the log-softmax's float error): a near-tie;
    a third step (0.375) is not, nor is anything a draft could cause by changing the target's choice."""
    def parting(baseline_margin: float, variant_margin: float) -> quality.Parting:
        return quality.Parting(5, 13, "0", "\n", baseline_margin, variant_margin)

    assert parting(0.125, 0.1252).near_tie() and parting(0.25, 0.0).near_tie()
    assert not parting(0.25, 0.125).near_tie() and not parting(0.125, 0.14).near_tie()
    # an exact tie in one run (a coin flip there), one step of a logit between 64 and 128 in the other: numerics
    assert parting(0.0, 0.4999999701976776).near_tie() and parting(0.5, 0.0).near_tie()
    assert not parting(0.0, 0.75).near_tie() and not parting(0.0625, 0.5).near_tie()
    assert not parting(0.0, 2.0).near_tie()
