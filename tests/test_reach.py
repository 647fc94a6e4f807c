"""Acceptance by position conditioned on reach (vLLM's detailed `per_step_drafted`), and tuning on full-depth steps.

Hand-worked fields for the parser and the sums; then the simulator's suffix decoding (drafts as long as its match)
behind the real exporter and a real Prometheus: the exporter's reach and full-depth families equal the sums of the
response bodies, the deep positions of drafts that reached them do not fall to near zero the way the per-draft
figure does, and `specwatch tune`'s live reader takes full-depth steps and says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
import requests

from specwatch.acceptance import AcceptanceFieldError, parse, total
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.tune import live, tuner
from specwatch.vllm_metrics import samples
from specwatch.workloads import article_rows
from tests.conftest import Service

# k = 4; three steps: drafted 4 (accepted 2), drafted 2 (accepted 1), drafted 1 (accepted 0)
FIELD = {"num_accepted_draft_tokens": 3, "num_draft_tokens": 7, "num_spec_steps": 3,
         "acceptance_histogram": [1, 1, 1, 0, 0], "per_step_accepted": [2, 1, 0], "per_step_drafted": [4, 2, 1]}


def test_the_per_step_arrays_give_reach_and_full_depth() -> None:
    f = parse(FIELD)
    assert f.per_step == ((2, 4), (1, 2), (0, 1))
    assert f.reached == (3, 2, 1, 1)  # drafts with at least 1, 2, 3, 4 tokens
    assert f.full_depth == (0, 0, 1, 0, 0)  # one step drafted all 4 and accepted 2
    summary = {k: v for k, v in FIELD.items() if not k.startswith("per_step")}
    assert parse(summary).per_step is None and parse({**summary, "per_step_accepted": None,
                                                      "per_step_drafted": None}).reached is None


@pytest.mark.parametrize(("change", "names"), [
    ({"per_step_drafted": [4, 2]}, "per_step_drafted"),  # one short of num_spec_steps
    ({"per_step_drafted": None}, "per_step_drafted"),  # one array without the other
    ({"per_step_drafted": [4, 2, 2]}, "disagree"),  # sums to 8, not D = 7
    ({"per_step_accepted": [1, 1, 1]}, "disagree"),  # sums to C, but not the histogram's counts
    ({"per_step_drafted": [5, 1, 1]}, "step 0"),  # more than k
    ({"per_step_accepted": [2, 0, 1], "per_step_drafted": [4, 3, 0]}, "step 2"),  # accepted 1 of 0 drafted
])
def test_per_step_arrays_that_contradict_the_summary_are_malformed(change: dict[str, Any], names: str) -> None:
    with pytest.raises(AcceptanceFieldError, match=names):
        parse({**FIELD, **change})
    parse({**FIELD, "per_step_accepted": [0, 2, 1], "per_step_drafted": [1, 4, 2]})  # another order agrees


def test_sums_keep_the_two_definitions_apart() -> None:
    body = {"usage": {"completion_tokens": 7}, "metrics": {"speculative_decoding": FIELD}}
    acc = total([body, body])
    assert acc.detailed and acc.reached == (6, 4, 2, 2)
    assert acc.per_position == pytest.approx((4 / 6, 2 / 6, 0, 0))  # per draft: short drafts count as rejections
    assert acc.per_position_of_reached == pytest.approx((4 / 6, 2 / 4, 0, 0))  # of the drafts that got there
    assert acc.full_depth_per_position == pytest.approx((1, 1, 0, 0))
    summary = {k: v for k, v in FIELD.items() if not k.startswith("per_step")}
    mixed = acc.add(summary, 7)
    assert not mixed.detailed and mixed.detailed_steps == 6 and mixed.steps == 9  # the reach sums stay their own


def test_data_parallel_above_one_is_a_warning_and_one_is_not() -> None:
    assert tuner.data_parallel_warning(1) == ()
    (warning,) = tuner.data_parallel_warning(2)
    assert "num_speculative_tokens_per_batch_size" in warning and "data parallel size 2" in warning


SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_cached_requests": 0}
SUFFIX_SIM_ARGS = ["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096", "--seed", "7",
                   "--per-request-spec-decode-metrics", "detailed", "--speculative-config", json.dumps(SUFFIX),
                   "--sim-time-scale", "0.02"]


def _chat(url: str, prompt: str, task: str) -> dict[str, Any]:
    resp = requests.post(f"{url}/v1/chat/completions", headers={"X-Specwatch-Task": task}, timeout=60, json={
        "model": "spec-demo", "messages": [{"role": "user", "content": prompt}], "max_tokens": 96,
        "temperature": 0})
    resp.raise_for_status()
    body: dict[str, Any] = resp.json()
    return body


def _values(url: str, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The exporter's samples of `family` (a counter's `_total`), keyed by their sorted labels."""
    text = requests.get(f"{url}/metrics", timeout=10).text
    return {labels: v for (name, labels), v in samples(text).items() if name == family}


