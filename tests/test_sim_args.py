"""`specwatch sim`'s argv and `--speculative-config` accept and refuse what vLLM 0.32.0's `vllm serve` does.

Expected values come from the 0.32.0 sources (paths relative to the `vllm` package) and from
/work/shared/reference/vllm-0.32-wire-format.md §3.1 and §5, cited next to each test.
"""

from __future__ import annotations

import json

import pytest

from specwatch.simulator.args import SimArgs, SimKnobs, parse_sim_args
from specwatch.simulator.spec_config import (
    SPECULATIVE_CONFIG_FIELDS,
    SpecConfig,
    SpecConfigError,
    k_for_batch,
    parse_speculative_config,
)


def spec(**values: object) -> SpecConfig:
    return parse_speculative_config(json.dumps(values))


def spec_error(**values: object) -> SpecConfigError:
    with pytest.raises(SpecConfigError) as info:
        spec(**values)
    return info.value


# ---------------------------------------------------------------- n-gram lookup window
# config/speculative.py:1195-1221


def test_ngram_defaults_to_five_and_five() -> None:
    cfg = spec(method="ngram", num_speculative_tokens=3)
    assert (cfg.method, cfg.num_speculative_tokens) == ("ngram", 3)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (5, 5)
    assert cfg.model == "ngram"  # speculative.py:1171-1172


def test_ngram_one_bound_copies_to_the_other() -> None:
    only_min = spec(method="ngram", num_speculative_tokens=3, prompt_lookup_min=2)
    assert (only_min.prompt_lookup_min, only_min.prompt_lookup_max) == (2, 2)
    only_max = spec(method="ngram", num_speculative_tokens=3, prompt_lookup_max=7)
    assert (only_max.prompt_lookup_min, only_max.prompt_lookup_max) == (7, 7)
    explicit_null = spec(method="ngram", num_speculative_tokens=3, prompt_lookup_min=None, prompt_lookup_max=4)
    assert (explicit_null.prompt_lookup_min, explicit_null.prompt_lookup_max) == (4, 4)


def test_ngram_min_above_max_is_refused() -> None:
    err = spec_error(method="ngram", num_speculative_tokens=3, prompt_lookup_min=4, prompt_lookup_max=2)
    assert "prompt_lookup_min=4 must be <= prompt_lookup_max=2" in str(err)
    assert "prompt_lookup_min" in err.keys


def test_ngram_lookup_bounds_must_be_at_least_one() -> None:
    err = spec_error(method="ngram", num_speculative_tokens=3, prompt_lookup_min=0)  # Field(ge=1)
    assert "prompt_lookup_min" in str(err) and "greater than or equal to 1" in str(err)


def test_non_ngram_methods_have_no_lookup_window() -> None:
    cfg = spec(method="eagle3", model="AngelSlim/Qwen3-8B_eagle3", num_speculative_tokens=3)
    assert (cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (None, None)


# ---------------------------------------------------------------- keys (pydantic extra="forbid")


def test_unknown_key_is_refused_and_named() -> None:
    err = spec_error(method="ngram", num_speculative_tokens=3, lookahead_slots=2)
    assert err.keys == ("lookahead_slots",)
    assert "lookahead_slots" in str(err) and "Unexpected keyword argument" in str(err)


def test_misspelt_key_gets_a_suggestion() -> None:
    err = spec_error(method="ngram", num_speculative_token=3)
    assert "num_speculative_token" in str(err) and "did you mean 'num_speculative_tokens'" in str(err)


def test_valid_but_unused_keys_are_kept_in_extra() -> None:
    cfg = spec(model="Qwen/Qwen3-0.6B", num_speculative_tokens=4, draft_tensor_parallel_size=1,
               quantization="fp8", max_model_len=2048, revision="main", disable_padded_drafter_batch=False,
               parallel_drafting=True, code_revision=None)
    assert cfg.method == "draft_model"
    assert cfg.extra == {"draft_tensor_parallel_size": 1, "quantization": "fp8", "max_model_len": 2048,
                         "revision": "main", "disable_padded_drafter_batch": False, "parallel_drafting": True,
                         "code_revision": None}


def test_every_speculative_config_field_is_a_known_key() -> None:
    # The field list of SpeculativeConfig, speculative.py:390-610 (37 fields).
    assert len(SPECULATIVE_CONFIG_FIELDS) == 37
    for name in ("enforce_eager", "moe_backend", "attention_backend", "kv_cache_dtype", "use_heterogeneous_vocab",
                 "disable_eagle_block_drop", "use_local_argmax_reduction", "index_share_for_mtp_iteration",
                 "draft_load_config", "enable_adaptive_verification", "dspark_draft_topk"):
        assert name in SPECULATIVE_CONFIG_FIELDS


def test_dashed_keys_are_normalised() -> None:
    # arg_utils.py:2086-2088 replaces "-" with "_" in the keys.
    cfg = parse_speculative_config('{"method": "ngram", "num-speculative-tokens": 2, "prompt-lookup-max": 3}')
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_min, cfg.prompt_lookup_max) == (2, 3, 3)


