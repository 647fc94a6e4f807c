"""Reading vLLM's exposition: sums across engines, per-position children, counter resets."""

import pytest

from specwatch.vllm_metrics import CounterResetError, SpecDecodeCounters, spec_decode_counters

TWO_ENGINES = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="spec-demo"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="spec-demo"} 5.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="spec-demo"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="spec-demo"} 40.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="spec-demo"} 20.0
# HELP vllm:spec_decode_num_accepted_tokens Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="spec-demo"} 21.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="spec-demo"} 3.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="spec-demo",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="spec-demo",position="0"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="spec-demo",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="spec-demo",position="1"} 1.0
"""


def test_sums_across_engines_and_skips_created():
    c = spec_decode_counters(TWO_ENGINES)
    assert (c.drafts, c.draft_tokens, c.accepted) == (15.0, 60.0, 24.0)
    assert c.per_position == {0: 11.0, 1: 8.0}


def test_difference_and_reset_detection():
    later = SpecDecodeCounters(20.0, 80.0, 30.0, {0: 14.0, 1: 9.0})
    d = later.minus(spec_decode_counters(TWO_ENGINES))
    assert (d.drafts, d.draft_tokens, d.accepted, d.per_position) == (5.0, 20.0, 6.0, {0: 3.0, 1: 1.0})
    restarted = SpecDecodeCounters(2.0, 8.0, 1.0, {0: 1.0, 1: 0.0})
    with pytest.raises(CounterResetError, match="restarted"):
        restarted.minus(spec_decode_counters(TWO_ENGINES))


def test_baseline_exposition_has_no_spec_counters():
    c = spec_decode_counters('# TYPE vllm:num_requests_running gauge\n'
                             'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n')
    assert c == SpecDecodeCounters()
