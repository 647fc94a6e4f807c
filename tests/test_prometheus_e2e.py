"""The Debian Prometheus on the repository's configuration, the exporter under Locust load, exact snapshots.

The recorded acceptance (server side per variant, exporter side per task) must equal the ratio of
the exact differences of the same counters between a snapshot before and one after the load,
all inside the rule's window: a ratio of two rates of one target is a ratio of increases.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from specwatch import cli
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.vllm_cpu.server import VllmServer
from specwatch.vllm_metrics import samples
from specwatch.workloads import write_article_workloads
from tests.conftest import NGRAM_SIM_ARGS, Service

Snapshot = dict[tuple[str, tuple[tuple[str, str], ...]], float]
SIM_BASELINE_ARGS = ["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096",
                     "--max-num-seqs", "16", "--seed", "42", "--sim-time-scale", "0.02"]


def snapshot(url: str) -> Snapshot:
    return samples(requests.get(url + "/metrics", timeout=10).text)


def settled(url: str) -> Snapshot:
    """A snapshot once two reads a second apart agree (vLLM publishes its counters after the response)."""
    def counters(snap: Snapshot) -> Snapshot:
        return {k: v for k, v in snap.items() if k[0].startswith(("vllm:", "specwatch_")) and k[0].endswith("_total")}

    before = snapshot(url)
    for _ in range(30):
        time.sleep(1)
        after = snapshot(url)
        if counters(after) == counters(before):
            return after
        before = after
    raise AssertionError(f"{url}/metrics kept changing after the load")


def total(snap: Snapshot, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in snap.items() if n == name and all((k, w) in ls for k, w in labels.items()))


def delta(before: Snapshot, after: Snapshot, name: str, **labels: str) -> float:
    return total(after, name, **labels) - total(before, name, **labels)


def one(values: dict[tuple[tuple[str, str], ...], float], **labels: str) -> float:
    matching = [v for k, v in values.items() if all((a, b) in k for a, b in labels.items())]
    assert len(matching) == 1, (labels, values)
    return matching[0]


SERVER_COUNTERS = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                   "vllm:spec_decode_num_drafts_total")
TAP_COUNTERS = ("specwatch_accepted_tokens_total", "specwatch_draft_tokens_total", "specwatch_spec_steps_total",
                "specwatch_decode_steps_total")


def wait_for_totals(prom: PrometheusServer, after: Snapshot, names: tuple[str, ...], selector: str = "") -> float:
    """Until Prometheus's latest sample of every counter compared equals the settled snapshot; the newest scrape time.

    Waiting on one counter is not enough: a last step whose drafts were all rejected moves the draft counters
    after the accepted one has reached its final value, and a rule evaluated in between is off by that step.
    """
    return max(prom.wait_for_sum(name + selector, total(after, name)) for name in names)


def run_load(tap: Service, data: Path, out: Path, *extra: str) -> None:
    code = cli.main(["load", "--target", tap.url, "--task", f"code={data / 'code.jsonl'}",
                     "--task", f"chat={data / 'chat.jsonl'}", "--ignore-eos", "--max-seconds", "240",
                     "--out", str(out), *extra])
    assert code == cli.EXIT_OK, (out / "locust.log").read_text()[-2000:]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    write_article_workloads(out, lang="en")
    return out


def check_server_side(prom: PrometheusServer, variant: str, before: Snapshot, after: Snapshot, window: str) -> None:
    c = delta(before, after, "vllm:spec_decode_num_accepted_tokens_total")
    d = delta(before, after, "vllm:spec_decode_num_draft_tokens_total")
    r = delta(before, after, "vllm:spec_decode_num_drafts_total")
    assert r > 0 and d > 0
    rate = one(prom.values(f"variant:vllm_spec_decode_acceptance_rate:ratio_rate{window}"), variant=variant)
    length = one(prom.values(f"variant:vllm_spec_decode_mean_acceptance_length:ratio_rate{window}"), variant=variant)
    assert rate == pytest.approx(c / d, rel=1e-9), (window, c, d)
    assert length == pytest.approx(1 + c / r, rel=1e-9), (window, c, r)


def check_per_task(prom: PrometheusServer, variant: str, before: Snapshot, after: Snapshot, window: str) -> None:
    for task in ("code", "chat"):
        c = delta(before, after, "specwatch_accepted_tokens_total", variant=variant, task=task)
        d = delta(before, after, "specwatch_draft_tokens_total", variant=variant, task=task)
        r = delta(before, after, "specwatch_spec_steps_total", variant=variant, task=task)
        decode = delta(before, after, "specwatch_decode_steps_total", variant=variant, task=task)
        assert d > 0 and r > 0, (task, d, r)
        got = prom.values(f"variant_task:specwatch_acceptance_rate:ratio_rate{window}")
        assert one(got, variant=variant, task=task) == pytest.approx(c / d, rel=1e-9), (task, window, c, d)
        got = prom.values(f"variant_task:specwatch_mean_acceptance_length:ratio_rate{window}")
        assert one(got, variant=variant, task=task) == pytest.approx(1 + c / r, rel=1e-9), (task, window)
        got = prom.values(f"variant_task:specwatch_draft_coverage:ratio_rate{window}")
        assert one(got, variant=variant, task=task) == pytest.approx(r / decode, rel=1e-9), (task, window)


def test_recorded_acceptance_equals_exact_snapshot_differences_on_the_simulator(
        service_factory: Callable[[str, list[str]], Service],
        prometheus_factory: Callable[[Targets], PrometheusServer], data: Path, tmp_path: Path) -> None:
    candidate = service_factory("sim", NGRAM_SIM_ARGS)
    baseline = service_factory("sim", SIM_BASELINE_ARGS)
    tap = service_factory("exporter", ["--upstream", f"baseline={baseline.url}",
                                       "--upstream", f"candidate={candidate.url}", "--split", "candidate=50"])
    prom = prometheus_factory(Targets({"baseline": baseline.url, "candidate": candidate.url}, (tap.url,)))
    prom.wait_until_up(3)
    start = time.monotonic()
    server_before, tap_before, baseline_before = snapshot(candidate.url), snapshot(tap.url), snapshot(baseline.url)
    run_load(tap, data, tmp_path / "load", "--concurrency", "4", "--requests", "16", "--warmup", "1",
             "--max-tokens", "32")
    server_after, tap_after, baseline_after = settled(candidate.url), settled(tap.url), settled(baseline.url)
    # every request reached a server through the tap, and the tap summed exactly what vLLM counted
    assert delta(tap_before, tap_after, "specwatch_spec_steps_total", variant="candidate") == \
        delta(server_before, server_after, "vllm:spec_decode_num_drafts_total")
    assert delta(baseline_before, baseline_after, "vllm:generation_tokens_total") > 0  # the split sent it some
    # The baseline too: its targets are scraped at their own phase, and a rate needs a sample after the load
    # (CI once evaluated the rules between the candidate's last scrape and the baseline's: no baseline rate).
    last = max(wait_for_totals(prom, server_after, SERVER_COUNTERS, '{variant="candidate"}'),
               wait_for_totals(prom, tap_after, TAP_COUNTERS),
               wait_for_totals(prom, baseline_after, ("vllm:generation_tokens_total",), '{variant="baseline"}'))
    ratios = ("variant_task:specwatch_acceptance_rate", "variant:vllm_spec_decode_acceptance_rate")
    prom.wait_evaluated(last, "variant:vllm_generation_tokens:rate5m",
                        *(f"{r}:ratio_rate{w}" for w in ("1m", "5m") for r in ratios))
    assert time.monotonic() - start < 55, "the load outlasted the 1m window; the fast rules cannot be compared"
    for window in ("1m", "5m"):
        check_server_side(prom, "candidate", server_before, server_after, window)
        check_per_task(prom, "candidate", tap_before, tap_after, window)
    # the baseline does not speculate: no acceptance series for it, rather than 0 % or NaN
    assert not [k for k in prom.values("variant:vllm_spec_decode_acceptance_rate:ratio_rate5m") if
                ("variant", "baseline") in k]
    # Exact reconciliation is the snapshot equality above. The recorded one divides rates of two
    # targets scraped at different phases: on a Prometheus up for seconds the extrapolation to the
    # window's end differs by up to a scrape interval over the sampled span, so only a band here.
    reconciliation = one(prom.values("variant:specwatch_reconciliation:ratio_rate5m"), variant="candidate")
    assert 0.5 < reconciliation < 2
    assert one(prom.values("variant:vllm_generation_tokens:rate5m"), variant="baseline") > 0


@pytest.mark.real_vllm
def test_recorded_acceptance_equals_exact_snapshot_differences_on_the_real_server(
        ngram_server: VllmServer, service_factory: Callable[[str, list[str]], Service],
        prometheus_factory: Callable[[Targets], PrometheusServer], data: Path, tmp_path: Path) -> None:
    # the shared server settles before Prometheus's first scrape, which opens the window the rules divide over
    server_before = settled(ngram_server.url)
    tap = service_factory("exporter", ["--upstream", f"candidate={ngram_server.url}"])
    prom = prometheus_factory(Targets({"candidate": ngram_server.url}, (tap.url,)))
    prom.wait_until_up(2)
    tap_before = snapshot(tap.url)
    run_load(tap, data, tmp_path / "load", "--concurrency", "2", "--requests", "3", "--warmup", "0",
             "--max-tokens", "48")
    server_after, tap_after = settled(ngram_server.url), settled(tap.url)
    assert delta(tap_before, tap_after, "specwatch_spec_steps_total") == \
        delta(server_before, server_after, "vllm:spec_decode_num_drafts_total")
    last = max(wait_for_totals(prom, server_after, SERVER_COUNTERS), wait_for_totals(prom, tap_after, TAP_COUNTERS))
    prom.wait_evaluated(last, "variant_task:specwatch_acceptance_rate:ratio_rate5m",
                   "variant:vllm_spec_decode_acceptance_rate:ratio_rate5m")
    check_server_side(prom, "candidate", server_before, server_after, "5m")
    check_per_task(prom, "candidate", tap_before, tap_after, "5m")