def test_tensor_parallel_size_key_points_to_the_draft_key() -> None:
    err = spec_error(model="Qwen/Qwen3-0.6B", num_speculative_tokens=2, tensor_parallel_size=1)
    assert "'tensor_parallel_size' is not a valid argument in the speculative_config" in str(err)  # :1813-1817


def test_field_types_are_coerced_like_pydantic_lax_mode() -> None:
    cfg = spec(method="ngram", num_speculative_tokens="4", prompt_lookup_max=3.0)
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_max) == (4, 3)
    err = spec_error(model=3, num_speculative_tokens=2)
    assert "model" in err.keys and "valid string" in str(err)


def test_not_json_and_not_an_object_are_refused() -> None:
    with pytest.raises(SpecConfigError, match="--speculative-config"):
        parse_speculative_config("{method: ngram}")
    with pytest.raises(SpecConfigError, match="JSON object"):
        parse_speculative_config('["ngram", 4]')


# ---------------------------------------------------------------- num_speculative_tokens


def test_num_speculative_tokens_is_required() -> None:
    # _verify_args, speculative.py:1819-1824
    assert "num_speculative_tokens must be provided" in str(spec_error(method="ngram"))
    assert "num_speculative_tokens must be provided" in str(spec_error())
    # A draft model without k (vLLM would read n_predict from the checkpoint), speculative.py:1503-1507
    assert "`num_speculative_tokens` was not provided" in str(spec_error(model="Qwen/Qwen3-0.6B"))


@pytest.mark.parametrize(("value", "expected"), [
    (0, "Input should be greater than 0"),  # Field(default=None, gt=0)
    (-2, "Input should be greater than 0"),
    ("four", "Input should be a valid integer"),
    (2.5, "fractional part"),
    (None, "Input should be a valid integer"),  # annotated `int`, so an explicit null is refused
])
def test_invalid_num_speculative_tokens(value: object, expected: str) -> None:
    err = spec_error(method="ngram", num_speculative_tokens=value)
    assert err.keys == ("num_speculative_tokens",)
    assert "num_speculative_tokens" in str(err) and expected in str(err)


def test_k_without_a_draft_model_is_refused() -> None:
    # speculative.py:1187-1190
    err = spec_error(method="eagle3", num_speculative_tokens=3)
    assert "num_speculative_tokens was provided but without speculative model." in str(err)


# ---------------------------------------------------------------- method names


