"""The real vLLM 0.32.0 on CPU with n-gram: per-request fields reconcile exactly with /metrics."""

from __future__ import annotations

import json

import pytest
import requests

from specwatch import cli
from specwatch.acceptance import total
from specwatch.chat_client import chat_body, fetch_metrics, run_chat
from specwatch.reconcile import reconcile
from specwatch.snapshot import server_figures
from specwatch.vllm_cpu.capture import capture_server, exchanges
from specwatch.workloads import article_rows
from tests.capture_checks import check_capture, exchange_shapes, sse_events, vllm_families
from tests.test_exporter import value

pytestmark = pytest.mark.real_vllm


def stream_usage_chunk(url: str, body: dict) -> dict:
    response = requests.post(url + "/v1/chat/completions", timeout=300,
                             json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert response.status_code == 200
    events = sse_events(response.content)
    assert events[-1] == "[DONE]" and events[-2]["choices"] == []
    return dict(events[-2])


def test_summed_fields_equal_counter_differences_per_position_included(ngram_server):
    url = ngram_server.url
    code, chat = article_rows("code")[:3], article_rows("chat")[:3]
    before = fetch_metrics(url)
    bodies = [r.body for r in run_chat(url, code + chat, max_tokens=64, concurrency=3)]
    bodies.append(stream_usage_chunk(url, chat_body(article_rows("code")[5], 32)))
    after = fetch_metrics(url)

    fields = [b["metrics"]["speculative_decoding"] for b in bodies]
    assert all(len(f["acceptance_histogram"]) == 5 and f["num_spec_tokens"] == 4 for f in fields)
    delta = server_figures(before, after)
    # Independent sums straight from the JSON, compared with the counter differences.
    assert delta.steps == sum(f["num_spec_steps"] for f in fields)
    assert delta.draft_tokens == sum(f["num_draft_tokens"] for f in fields)
    assert delta.accepted == sum(f["num_accepted_draft_tokens"] for f in fields)
    for p in range(4):
        assert delta.per_position[p] == sum(sum(f["acceptance_histogram"][p + 1:]) for f in fields)
    assert delta.steps > 0 and delta.accepted > 0, "copy-heavy code prompts must draft and accept"
    per_pos = [delta.per_position[p] for p in range(4)]
    assert per_pos == sorted(per_pos, reverse=True), "position-wise acceptance never increases"


def test_main_job_against_the_real_server(ngram_server, tmp_path, capsys):
    code = cli.main(["check-server", "--url", ngram_server.url, "--rows", "2", "--max-tokens", "48",
                     "--out", str(tmp_path), "--json"])
    assert code == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "reconciliation with /metrics counter deltas" in out and "all equal" in out
    printed = json.loads(out.strip().splitlines()[-1])
    for task in ("code", "chat"):  # the run folder's acceptance pass (a one-variant study)
        saved = [json.loads(line) for line in
                 (tmp_path / "variants" / "ngram" / "acceptance" / f"{task}.jsonl").read_text().splitlines()]
        fields = [s["response"]["metrics"]["speculative_decoding"] for s in saved]
        tokens = sum(s["response"]["usage"]["completion_tokens"] for s in saved)
        c = sum(f["num_accepted_draft_tokens"] for f in fields)
        d = sum(f["num_draft_tokens"] for f in fields)
        r = sum(f["num_spec_steps"] for f in fields)
        assert (printed[task]["C"], printed[task]["D"], printed[task]["R"]) == (c, d, r)
        assert printed[task]["acceptance_rate"] == (c / d if d else None)
        assert printed[task]["drafted_token_share"] == c / tokens
        columns = zip(*(f["acceptance_histogram"] for f in fields), strict=True)
        assert printed[task]["histogram"] == [sum(col) for col in columns]


@pytest.fixture(scope="module")
def real_capture(ngram_server, tmp_path_factory):
    """One capture of the real server (~40 s here), checked by one test and compared with the simulator's by
    the next: the same requests both would send."""
    folder = tmp_path_factory.mktemp("capture-real")
    capture_server(ngram_server.url, folder)
    return folder


def test_capture_command_records_a_consistent_capture(real_capture):
    check_capture(real_capture, speculative=True)


def test_simulator_is_indistinguishable_from_the_real_server_on_the_wire(real_capture, sim_ngram, tmp_path):
    """The same requests to the real vLLM and to `specwatch sim`: same shapes, statuses, counting rules."""
    real, sim = real_capture, tmp_path / "sim"
    capture_server(sim_ngram.url, sim)
    check_capture(real, speculative=True)
    check_capture(sim, speculative=True)
    real_manifest = json.loads((real / "manifest.json").read_text())["exchanges"]
    sim_manifest = json.loads((sim / "manifest.json").read_text())["exchanges"]
    assert [(e["name"], e["status"], e["content_type"]) for e in sim_manifest] == \
        [(e["name"], e["status"], e["content_type"]) for e in real_manifest]
    for exchange in exchanges():
        assert exchange_shapes(sim, exchange.name) == exchange_shapes(real, exchange.name), exchange.name
    assert vllm_families((sim / "metrics_after.txt").read_text()) == vllm_families(
        (real / "metrics_after.txt").read_text())


def test_reconcile_flags_a_mismatch(ngram_server):
    """The reconciliation can fail: a request the fields do not see makes the counters disagree."""
    url = ngram_server.url
    before = fetch_metrics(url)
    seen = run_chat(url, article_rows("code")[:1], max_tokens=32)
    run_chat(url, article_rows("code")[1:2], max_tokens=32)  # drafts, but left out of the sum
    delta = server_figures(before, fetch_metrics(url))
    checks = reconcile(total(r.body for r in seen), delta)
    assert any(not c.equal for c in checks)


def test_exporter_in_front_of_the_real_server_counts_exactly(ngram_server, service_factory):
    """Per task: the tap's counters equal the fields clients received; in total: the server's deltas."""
    tap = service_factory("exporter", ["--upstream", f"baseline={ngram_server.url}"])
    before = fetch_metrics(ngram_server.url)
    received: dict[str, list[dict]] = {"code": [], "chat": []}
    for task in ("code", "chat"):
        for row in article_rows(task)[:2]:
            r = requests.post(tap.url + "/v1/chat/completions", json=chat_body(row, 40), timeout=300,
                              headers={"X-Specwatch-Task": task})
            received[task].append(r.json()["metrics"]["speculative_decoding"])
    for task, fields in received.items():
        for family, key in (("specwatch_accepted_tokens_total", "num_accepted_draft_tokens"),
                            ("specwatch_draft_tokens_total", "num_draft_tokens"),
                            ("specwatch_spec_steps_total", "num_spec_steps")):
            assert value(tap.url, family, task=task) == sum(f[key] for f in fields), (task, family)
    for task in ("code", "chat"):  # streams without usage: the clients get none, the tap still counts them
        stream = requests.post(tap.url + "/v1/chat/completions", timeout=300, headers={"X-Specwatch-Task": task},
                               json={**chat_body(article_rows(task)[2], 24), "stream": True})
        assert all(e == "[DONE]" or e["choices"] for e in sse_events(stream.content))
    delta = server_figures(before, fetch_metrics(ngram_server.url))
    assert value(tap.url, "specwatch_spec_steps_total") == delta.steps
    assert value(tap.url, "specwatch_draft_tokens_total") == delta.draft_tokens
    assert value(tap.url, "specwatch_accepted_tokens_total") == delta.accepted
    for p in range(4):
        assert value(tap.url, "specwatch_accepted_tokens_per_pos_total", position=str(p)) == delta.per_position[p]
    assert value(tap.url, "specwatch_requests_total", outcome="ok") == 6
    assert value(tap.url, "specwatch_spec_metrics_missing_total") == 0

