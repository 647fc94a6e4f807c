"""Per-task sums: C, D, R summed first, then divided; D = 0 is no value; bad fields are named."""

import pytest

from specwatch.acceptance import MAX_K, Acceptance, AcceptanceFieldError, parse, spec_field, survival, total


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


def field(hist: list[int], drafted: int) -> dict:
    return body(hist, drafted, 0)["metrics"]["speculative_decoding"]


def test_parse_reads_the_four_wire_fields_of_vllm_0_32():
    f = parse({**field([2, 3, 1, 0, 4], 40), "draft_acceptance_rate": 0.6, "num_spec_tokens": 4})
    assert (f.accepted, f.drafted, f.steps, f.histogram) == (3 + 2 + 16, 40, 10, (2, 3, 1, 0, 4))
    assert f.acceptance_rate == 21 / 40
    assert parse(field([1, 0], 0)).acceptance_rate is None  # no drafts: no rate, not 0 %


@pytest.mark.parametrize("change,match", [
    ({"num_draft_tokens": True}, "num_draft_tokens"),  # a bool is not a count
    ({"num_accepted_draft_tokens": 1.0}, "num_accepted_draft_tokens"),
    ({"num_spec_steps": None}, "num_spec_steps"),
    ({"acceptance_histogram": []}, "acceptance_histogram"),
    ({"acceptance_histogram": [1, -1]}, "acceptance_histogram"),
    ({"acceptance_histogram": [0] * (MAX_K + 2)}, "acceptance_histogram"),
])
def test_parse_refuses_what_vllm_does_not_send(change, match):
    with pytest.raises(AcceptanceFieldError, match=match):
        parse({**field([1, 0, 0], 2), **change})


def test_parse_accepts_the_largest_k_and_refuses_a_non_object():
    assert len(parse(field([0] * (MAX_K + 1), 0)).histogram) == MAX_K + 1
    with pytest.raises(AcceptanceFieldError, match="expected an object"):
        parse([1, 2, 3])  # type: ignore[arg-type]


def test_survival_is_the_per_position_count_and_sums_linearly():
    assert survival([2, 3, 1, 0, 4]) == (8, 5, 4, 4)
    assert survival([7]) == ()
    a = total([body([2, 3, 1, 0, 4], 40, 30), body([1, 1, 0, 2, 0], 16, 10)])
    assert a.survival == tuple(x + y for x, y in zip(survival([2, 3, 1, 0, 4]), survival([1, 1, 0, 2, 0]),
                                                     strict=True))
