"""Reading vLLM's exposition: sums across engines, per-position children, counter resets."""

import pytest

from specwatch.snapshot import Figures, server_figures
from specwatch.vllm_metrics import CounterResetError

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
    zero = TWO_ENGINES.replace(" 10.0", " 0.0").replace(" 5.0", " 0.0").replace(" 40.0", " 0.0").replace(
        " 20.0", " 0.0").replace(" 21.0", " 0.0").replace(" 3.0", " 0.0").replace(" 9.0", " 0.0").replace(
        " 2.0", " 0.0").replace(" 7.0", " 0.0").replace(" 1.0", " 0.0")
    d = server_figures(zero, TWO_ENGINES)
    assert (d.steps, d.draft_tokens, d.accepted) == (15.0, 60.0, 24.0)
    assert d.per_position == (11.0, 8.0)


def test_difference_and_reset_detection():
    later = (TWO_ENGINES.replace('engine="0",model_name="spec-demo"} 10.0', 'engine="0",model_name="spec-demo"} 15.0')
             .replace('model_name="spec-demo",position="0"} 9.0', 'model_name="spec-demo",position="0"} 12.0'))
    d = server_figures(TWO_ENGINES, later)
    assert (d.steps, d.draft_tokens, d.accepted, d.per_position) == (5.0, 0.0, 0.0, (3.0, 0.0))
    with pytest.raises(CounterResetError, match="restarted"):
        server_figures(later, TWO_ENGINES)


def test_baseline_exposition_has_no_spec_counters():
    baseline = ('# TYPE vllm:num_requests_running gauge\n'
                'vllm:num_requests_running{engine="0",model_name="m"} 0.0\n')
    assert server_figures(baseline, baseline) == Figures()