@pytest.fixture(scope="module")
def suffix_behind_tap(service_factory: Callable[[str, list[str]], Service],
                      prometheus_factory: Callable[..., PrometheusServer]) -> dict[str, Any]:
    sim = service_factory("sim", SUFFIX_SIM_ARGS)
    tap = service_factory("exporter", ["--upstream", f"candidate={sim.url}"])
    prom = prometheus_factory(Targets(vllm={"candidate": sim.url}, exporters=(tap.url,)))
    prom.wait_until_up(2)
    warm = _chat(tap.url, "warm up", "code")  # the code children exist (k known) before the measured window
    steps = parse(warm["metrics"]["speculative_decoding"]).steps
    prom.wait_for_sum('specwatch_spec_steps_total{task="code"}', steps)
    start = time.time()
    bodies = [_chat(tap.url, row.prompt, "code") for row in article_rows("code", "en", 6)]
    steps += total(bodies).steps
    scraped = prom.wait_for_sum('specwatch_spec_steps_total{task="code"}', steps)
    prom.wait_evaluated(scraped, 'variant_task_position:specwatch_acceptance_of_reached:ratio_rate5m')
    return {"tap": tap, "prom": prom, "bodies": bodies, "start": start, "warm": total([warm]), "warm_body": warm}


def test_the_exporter_counts_reach_and_full_depth_exactly_and_deep_positions_hold(
        suffix_behind_tap: dict[str, Any]) -> None:
    tap, bodies = suffix_behind_tap["tap"], suffix_behind_tap["bodies"]
    acc = total(bodies)
    assert acc.detailed and acc.steps > 20, acc.as_dict()
    assert acc.reached[-1] < acc.reached[0], acc.reached  # suffix drafts vary in length: not all reach k
    reaching = _values(tap.url, "specwatch_drafts_reaching_pos_total")
    full = _values(tap.url, "specwatch_full_depth_accepted_per_pos_total")
    full_steps = _values(tap.url, "specwatch_full_depth_steps_total")
    code = (("task", "code"), ("variant", "candidate"))

    def at(p: int) -> tuple[tuple[str, str], ...]:
        return (("position", str(p)), *code)

    # the exporter counted the warm-up too: compare increments since it (the warm-up's own field, by hand)
    warm = suffix_behind_tap["warm"]
    for p, n in enumerate(acc.reached):
        assert reaching[at(p)] - warm.reached[p] == n
    for p in range(len(acc.reached)):  # survival among full-depth steps: those that drafted k and accepted p + 1
        assert full[at(p)] - sum(warm.full_depth[p + 1:]) == sum(acc.full_depth[p + 1:])
    assert full_steps[code] - sum(warm.full_depth) == sum(acc.full_depth)
    assert _values(tap.url, "specwatch_spec_steps_without_per_step_total")[code] == 0  # detailed throughout
    # per draft, a deep position reads low because short drafts never got there; of the drafts that did, the
    # simulator's suffix match (which copies whole spans) keeps being accepted
    deep = [p for p, n in enumerate(acc.reached) if n >= 5][-1]
    of_reached = acc.per_position_of_reached[deep]
    assert acc.reached[deep] < acc.steps and of_reached is not None, acc.as_dict()
    assert of_reached >= 0.5 and of_reached > acc.per_position[deep] + 0.05, (
        acc.reached, acc.per_position, acc.per_position_of_reached)