@pytest.mark.parametrize(("values", "method"), [
    ({"model": "ngram", "num_speculative_tokens": 3}, "ngram"),  # speculative.py:1136-1137
    ({"model": "[ngram]", "num_speculative_tokens": 3}, "ngram"),
    ({"method": "deepseek_mtp", "num_speculative_tokens": 1}, "mtp"),  # speculative.py:1141-1145
    ({"method": "qwen3_next_mtp", "num_speculative_tokens": 2}, "mtp"),
    ({"method": "mtp", "num_speculative_tokens": 1}, "mtp"),
    ({"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 4}, "draft_model"),  # speculative.py:1138-1139
    ({"method": "suffix"}, "suffix"),
])
def test_method_aliases_and_defaults(values: dict[str, object], method: str) -> None:
    assert parse_speculative_config(json.dumps(values)).method == method


def test_deprecated_mtp_name_warns() -> None:
    cfg = spec(method="deepseek_mtp", num_speculative_tokens=1)
    assert cfg.warnings == ("method `deepseek_mtp` is deprecated and replaced with mtp.",)


def test_mtp_without_model_drafts_from_the_target() -> None:
    # speculative.py:1148-1159: the draft layers come from the target checkpoint.
    cfg = parse_speculative_config('{"method": "mtp", "num_speculative_tokens": 1}', target_model="Qwen/Qwen3-Next")
    assert cfg.model == "Qwen/Qwen3-Next"


@pytest.mark.parametrize(("model", "method"), [
    # speculative.py:1326-1337, with the examples from its comment
    ("AngelSlim/Qwen3-8B_eagle3", "eagle3"),
    ("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "eagle3"),
    ("yuhuili/EAGLE-LLaMA3-Instruct-8B", "eagle"),
    ("Qwen/Qwen3-0.6B", "draft_model"),
])
def test_eagle_detected_from_the_model_name(model: str, method: str) -> None:
    assert spec(model=model, num_speculative_tokens=3).method == method


def test_detection_also_overrides_an_explicit_draft_model() -> None:
    # Only eagle/eagle3/dflash/dspark skip the name check (speculative.py:1327).
    assert spec(method="draft_model", model="AngelSlim/Qwen3-8B_eagle3", num_speculative_tokens=3).method == "eagle3"
    assert spec(method="eagle", model="some/eagle3-head", num_speculative_tokens=3).method == "eagle"


def test_unknown_method_is_refused_with_the_valid_names() -> None:
    err = spec_error(method="lookahead", num_speculative_tokens=3)
    assert err.keys == ("method",)
    assert "Input should be 'ngram', 'medusa'" in str(err) and "'eagle3'" in str(err)


def test_bracketed_ngram_is_only_a_model_alias() -> None:
    # `method` is a Literal without "[ngram]" (speculative.py:73-83), so pydantic refuses it
    # before __post_init__ could map it.
    assert spec_error(method="[ngram]", num_speculative_tokens=3).keys == ("method",)


@pytest.mark.parametrize("values", [
    {"method": "medusa", "model": "FasterDecoding/medusa-vicuna-7b", "num_speculative_tokens": 3},
    {"method": "ngram_gpu", "num_speculative_tokens": 3},
    {"model": "z-lab/Qwen3-8B-DFlash-b16", "num_speculative_tokens": 3},
    {"model": "my_module.MyProposer", "num_speculative_tokens": 3},  # custom_class, speculative.py:1110-1134
])
def test_valid_vllm_methods_the_simulator_does_not_model(values: dict[str, object]) -> None:
    with pytest.raises(SpecConfigError, match="does not model"):
        parse_speculative_config(json.dumps(values))


# ---------------------------------------------------------------- suffix decoding
# speculative.py:504-523, 1596-1630


def test_suffix_defaults() -> None:
    cfg = spec(method="suffix")
    assert cfg.num_speculative_tokens == 24  # defaults to the tree depth
    assert cfg.suffix_decoding_max_tree_depth == 24
    assert cfg.suffix_decoding_max_cached_requests == 10000
    assert cfg.suffix_decoding_max_spec_factor == 1.0
    assert cfg.suffix_decoding_min_token_prob == 0.1
    assert cfg.warnings == ("Defaulted num_speculative_tokens to 24 for suffix decoding.",)


def test_suffix_k_follows_the_tree_depth_unless_given() -> None:
    assert spec(method="suffix", suffix_decoding_max_tree_depth=8).num_speculative_tokens == 8
    assert spec(method="suffix", suffix_decoding_max_tree_depth=8, num_speculative_tokens=5).num_speculative_tokens == 5


@pytest.mark.parametrize(("key", "value", "rule"), [
    ("suffix_decoding_max_tree_depth", 0, "suffix_decoding_max_tree_depth=0 must be >= 1"),
    ("suffix_decoding_max_cached_requests", -1, "suffix_decoding_max_cached_requests=-1 must be >= 0"),
    ("suffix_decoding_max_spec_factor", -0.5, "suffix_decoding_max_spec_factor=-0.5 must be >= 0"),
    ("suffix_decoding_min_token_prob", 1.5, "suffix_decoding_min_token_prob=1.5 must be in [0, 1]"),
])
def test_suffix_bounds(key: str, value: float, rule: str) -> None:
    err = spec_error(method="suffix", **{key: value})
    assert rule in str(err) and err.keys == (key,)


# ---------------------------------------------------------------- synthetic rejection sampling
# speculative.py:529-598, 1832-1847; v1/spec_decode/utils.py:848-851


def test_synthetic_rates() -> None:
    cfg = spec(method="ngram", num_speculative_tokens=3, rejection_sample_method="synthetic",
               synthetic_acceptance_rates=[0.8, 0.4, 0.0])
    assert cfg.synthetic_acceptance_rates == (0.8, 0.4, 0.0)
    assert cfg.synthetic_conditional_rates == (0.8, 0.5, 0.0)


def test_synthetic_length_becomes_the_minimum_variance_schedule() -> None:
    cfg = spec(method="ngram", num_speculative_tokens=4, rejection_sample_method="synthetic",
               synthetic_acceptance_length=3.5)
    assert cfg.synthetic_acceptance_rates == (1.0, 1.0, 0.5, 0.0)  # floor(L-1) ones, the fraction, zeros
    assert cfg.synthetic_acceptance_length == 3.5
    full = spec(method="ngram", num_speculative_tokens=2, rejection_sample_method="synthetic",
                synthetic_acceptance_length=3)
    assert full.synthetic_acceptance_rates == (1.0, 1.0)


@pytest.mark.parametrize(("values", "message"), [
    ({}, "requires exactly one of synthetic_acceptance_rates or synthetic_acceptance_length"),
    ({"synthetic_acceptance_rates": [0.5, 0.5, 0.5], "synthetic_acceptance_length": 2.0}, "requires exactly one"),
    ({"synthetic_acceptance_rates": [0.5, 0.5]}, "synthetic_acceptance_rates must have length 3"),
    ({"synthetic_acceptance_rates": [1.2, 0.5, 0.1]}, "entries must be in [0, 1]"),
    ({"synthetic_acceptance_rates": [0.5, 0.6, 0.1]}, "must be non-increasing"),
    ({"synthetic_acceptance_length": 0.5}, "synthetic_acceptance_length must be in [1, 4], got 0.5."),
    ({"synthetic_acceptance_length": 4.5}, "synthetic_acceptance_length must be in [1, 4], got 4.5."),
])
def test_synthetic_validation(values: dict[str, object], message: str) -> None:
    err = spec_error(method="ngram", num_speculative_tokens=3, rejection_sample_method="synthetic", **values)
    assert message in str(err)


def test_synthetic_keys_need_the_synthetic_method() -> None:
    err = spec_error(method="ngram", num_speculative_tokens=3, synthetic_acceptance_length=2.0)
    assert "only valid with rejection_sample_method='synthetic'" in str(err)


def test_rejection_and_draft_sample_methods() -> None:
    cfg = spec(method="ngram", num_speculative_tokens=3)
    assert (cfg.rejection_sample_method, cfg.draft_sample_method) == ("standard", "greedy")
    block = spec(model="AngelSlim/Qwen3-8B_eagle3", num_speculative_tokens=3, rejection_sample_method="block",
                 draft_sample_method="probabilistic")
    assert (block.rejection_sample_method, block.draft_sample_method) == ("block", "probabilistic")
    assert spec_error(method="ngram", num_speculative_tokens=3, rejection_sample_method="typical").keys == (
        "rejection_sample_method",)
    assert spec_error(method="ngram", num_speculative_tokens=3, draft_sample_method="top_k").keys == (
        "draft_sample_method",)


# ---------------------------------------------------------------- dynamic k per batch size
# v1/spec_decode/dynamic/utils.py:7-148


def test_k_for_batch_ranges_gaps_and_tail() -> None:
    cfg = spec(method="ngram", num_speculative_tokens=4,
               num_speculative_tokens_per_batch_size=[[9, 16, 2], [1, 4, 4], [33, 64, 1]])
    assert cfg.num_speculative_tokens_per_batch_size == ((1, 4, 4), (9, 16, 2), (33, 64, 1))  # sorted
    assert [k_for_batch(cfg, b) for b in (1, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 1000)] == [
        4, 4, 4, 4, 2, 2, 2, 2, 1, 1, 1, 1]


def test_k_for_batch_is_capped_at_k_and_may_be_zero() -> None:
    cfg = spec(method="ngram", num_speculative_tokens=4, num_speculative_tokens_per_batch_size=[[1, 8, 6], [9, 9, 0]])
    assert (k_for_batch(cfg, 1), k_for_batch(cfg, 8), k_for_batch(cfg, 9), k_for_batch(cfg, 50)) == (4, 4, 0, 0)


def test_k_for_batch_without_a_schedule_is_k() -> None:
    assert k_for_batch(spec(method="ngram", num_speculative_tokens=3), 64) == 3
    # An empty list is falsy, so the scheduler never builds a lookup (scheduler.py:309).
    empty = spec(method="ngram", num_speculative_tokens=3, num_speculative_tokens_per_batch_size=[])
    assert k_for_batch(empty, 64) == 3


@pytest.mark.parametrize(("schedule", "message"), [
    ([[2, 8, 3]], "The first batch-size range must start at 1"),
    ([[1, 8, 3], [8, 16, 2]], "Batch-size ranges must be non-overlapping and sorted."),
    ([[1, 8, 3], [12, 10, 2]], "Batch-size range start must be <= end for (12, 10, 2)."),
    ([[1, 8, -1]], "num_speculative_tokens_per_batch_size values must be >= 0."),
    ([[0, 8, 3]], "Batch-size range (0, 8) must be positive."),
    ([[1, 8, 3, 4]], "Tuple should have at most 3 items"),
    ([[1, 8]], "Field required"),
])
def test_schedule_validation(schedule: list[list[int]], message: str) -> None:
    err = spec_error(method="ngram", num_speculative_tokens=3, num_speculative_tokens_per_batch_size=schedule)
    assert message in str(err)
    assert err.keys == ("num_speculative_tokens_per_batch_size",)


# ---------------------------------------------------------------- async scheduling
# config/vllm.py:1585-1619; reference §0 fact 3


@pytest.mark.parametrize(("values", "expected"), [
    ({"method": "ngram", "num_speculative_tokens": 3}, False),
    ({"method": "suffix"}, False),
    ({"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3}, True),
    ({"model": "yuhuili/EAGLE-LLaMA3-Instruct-8B", "num_speculative_tokens": 3}, True),
    ({"model": "AngelSlim/Qwen3-8B_eagle3", "num_speculative_tokens": 3}, True),
    ({"method": "mtp", "num_speculative_tokens": 1}, True),
    ({"model": "AngelSlim/Qwen3-8B_eagle3", "num_speculative_tokens": 3, "disable_padded_drafter_batch": True},
     False),
])
def test_async_scheduled(values: dict[str, object], expected: bool) -> None:
    assert parse_speculative_config(json.dumps(values)).async_scheduled is expected


# ---------------------------------------------------------------- argv

ARTICLE_NGRAM = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_min":2,"prompt_lookup_max":4}'
ARTICLE_ARGV = [
    "Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--host", "127.0.0.1", "--port", "8000",
    "--dtype", "bfloat16", "--tensor-parallel-size", "1", "--kv-cache-dtype", "auto", "--max-model-len", "4096",
    "--max-num-seqs", "16", "--max-num-batched-tokens", "4096", "--gpu-memory-utilization", "0.85",
    "--no-enable-prefix-caching", "--generation-config", "vllm", "--seed", "42",
    "--per-request-spec-decode-metrics", "summary", "--speculative-config", ARTICLE_NGRAM,
]


def test_the_articles_common_argv() -> None:
    args = parse_sim_args(ARTICLE_ARGV)
    assert args.model == "Qwen/Qwen3-8B"
    assert args.served_model_names == ("spec-demo",)
    assert (args.host, args.port) == ("127.0.0.1", 8000)
    assert (args.max_model_len, args.max_num_seqs, args.seed) == (4096, 16, 42)
    assert args.gpu_memory_utilization == 0.85
    assert args.per_request_spec_decode_metrics == "summary"
    assert args.speculative == SpecConfig(method="ngram", num_speculative_tokens=4, model="ngram",
                                          prompt_lookup_min=2, prompt_lookup_max=4)
    assert args.speculative is not None and not args.speculative.async_scheduled
    assert args.ignored == (
        ("--dtype", "bfloat16"), ("--tensor-parallel-size", "1"), ("--kv-cache-dtype", "auto"),
        ("--max-num-batched-tokens", "4096"), ("--enable-prefix-caching", "False"), ("--generation-config", "vllm"),
    )
    assert args.sim == SimKnobs()


def test_defaults() -> None:
    args = parse_sim_args(["Qwen/Qwen3-8B"])
    assert args == SimArgs(model="Qwen/Qwen3-8B", served_model_names=("Qwen/Qwen3-8B",))
    assert args.host == "127.0.0.1"  # ours; vLLM's default host is every interface
    assert args.port == 8000  # FrontendArgs.port
    assert args.speculative is None and args.per_request_spec_decode_metrics == "none"
    assert (args.enable_force_include_usage, args.enable_per_request_metrics, args.disable_log_stats) == (
        False, False, False)
    assert args.gpu_memory_utilization == 0.92  # CacheConfig, cache.py:102
    assert args.block_size == 16  # CacheConfig.DEFAULT_BLOCK_SIZE, cache.py:72
    assert args.seed == 0  # ModelConfig.seed, model.py:206
    assert (args.max_model_len, args.num_gpu_blocks_override) == (None, None)
    assert args.sim == SimKnobs(time_scale=1.0, draft_acceptance=None, gpu="h200", kv_blocks=None, seed=0)


def test_max_num_seqs_default_follows_vllm_for_the_simulated_gpu() -> None:
    # arg_utils.py:2933-2952, 3123-3180: 1024 on >= 70 GiB non-A100 GPUs for the API server,
    # else 256; capped by --max-num-batched-tokens when that is given.
    assert parse_sim_args(["m"]).max_num_seqs == 1024
    assert parse_sim_args(["m", "--sim-gpu", "H100"]).max_num_seqs == 1024
    assert parse_sim_args(["m", "--sim-gpu", "a100"]).max_num_seqs == 256
    assert parse_sim_args(["m", "--sim-gpu", "l4"]).max_num_seqs == 256
    assert parse_sim_args(["m", "--max-num-batched-tokens", "512"]).max_num_seqs == 512
    assert parse_sim_args(["m", "--max-num-seqs", "4", "--max-num-batched-tokens", "2"]).max_num_seqs == 4


def test_model_forms() -> None:
    assert parse_sim_args([]).model == "Qwen/Qwen3-0.6B"  # ModelConfig.model default, model.py:154
    assert parse_sim_args(["--port", "9000", "--model", "a/b"]).model == "a/b"
    assert parse_sim_args(["--model=a/b", "--served-model-name", "x"]).served_model_names == ("x",)
    assert parse_sim_args(["a/b", "--served-model-name", "x", "y"]).served_model_names == ("x", "y")


def test_served_model_name_needs_a_positional_model() -> None:
    # argparse_utils.py: --served-model-name with the first argument an option
    with pytest.raises(ValueError, match="`model` should be provided as the first positional argument"):
        parse_sim_args(["--port", "9000", "--served-model-name", "x"])


def test_underscored_flags_and_human_readable_lengths() -> None:
    args = parse_sim_args(["m", "--max_num_seqs", "8", "--max-model-len", "4k"])
    assert (args.max_num_seqs, args.max_model_len) == (8, 4000)
    assert parse_sim_args(["m", "--max-model-len", "auto"]).max_model_len is None
    assert parse_sim_args(["m", "--max-model-len", "2K"]).max_model_len == 2048


def test_unknown_and_abbreviated_flags_exit_2() -> None:
    for argv in (["m", "--frobnicate"], ["m", "--max-num-s", "4"], ["m", "--port", "http"],
                 ["m", "--dtype", "int3"], ["m", "--per-request-spec-decode-metrics", "full"]):
        with pytest.raises(SystemExit) as info:
            parse_sim_args(argv)
        assert info.value.code == 2


# ---------------------------------------------------------------- --speculative-config on argv


def test_speculative_config_that_is_not_json_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_sim_args(["m", "--speculative-config", "{method: ngram}"])
    assert info.value.code == 2
    assert "argument --speculative-config/-sc: Value {method: ngram} cannot be converted" in capsys.readouterr().err


def test_speculative_config_semantic_errors_raise() -> None:
    with pytest.raises(SpecConfigError, match="lookahead"):
        parse_sim_args(["m", "-sc", '{"method": "ngram", "num_speculative_tokens": 3, "lookahead": 1}'])


def test_speculative_config_none_means_no_speculation() -> None:
    assert parse_sim_args(["m", "--speculative-config", "None"]).speculative is None  # optional_type


def test_dotted_speculative_config() -> None:
    args = parse_sim_args(["m", "--speculative-config.method", "ngram", "--speculative-config.num_speculative_tokens",
                           "3", "--speculative-config.prompt_lookup_max=4"])
    assert args.speculative is not None
    assert (args.speculative.method, args.speculative.num_speculative_tokens) == ("ngram", 3)
    assert (args.speculative.prompt_lookup_min, args.speculative.prompt_lookup_max) == (4, 4)


def test_spec_shorthands() -> None:
    # arg_utils.py:1831-1835, 2068-2081
    args = parse_sim_args(["m", "--spec-method", "ngram", "--spec-tokens", "3"])
    assert args.speculative is not None
    assert (args.speculative.method, args.speculative.num_speculative_tokens) == ("ngram", 3)
    args = parse_sim_args(["m", "--spec-model", "AngelSlim/Qwen3-8B_eagle3", "--spec-tokens", "2"])
    assert args.speculative is not None and args.speculative.method == "eagle3"
    mixed = parse_sim_args(["m", "-sc", '{"method": "ngram"}', "--spec-tokens", "5"])
    assert mixed.speculative is not None and mixed.speculative.num_speculative_tokens == 5


@pytest.mark.parametrize(("flag", "value", "key"), [
    ("--spec-tokens", "4", "num_speculative_tokens"),
    ("--spec-method", "ngram", "method"),
    ("--spec-model", "ngram", "model"),
])
def test_spec_shorthand_conflicts_with_the_json(flag: str, value: str, key: str) -> None:
    sc = '{"method": "ngram", "model": "ngram", "num_speculative_tokens": 3}'
    with pytest.raises(SpecConfigError) as info:
        parse_sim_args(["m", "-sc", sc, flag, value])
    assert str(info.value) == f"{flag} and --speculative-config['{key}'] are mutually exclusive"


def test_spec_method_choices_exit_2() -> None:
    with pytest.raises(SystemExit) as info:
        parse_sim_args(["m", "--spec-method", "lookahead", "--spec-tokens", "3"])
    assert info.value.code == 2


def test_mtp_and_draft_limits_use_the_target_flags() -> None:
    args = parse_sim_args(["Qwen/Qwen3-Next-80B-A3B-Instruct", "-sc", '{"method": "mtp", "num_speculative_tokens": 1}'])
    assert args.speculative is not None and args.speculative.model == "Qwen/Qwen3-Next-80B-A3B-Instruct"
    draft = '{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3, "max_model_len": 8192}'
    with pytest.raises(SpecConfigError, match="speculative_max_model_len=8192 cannot be larger than "
                                              "target_max_model_len=4096"):  # speculative.py:1649-1660
        parse_sim_args(["m", "--max-model-len", "4096", "-sc", draft])
    draft_tp = '{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 2}'
    with pytest.raises(SpecConfigError, match="cannot be other value than 1 or target model"):  # :1735-1742
        parse_sim_args(["m", "-sc", draft_tp])
    assert parse_sim_args(["m", "-tp", "2", "-sc", draft_tp]).speculative is not None


# ---------------------------------------------------------------- per-request metrics flags
# reference §3.1; config/vllm.py:1659-1666; entrypoints/launchers/cli_args.py:535-541


def test_per_request_spec_decode_metrics_needs_a_speculative_config() -> None:
    for level in ("summary", "detailed"):
        with pytest.raises(ValueError, match=r"--per-request-spec-decode-metrics requires speculative decoding "
                                             r"to be enabled \(via --speculative-config\)\."):
            parse_sim_args(["m", "--per-request-spec-decode-metrics", level])
    assert parse_sim_args(["m", "--per-request-spec-decode-metrics", "none"]).per_request_spec_decode_metrics == "none"
    ok = parse_sim_args(["m", "--per-request-spec-decode-metrics", "detailed", "--spec-method", "ngram",
                         "--spec-tokens", "2"])
    assert ok.per_request_spec_decode_metrics == "detailed"


def test_per_request_metrics_refused_with_disable_log_stats() -> None:
    with pytest.raises(ValueError, match="--enable-per-request-metrics requires engine statistics logging"):
        parse_sim_args(["m", "--enable-per-request-metrics", "--disable-log-stats"])
    args = parse_sim_args(["m", "--enable-per-request-metrics", "--enable-force-include-usage"])
    assert (args.enable_per_request_metrics, args.enable_force_include_usage) == (True, True)
    assert parse_sim_args(["m", "--disable-log-stats"]).disable_log_stats is True
    assert parse_sim_args(["m", "--no-enable-force-include-usage"]).enable_force_include_usage is False


# ---------------------------------------------------------------- sizing flags


def test_cache_flags() -> None:
    args = parse_sim_args(["m", "--num-gpu-blocks-override", "512", "--block-size", "32",
                           "--device-memory-utilization", "0.5"])
    assert (args.num_gpu_blocks_override, args.block_size, args.gpu_memory_utilization) == (512, 32, 0.5)
    for bad in ("0", "1.5"):  # CacheConfig: Field(default=0.92, gt=0, le=1)
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            parse_sim_args(["m", "--gpu-memory-utilization", bad])
    with pytest.raises(ValueError, match="max_num_seqs"):  # SchedulerConfig: Field(ge=1)
        parse_sim_args(["m", "--max-num-seqs", "0"])


# ---------------------------------------------------------------- GPU-only flags and --sim-*


def test_gpu_only_flags_are_accepted_and_listed() -> None:
    args = parse_sim_args(["m", "-tp", "2", "--dtype", "half", "--kv-cache-dtype", "fp8", "--max-num-batched-tokens",
                           "8k", "--enable-prefix-caching", "--generation-config", "auto", "--enforce-eager",
                           "--trust-remote-code", "--disable-log-requests", "--no-enable-log-requests"])
    assert args.ignored == (
        ("--dtype", "half"), ("--tensor-parallel-size", "2"), ("--kv-cache-dtype", "fp8"),
        ("--max-num-batched-tokens", "8000"), ("--enable-prefix-caching", "True"), ("--generation-config", "auto"),
        ("--enforce-eager", "True"), ("--trust-remote-code", "True"), ("--enable-log-requests", "False"),
        ("--disable-log-requests", "True"),
    )
    assert parse_sim_args(["m", "--enable-log-requests"]).ignored == (("--enable-log-requests", "True"),)
    assert parse_sim_args(["m"]).ignored == ()


def test_sim_knobs() -> None:
    args = parse_sim_args(["m", "--sim-time-scale", "0.01", "--sim-draft-acceptance", "0.8, 0.6,0.5",
                           "--sim-gpu", "H100", "--sim-kv-blocks", "4096", "--sim-seed", "7"])
    assert args.sim == SimKnobs(time_scale=0.01, draft_acceptance=(0.8, 0.6, 0.5), gpu="h100", kv_blocks=4096, seed=7)


@pytest.mark.parametrize("argv", [
    ["--sim-time-scale", "0"], ["--sim-time-scale", "-1"], ["--sim-time-scale", "fast"],
    ["--sim-draft-acceptance", "0.8,1.2"], ["--sim-draft-acceptance", "0.8,,0.5"],
    ["--sim-kv-blocks", "0"], ["--sim-gpu", " "], ["--sim-seed", "x"],
])
def test_bad_sim_knobs_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_sim_args(["m", *argv])
    assert info.value.code == 2
