"""Per-task sums: C, D, R summed first, then divided; D = 0 is no value; bad fields are named."""

import pytest

from specwatch.acceptance import Acceptance, AcceptanceFieldError, spec_field, total


def body(hist: list[int], drafted: int, tokens: int) -> dict:
    accepted = sum(j * h for j, h in enumerate(hist))
    return {"usage": {"completion_tokens": tokens},
            "metrics": {"speculative_decoding": {
                "acceptance_histogram": hist, "num_spec_steps": sum(hist),
                "num_accepted_draft_tokens": accepted, "num_draft_tokens": drafted}}}


def test_sums_before_dividing_not_mean_of_ratios():
    # request 1: 1 step, 4 drafted, 4 accepted (100 %); request 2: 3 steps, 12 drafted, 0 accepted (0 %)
    a = total([body([0, 0, 0, 0, 1], 4, 6), body([3, 0, 0, 0, 0], 12, 4)])
    assert (a.accepted, a.drafted, a.steps) == (4, 16, 4)
    assert a.acceptance_rate == 0.25  # not the 0.5 an average of per-request rates gives
    assert a.mean_acceptance_length == 2.0
    assert a.histogram == (3, 0, 0, 0, 1)
    assert a.per_position == (0.25, 0.25, 0.25, 0.25)
    assert a.drafted_token_share == 0.4


def test_per_position_is_survival_and_never_increases():
    a = total([body([2, 3, 1, 0, 4], 40, 30)])
    assert a.per_position == (8 / 10, 5 / 10, 4 / 10, 4 / 10)
    assert all(x >= y for x, y in zip(a.per_position, a.per_position[1:], strict=False))


def test_no_drafts_is_no_value_not_zero():
    a = total([body([0, 0, 0, 0, 0], 0, 12)])
    assert a.acceptance_rate is None and a.mean_acceptance_length is None
    assert a.per_position == ()
    assert a.as_dict()["acceptance_rate"] is None


def test_missing_field_is_counted_not_dropped():
    a = total([{"usage": {"completion_tokens": 5}, "metrics": None}, body([1, 0, 0], 2, 3)])
    assert (a.requests, a.missing, a.output_tokens) == (2, 1, 8)
    assert spec_field({"metrics": {"speculative_decoding": None}}) is None


@pytest.mark.parametrize("field,match", [
    ({"acceptance_histogram": [1], "num_spec_steps": -1, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0},
     "num_spec_steps"),
    ({"acceptance_histogram": "x", "num_spec_steps": 1, "num_accepted_draft_tokens": 0, "num_draft_tokens": 0},
     "acceptance_histogram"),
])
def test_malformed_field_names_the_key(field, match):
    with pytest.raises(AcceptanceFieldError, match=match):
        Acceptance().add(field, 1)


def test_histograms_of_different_k_do_not_mix():
    with pytest.raises(AcceptanceFieldError, match="bins"):
        total([body([1, 0, 0], 2, 3), body([1, 0, 0, 0, 0], 4, 3)])