def test_the_recording_rule_and_tunes_live_reader_use_drafts_that_reached(suffix_behind_tap: dict[str, Any]) -> None:
    prom: PrometheusServer = suffix_behind_tap["prom"]
    acc = total(suffix_behind_tap["bodies"])
    everything = total([suffix_behind_tap["warm_body"], *suffix_behind_tap["bodies"]])  # the rule's 5 minutes
    record = 'variant_task_position:specwatch_acceptance_of_reached:ratio_rate5m{task="code"}'
    by_position = {int(dict(k)["position"]): v for k, v in prom.values(record).items()}
    assert set(by_position) == set(range(8)), by_position
    # the rule divides the right rates: at its own evaluation time, the two rates Prometheus gives (a series born
    # within the window is extrapolated by its own first sample, so the rule is not the lifetime ratio until then)
    at = min(prom.values(f"timestamp({record})").values())
    by_rates = {int(dict(k)["position"]): v for k, v in prom.values(
        'sum by (position) (rate(specwatch_accepted_tokens_per_pos_total{task="code"}[5m])) / '
        'sum by (position) (rate(specwatch_drafts_reaching_pos_total{task="code"}[5m]))', at).items()}
    assert by_position == pytest.approx(by_rates, rel=1e-9)
    # and what Prometheus scraped is the bodies' sums, exactly: the lifetime ratio per position
    lifetime = {int(dict(k)["position"]): v for k, v in prom.values(
        'sum by (position) (specwatch_accepted_tokens_per_pos_total{task="code"}) / '
        'sum by (position) (specwatch_drafts_reaching_pos_total{task="code"})').items()}
    assert lifetime == pytest.approx(dict(enumerate(everything.per_position_of_reached)), rel=1e-12)
    at = time.time()
    window = f"{int(at - suffix_behind_tap['start']) + 2}s"
    found = live.acceptance(prom.url, window, "candidate", {}, 8, at=at)
    assert "drafted all k tokens" in found.basis["code"], found.basis
    # P_1 = full-depth steps accepting 1 / full-depth steps x verify steps / decode steps, from the same window's
    # increases as Prometheus extrapolates them (each series by its own samples), computed here independently
    def increase(family: str, extra: str = "") -> float:
        return sum(prom.values(f'sum(increase({family}{{task="code"{extra}}}[{window}]))', at).values())
    expected = (increase("specwatch_full_depth_accepted_per_pos_total", ',position="0"')
                / increase("specwatch_full_depth_steps_total")
                * increase("specwatch_spec_steps_total") / increase("specwatch_decode_steps_total"))
    assert found.acceptance["code"][0] == pytest.approx(expected, rel=1e-9)
    # which is, up to that extrapolation, the figure of the bodies themselves
    by_bodies = acc.full_depth_per_position[0] * acc.steps / _decode_steps(suffix_behind_tap["bodies"])
    assert found.acceptance["code"][0] == pytest.approx(by_bodies, rel=0.15)
    assert live.data_parallel_size(prom.url, "5m", "candidate") == 1  # the simulator is one engine


def _decode_steps(bodies: list[dict[str, Any]]) -> int:
    """What the exporter counts as decode steps: completion tokens - 1 - C (at least R), summed."""
    out = 0
    for body in bodies:
        f = parse(body["metrics"]["speculative_decoding"])
        out += max(body["usage"]["completion_tokens"] - 1 - f.accepted, f.steps)
    return out


def test_summary_mode_steps_are_counted_and_nothing_claims_the_reach(
        service_factory: Callable[[str, list[str]], Service],
        prometheus_factory: Callable[..., PrometheusServer]) -> None:
    """A server in summary mode: its steps land in specwatch_spec_steps_without_per_step_total, the reach ratio has
    no sample for it, and tune's live reader falls back to every step and says why."""
    args = [a if a != "detailed" else "summary" for a in SUFFIX_SIM_ARGS]
    sim = service_factory("sim", args)
    tap = service_factory("exporter", ["--upstream", f"candidate={sim.url}"])
    prom = prometheus_factory(Targets(vllm={"candidate": sim.url}, exporters=(tap.url,)))
    prom.wait_until_up(2)
    bodies = [_chat(tap.url, row.prompt, "code") for row in article_rows("code", "en", 3)]
    acc = total(bodies)
    assert acc.steps > 0 and acc.detailed_steps == 0 and not acc.detailed
    code = (("task", "code"), ("variant", "candidate"))
    assert _values(tap.url, "specwatch_spec_steps_without_per_step_total")[code] == acc.steps
    assert _values(tap.url, "specwatch_drafts_reaching_pos_total").get((("position", "0"), *code), 0) == 0
    scraped = prom.wait_for_sum('specwatch_spec_steps_total{task="code"}', acc.steps)
    prom.wait_evaluated(scraped, "variant_task:specwatch_spec_steps_without_per_step:rate5m")
    assert not prom.values('variant_task_position:specwatch_acceptance_of_reached:ratio_rate5m{task="code"}')
    deadline = time.monotonic() + 30  # two samples of the position series (born with the first request) in range
    while not prom.values('count_over_time(specwatch_accepted_tokens_per_pos_total{task="code",position="0"}[5m])'
                          ' >= 2') and time.monotonic() < deadline:
        time.sleep(0.5)
    found = live.acceptance(prom.url, "5m", "candidate", {}, 16)  # this Prometheus saw nothing else
    assert "summary mode" in found.basis["code"], found.basis
