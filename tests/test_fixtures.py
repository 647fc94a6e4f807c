"""The committed golden captures of the real vLLM 0.32.0 are complete and self-consistent."""

from pathlib import Path

import pytest

from tests.capture_checks import check_capture

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0"


@pytest.mark.parametrize("variant,speculative", [("baseline", False), ("ngram", True), ("ngram-detailed", True)])
def test_committed_capture(variant, speculative):
    check_capture(FIXTURES / variant, speculative)


def test_detailed_capture_has_per_step_lists_and_timing():
    from tests.capture_checks import final_body

    body = final_body(FIXTURES / "ngram-detailed", "chat_nonstream")
    field = body["metrics"]["speculative_decoding"]
    assert len(field["per_step_accepted"]) == field["num_spec_steps"] == len(field["per_step_drafted"])
    assert sum(field["per_step_accepted"]) == field["num_accepted_draft_tokens"]
    assert sum(field["per_step_drafted"]) == field["num_draft_tokens"]
    assert body["metrics"]["generation_time_ms"] > 0
    summary = final_body(FIXTURES / "ngram", "chat_nonstream")["metrics"]["speculative_decoding"]
    assert summary["per_step_accepted"] is None  # non-streaming keeps nulls
    stream = final_body(FIXTURES / "ngram", "chat_stream_usage")["metrics"]["speculative_decoding"]
    assert "per_step_accepted" not in stream  # streaming drops them (exclude_none)
