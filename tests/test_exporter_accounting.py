"""The tap's accounting in isolation: one record in, counters out; a malformed field is bad_response."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from specwatch.acceptance import MAX_K
from specwatch.exporter.accounting import RequestRecord, account
from specwatch.exporter.config import load
from specwatch.exporter.metrics import ExporterMetrics

LABELS = {"variant": "baseline", "task": "code"}


def metrics() -> ExporterMetrics:
    return ExporterMetrics(CollectorRegistry(), load({"upstream": ["baseline=http://x"]}, None))


def record(spec: dict[str, Any] | None) -> RequestRecord:
    r = RequestRecord(request_id="r", variant="baseline", task="code", path="/v1/chat/completions", stream=False,
                      greedy=True, single=True)
    r.usage = {"prompt_tokens": 7, "completion_tokens": 12}
    r.spec = spec
    return r


def spec(hist: list[int], drafted: int) -> dict[str, Any]:
    return {"acceptance_histogram": hist, "num_spec_steps": sum(hist), "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": sum(j * h for j, h in enumerate(hist))}


def sample(m: ExporterMetrics, name: str, **extra: str) -> float | None:
    return m.registry.get_sample_value(name, {**LABELS, **extra})


def test_a_field_is_counted_as_vllm_counts_it():
    m = metrics()
    account(record(spec([1, 2, 0, 1], 12)), m)  # k = 3, four steps, C = 2 + 3 = 5
    assert sample(m, "specwatch_requests_total", outcome="ok") == 1
    assert (sample(m, "specwatch_spec_steps_total"), sample(m, "specwatch_draft_tokens_total"),
            sample(m, "specwatch_accepted_tokens_total")) == (4, 12, 5)
    assert [sample(m, "specwatch_accepted_tokens_per_pos_total", position=str(p)) for p in range(3)] == [3, 1, 1]
    assert [sample(m, "specwatch_spec_steps_by_accepted_total", accepted=str(a)) for a in range(4)] == [1, 2, 0, 1]
    assert sample(m, "specwatch_decode_steps_total") == 12 - 1 - 5
    assert sample(m, "specwatch_request_acceptance_rate_sum") == 5 / 12
    assert sample(m, "specwatch_request_acceptance_rate_count") == 1


def test_no_drafts_gives_no_per_request_rate():
    m = metrics()
    account(record(spec([0, 0, 0], 0)), m)
    assert sample(m, "specwatch_request_acceptance_rate_count") == 0
    assert sample(m, "specwatch_requests_total", outcome="ok") == 1


@pytest.mark.parametrize("bad", [
    {**spec([1, 0], 2), "num_draft_tokens": -1},
    {**spec([1, 0], 2), "acceptance_histogram": "1,0"},
    spec([1] + [0] * (MAX_K + 1), 2),  # more bins than any k the parser allows
])
def test_a_malformed_field_is_a_bad_response_and_counts_nothing(bad):
    m = metrics()
    r = record(bad)
    account(r, m)
    assert r.outcome == "bad_response"
    assert sample(m, "specwatch_requests_total", outcome="bad_response") == 1
    assert sample(m, "specwatch_requests_total", outcome="ok") == 0
    assert sample(m, "specwatch_spec_steps_total") == 0 and sample(m, "specwatch_completion_tokens_total") == 0
