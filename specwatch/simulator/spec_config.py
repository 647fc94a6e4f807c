"""`--speculative-config` for the simulator: parsed and validated as vLLM 0.32.0's `SpeculativeConfig` does.

Read from the 0.32.0 wheel, not imported. The checks follow the order vLLM runs them in:

1. pydantic field validation of the JSON object (`@config` = pydantic dataclass with
   `extra="forbid"`, `vllm/config/utils.py:70-76`): unknown keys, wrong types (lax coercion,
   e.g. "4" -> 4), `num_speculative_tokens` > 0, `prompt_lookup_*` >= 1, `Literal` values.
   All field errors are reported together, in pydantic's text format.
2. `SpeculativeConfig.__post_init__` (`vllm/config/speculative.py:1121-1594`): method
   inference and aliases, the n-gram lookup defaults, suffix defaults, eagle/eagle3 detection
   from the draft model's name.
3. `SpeculativeConfig._verify_args` (`speculative.py:1811-1868`): `num_speculative_tokens`
   present, synthetic acceptance settings.

What the simulator cannot do like vLLM, because it never opens a checkpoint: detection of
medusa / mlp_speculator / mtp from the draft's `config.json` `model_type`, a default k from a
draft's `n_predict`, and the vocabulary-size check. Methods vLLM accepts but the simulator does
not model (medusa, mlp_speculator, custom_class, extract_hidden_states, dflash, dspark,
ngram_gpu) are refused with a `SpecConfigError` that says so. Suffix decoding does not need
`arctic-inference` here.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

SimMethod = Literal["ngram", "draft_model", "eagle", "eagle3", "suffix", "mtp"]
SIMULATED_METHODS: tuple[SimMethod, ...] = ("ngram", "draft_model", "eagle", "eagle3", "suffix", "mtp")
# Every decode step of these methods is scheduled with k draft slots (async scheduling,
# `vllm/config/vllm.py:1585-1610`); ngram (CPU) and suffix run synchronously.
ASYNC_SCHEDULED_METHODS: frozenset[str] = frozenset({"draft_model", "eagle", "eagle3", "mtp"})

# `MTPModelTypes`, speculative.py:38-66: every name but "mtp" is a deprecated alias of "mtp".
MTP_MODEL_TYPES: tuple[str, ...] = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp",
    "glm_ocr_mtp", "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp",
    "qwen4_exp_mtp", "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp",
    "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp", "hy_v3_mtp",
    "hy_v4_mtp", "gemma4_mtp", "inkling_mtp", "glm5_next_mtp",
)
# `SpeculativeMethod`, speculative.py:67-83, in the order pydantic lists the flattened Literal.
SPECULATIVE_METHODS: tuple[str, ...] = (
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class",
    "eagle", "eagle3", "extract_hidden_states", *MTP_MODEL_TYPES, "dflash", "ngram_gpu", "dspark",
)
REJECTION_SAMPLE_METHODS: tuple[str, ...] = ("standard", "synthetic", "block")  # speculative.py:84
DRAFT_SAMPLE_METHODS: tuple[str, ...] = ("greedy", "probabilistic")  # speculative.py:85
# `CacheDType`, vllm/config/cache.py:39-59 (the type of the draft's `kv_cache_dtype`).
CACHE_DTYPES: tuple[str, ...] = (
    "auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
    "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit",
    "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6",
)

# Every field of `SpeculativeConfig` (speculative.py:390-610), in declaration order. These and
# only these keys are accepted; the ones `SpecConfig` has no attribute for go to `SpecConfig.extra`.
SPECULATIVE_CONFIG_FIELDS: tuple[str, ...] = (
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype",
    "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch", "disable_eagle_block_drop", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
    "target_model_config", "target_parallel_config", "num_speculative_tokens_per_batch_size",
    "draft_model_config", "draft_parallel_config", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
    "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
    "draft_sample_method", "dspark_draft_topk",
)
_OWN_FIELDS: frozenset[str] = frozenset({
    "method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "rejection_sample_method", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "num_speculative_tokens_per_batch_size", "draft_sample_method",
})

SUFFIX_DEFAULTS: dict[str, int | float] = {  # speculative.py:505-523
    "suffix_decoding_max_tree_depth": 24,
    "suffix_decoding_max_cached_requests": 10000,
    "suffix_decoding_max_spec_factor": 1.0,
    "suffix_decoding_min_token_prob": 0.1,
}


class SpecConfigError(ValueError):
    """`--speculative-config` rejected; the message follows vLLM 0.32.0's wording and names the key(s)."""

    def __init__(self, message: str, keys: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.keys: tuple[str, ...] = tuple(keys)


@dataclass(frozen=True)
class SpecConfig:
    """A validated speculative-decoding configuration, normalised as vLLM 0.32.0 leaves it."""

    method: SimMethod
    num_speculative_tokens: int
    model: str | None = None
    # n-gram only (None for every other method; vLLM stores 0 there for model-based methods).
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    rejection_sample_method: Literal["standard", "synthetic", "block"] = "standard"
    # With "synthetic": the unconditional per-position rates, length k, also when the user gave a
    # length (vLLM resolves the length into rates, speculative.py:1832-1839).
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    # The length as the user gave it (vLLM clears it after resolving it; kept here for reporting).
    synthetic_acceptance_length: float | None = None
    # Sorted `(range_start, range_end, K)` ranges; None or () = the static k.
    num_speculative_tokens_per_batch_size: tuple[tuple[int, int, int], ...] | None = None
    draft_sample_method: Literal["greedy", "probabilistic"] = "greedy"
    # Valid `SpeculativeConfig` keys the simulator does not model, with their validated values.
    extra: dict[str, Any] = field(default_factory=dict, hash=False)
    # What vLLM would log at start-up about this config (deprecated aliases, defaulted k).
    warnings: tuple[str, ...] = field(default=(), compare=False)

    @property
    def async_scheduled(self) -> bool:
        """Whether vLLM 0.32.0 runs this method with async scheduling (each decode step = a k-slot draft).

        True for draft_model, eagle, eagle3 and mtp; False for ngram and suffix
        (`vllm/config/vllm.py:1585-1610`). `disable_padded_drafter_batch: true` also turns async
        scheduling off (`vllm.py:1611-1619`).
        """
        if self.method not in ASYNC_SCHEDULED_METHODS:
            return False
        return not self.extra.get("disable_padded_drafter_batch", False)

    @property
    def synthetic_conditional_rates(self) -> tuple[float, ...] | None:
        """c_i = p_i / p_(i-1) (0 when p_(i-1) = 0), as `unconditional_to_conditional_rates` computes them."""
        rates = self.synthetic_acceptance_rates
        if self.rejection_sample_method != "synthetic" or rates is None:
            return None
        return tuple(p / q if q > 0.0 else 0.0 for p, q in zip(rates, (1.0, *rates[:-1]), strict=True))


def k_for_batch(cfg: SpecConfig, batch_size: int) -> int:
    """The k vLLM 0.32.0 schedules for a step with `batch_size` requests.

    Mirrors `build_dynamic_sd_schedule_lookup` (`vllm/v1/spec_decode/dynamic/utils.py:77-148`):
    a batch size inside a range gets its K; one in a gap or past the last range carries the
    previous range's K forward; every K is capped at `num_speculative_tokens`. Without a schedule
    (None or an empty list, which vLLM treats as static, `scheduler.py:309`) it is k.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    schedule = cfg.num_speculative_tokens_per_batch_size
    if not schedule:
        return cfg.num_speculative_tokens
    chosen = schedule[0][2]
    for range_start, _range_end, k in schedule:
        if range_start > batch_size:
            break
        chosen = k
    return min(cfg.num_speculative_tokens, chosen)


def parse_speculative_config(
    text: str,
    *,
    target_model: str | None = None,
    target_max_model_len: int | None = None,
    target_tensor_parallel_size: int | None = None,
) -> SpecConfig:
    """Parse the JSON text of `--speculative-config` into a validated `SpecConfig`.

    The `target_*` arguments are what vLLM takes from the other flags: the served model (the
    draft of an `mtp` config without `model`), `--max-model-len` and `--tensor-parallel-size`
    (limits on the draft's `max_model_len` and `draft_tensor_parallel_size`). None skips the check.
    """
    try:
        values = json.loads(text)
    except ValueError as e:
        raise SpecConfigError(
            f"Value {text} cannot be converted to a JSON object for --speculative-config: {e}",
            keys=("--speculative-config",),
        ) from e
    if not isinstance(values, dict):
        raise SpecConfigError(
            f"--speculative-config must be a JSON object of SpeculativeConfig fields, "
            f"got {type(values).__name__}: {text}",
            keys=("--speculative-config",),
        )
    return build_spec_config(
        values,
        target_model=target_model,
        target_max_model_len=target_max_model_len,
        target_tensor_parallel_size=target_tensor_parallel_size,
    )


# --------------------------------------------------------------------------------------------
# Field validation (pydantic lax mode, as the SpeculativeConfig annotations ask for)


class _Invalid(Exception):
    def __init__(self, loc: str, kind: str, msg: str, value: object) -> None:
        super().__init__(msg)
        self.loc, self.kind, self.msg, self.value = loc, kind, msg, value

    def render(self) -> str:
        return f"{self.loc}\n  {self.msg} [type={self.kind}, input_value={self.value!r}, " \
               f"input_type={type(self.value).__name__}]"


_Validator = Callable[[object, str], Any]


def _int(value: object, loc: str) -> int:
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _Invalid(loc, "finite_number", "Input should be a finite number", value)
        if value != int(value):
            raise _Invalid(loc, "int_from_float",
                           "Input should be a valid integer, got a number with a fractional part", value)
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number == int(number):
                return int(number)
            raise _Invalid(loc, "int_parsing",
                           "Input should be a valid integer, unable to parse string as an integer", value) from None
    raise _Invalid(loc, "int_type", "Input should be a valid integer", value)


def _float(value: object, loc: str) -> float:
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise _Invalid(loc, "float_parsing",
                           "Input should be a valid number, unable to parse string as a number", value) from None
    raise _Invalid(loc, "float_type", "Input should be a valid number", value)


_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _bool(value: object, loc: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        if value.strip().lower() in _TRUE:
            return True
        if value.strip().lower() in _FALSE:
            return False
        raise _Invalid(loc, "bool_parsing", "Input should be a valid boolean, unable to interpret input", value)
    raise _Invalid(loc, "bool_type", "Input should be a valid boolean", value)


def _str(value: object, loc: str) -> str:
    if isinstance(value, str):
        return value
    raise _Invalid(loc, "string_type", "Input should be a valid string", value)


def _literal(options: Sequence[str]) -> _Validator:
    quoted = [repr(o) for o in options]
    expected = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"

    def check(value: object, loc: str) -> str:
        if isinstance(value, str) and value in options:
            return value
        raise _Invalid(loc, "literal_error", f"Input should be {expected}", value)

    return check


def _bounded(inner: _Validator, *, gt: float | None = None, ge: float | None = None) -> _Validator:
    def check(value: object, loc: str) -> Any:
        number = inner(value, loc)
        if gt is not None and not number > gt:
            raise _Invalid(loc, "greater_than", f"Input should be greater than {gt}", value)
        if ge is not None and not number >= ge:
            raise _Invalid(loc, "greater_than_equal", f"Input should be greater than or equal to {ge}", value)
        return number

    return check


def _optional(inner: _Validator) -> _Validator:
    def check(value: object, loc: str) -> Any:
        return None if value is None else inner(value, loc)

    return check


def _list_of(inner: _Validator) -> _Validator:
    def check(value: object, loc: str) -> list[Any]:
        if not isinstance(value, list | tuple):
            raise _Invalid(loc, "list_type", "Input should be a valid list", value)
        return [inner(item, f"{loc}.{i}") for i, item in enumerate(value)]

    return check


def _int_triple(value: object, loc: str) -> tuple[int, int, int]:
    if not isinstance(value, list | tuple):
        raise _Invalid(loc, "tuple_type", "Input should be a valid tuple", value)
    if len(value) > 3:
        raise _Invalid(loc, "too_long", f"Tuple should have at most 3 items after validation, not {len(value)}", value)
    if len(value) < 3:
        raise _Invalid(f"{loc}.{len(value)}", "missing", "Field required", value)
    return _int(value[0], f"{loc}.0"), _int(value[1], f"{loc}.1"), _int(value[2], f"{loc}.2")


def _anything(value: object, loc: str) -> object:
    return value


def _dict_or_none(value: object, loc: str) -> object:
    if value is None or isinstance(value, dict):
        return value
    raise _Invalid(loc, "dataclass_type", "Input should be a dictionary or an instance of LoadConfig", value)


_opt_int_ge1 = _optional(_bounded(_int, ge=1))
_opt_bool = _optional(_bool)
_opt_str = _optional(_str)

# One validator per SpeculativeConfig field, from its annotation and `Field(...)` bounds.
_VALIDATORS: dict[str, _Validator] = {
    "enforce_eager": _opt_bool,
    "num_speculative_tokens": _bounded(_int, gt=0),  # `int = Field(default=None, gt=0)`: null is rejected
    "model": _opt_str,
    "method": _optional(_literal(SPECULATIVE_METHODS)),
    "draft_tensor_parallel_size": _opt_int_ge1,
    "tensor_parallel_size": _optional(_int),
    "quantization": _opt_str,
    "moe_backend": _opt_str,  # a MoEBackend name; not checked against the list
    "attention_backend": _opt_str,  # an AttentionBackendEnum name or "auto"; not checked
    "kv_cache_dtype": _optional(_literal(CACHE_DTYPES)),
    "max_model_len": _opt_int_ge1,
    "revision": _opt_str,
    "code_revision": _opt_str,
    "index_share_for_mtp_iteration": _opt_bool,
    "disable_padded_drafter_batch": _bool,
    "disable_eagle_block_drop": _bool,
    "use_local_argmax_reduction": _bool,
    "use_heterogeneous_vocab": _bool,
    "prompt_lookup_max": _opt_int_ge1,
    "prompt_lookup_min": _opt_int_ge1,
    "parallel_drafting": _bool,
    "target_model_config": _anything,  # SkipValidation; vLLM overwrites it
    "target_parallel_config": _anything,  # SkipValidation; vLLM overwrites it
    "num_speculative_tokens_per_batch_size": _optional(_list_of(_int_triple)),
    "draft_model_config": _anything,  # SkipValidation
    "draft_parallel_config": _anything,  # SkipValidation
    "suffix_decoding_max_tree_depth": _int,
    "suffix_decoding_max_cached_requests": _int,
    "suffix_decoding_max_spec_factor": _float,
    "suffix_decoding_min_token_prob": _float,
    "draft_load_config": _dict_or_none,
    "rejection_sample_method": _literal(REJECTION_SAMPLE_METHODS),
    "synthetic_acceptance_rates": _optional(_list_of(_float)),
    "synthetic_acceptance_length": _optional(_float),
    "enable_adaptive_verification": _bool,
    "draft_sample_method": _literal(DRAFT_SAMPLE_METHODS),
    "dspark_draft_topk": _opt_int_ge1,
}
assert tuple(_VALIDATORS) == SPECULATIVE_CONFIG_FIELDS


def _validation_error(lines: Sequence[str], keys: Sequence[str]) -> SpecConfigError:
    count = len(lines)
    head = f"{count} validation error{'s' if count != 1 else ''} for SpeculativeConfig"
    return SpecConfigError("\n".join([head, *lines]), keys=keys)


def _value_error(message: str, *keys: str) -> SpecConfigError:
    """A ValueError raised inside SpeculativeConfig, as pydantic wraps it."""
    return _validation_error([f"  Value error, {message} [type=value_error]"], keys)


def _not_simulated(method: str, how: str) -> SpecConfigError:
    return SpecConfigError(
        f"method={method!r} ({how}) is a valid speculative method in vLLM 0.32.0, but specwatch sim "
        f"does not model it; use one of {', '.join(SIMULATED_METHODS)}",
        keys=("method",),
    )


def _validate_fields(values: Mapping[str, object]) -> dict[str, Any]:
    errors: list[_Invalid] = []
    validated: dict[str, Any] = {}
    for name in SPECULATIVE_CONFIG_FIELDS:
        if name in values:
            try:
                validated[name] = _VALIDATORS[name](values[name], name)
            except _Invalid as e:
                errors.append(e)
    lines = [e.render() for e in errors]
    keys = [e.loc.split(".")[0] for e in errors]
    for name, value in values.items():
        if name not in _VALIDATORS:
            close = difflib.get_close_matches(name, SPECULATIVE_CONFIG_FIELDS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            lines.append(f"{name}\n  Unexpected keyword argument [type=unexpected_keyword_argument, "
                         f"input_value={value!r}, input_type={type(value).__name__}] "
                         f"(not a SpeculativeConfig field in vLLM 0.32.0{hint})")
            keys.append(name)
    if lines:
        raise _validation_error(lines, keys)
    return validated


def _is_custom_proposer_path(model: str | None) -> bool:
    """speculative.py:1110-1119: a dotted import path such as `pkg.MyProposer`."""
    if model is None or model.startswith(("http://", "https://", "file://")) or "/" in model:
        return False
    parts = model.split(".")
    return len(parts) >= 2 and all(part.isidentifier() for part in parts)


def _normalise_schedule(schedule: list[tuple[int, int, int]]) -> tuple[tuple[int, int, int], ...]:
    """`validate_and_normalize_dynamic_sd_schedule`, vllm/v1/spec_decode/dynamic/utils.py:7-74."""
    key = ("num_speculative_tokens_per_batch_size",)
    for range_start, range_end, k in schedule:
        if range_start <= 0 or range_end <= 0:
            raise SpecConfigError(f"Batch-size range ({range_start}, {range_end}) must be positive.", key)
        if range_start > range_end:
            raise SpecConfigError(
                f"Batch-size range start must be <= end for ({range_start}, {range_end}, {k}).", key)
        if k < 0:
            raise SpecConfigError("num_speculative_tokens_per_batch_size values must be >= 0.", key)
    ordered = sorted(schedule, key=lambda entry: entry[0])
    previous_end = 0
    for range_start, range_end, _ in ordered:
        if range_start <= previous_end:
            raise SpecConfigError("Batch-size ranges must be non-overlapping and sorted.", key)
        previous_end = range_end
    if ordered[0][0] != 1:
        raise SpecConfigError(
            "The first batch-size range must start at 1 so every runtime batch size has a defined schedule.", key)
    return tuple(ordered)


def _resolve_synthetic(n: int, rates: list[float] | None, length: float | None) -> tuple[float, ...]:
    """`_resolve_synthetic_acceptance_rates` and `_acceptance_length_to_rates`, speculative.py:555-598."""
    if (rates is None) == (length is None):
        raise _value_error("rejection_sample_method='synthetic' requires exactly one of "
                           "synthetic_acceptance_rates or synthetic_acceptance_length.",
                           "synthetic_acceptance_rates", "synthetic_acceptance_length")
    if rates is not None:
        key = "synthetic_acceptance_rates"
        if len(rates) != n:
            raise _value_error(f"synthetic_acceptance_rates must have length {n}, got {rates}.", key)
        if not all(0.0 <= r <= 1.0 for r in rates):
            raise _value_error(f"synthetic_acceptance_rates entries must be in [0, 1], got {rates}.", key)
        if any(rates[i] > rates[i - 1] for i in range(1, n)):
            raise _value_error(f"synthetic_acceptance_rates must be non-increasing, got {rates}.", key)
        return tuple(rates)
    assert length is not None
    if not 1.0 <= length <= float(n + 1):
        raise _value_error(f"synthetic_acceptance_length must be in [1, {n + 1}], got {length}.",
                           "synthetic_acceptance_length")
    num_drafts = length - 1
    num_full = int(num_drafts)
    return tuple(([1.0] * num_full + [num_drafts - num_full] + [0.0] * (n - num_full - 1))[:n])


def build_spec_config(
    values: Mapping[str, object],
    *,
    target_model: str | None = None,
    target_max_model_len: int | None = None,
    target_tensor_parallel_size: int | None = None,
) -> SpecConfig:
    """Validate an already-decoded `--speculative-config` object (see `parse_speculative_config`).

    Keys may use dashes: vLLM replaces "-" with "_" before validation (`arg_utils.py:2086-2088`).
    """
    normalised = {str(k).replace("-", "_"): v for k, v in values.items()}
    v = _validate_fields(normalised)
    warnings: list[str] = []

    # ---- __post_init__, speculative.py:1121-1594
    method: str | None = v.get("method")
    model: str | None = v.get("model")
    n: int | None = v.get("num_speculative_tokens")
    how = "as given"
    if method is None and _is_custom_proposer_path(model):
        method, how = "custom_class", "inferred from a dotted import path in model"
    elif method is None:
        if model in ("ngram", "[ngram]"):
            method, how = "ngram", "inferred from model"
        else:
            method, how = "draft_model", "the default"
    if method in MTP_MODEL_TYPES and method != "mtp":
        warnings.append(f"method `{method}` is deprecated and replaced with mtp.")
        method = "mtp"
    if method not in SIMULATED_METHODS:
        raise _not_simulated(method, how)

    if model is None and n is not None:
        if method == "mtp":
            model = target_model  # the draft layers live in the target checkpoint
        elif method == "ngram":
            model = "ngram"
        elif method == "suffix":
            model = "suffix"
        else:
            raise _value_error("num_speculative_tokens was provided but without speculative model.",
                               "num_speculative_tokens", "model")

    lookup_min: int | None = v.get("prompt_lookup_min")
    lookup_max: int | None = v.get("prompt_lookup_max")
    suffix = {name: v.get(name, default) for name, default in SUFFIX_DEFAULTS.items()}
    if method == "ngram":
        if lookup_min is None and lookup_max is None:
            lookup_min = lookup_max = 5
        elif lookup_min is None:
            lookup_min = lookup_max
        elif lookup_max is None:
            lookup_max = lookup_min
        assert lookup_min is not None and lookup_max is not None
        if lookup_min > lookup_max:
            raise _value_error(f"prompt_lookup_min={lookup_min} must be <= prompt_lookup_max={lookup_max}",
                               "prompt_lookup_min", "prompt_lookup_max")
    elif method == "suffix":
        lookup_min = lookup_max = None
        # _validate_suffix_decoding, speculative.py:1596-1630 (arctic-inference is not needed here)
        if n is None:
            n = int(suffix["suffix_decoding_max_tree_depth"])
            warnings.append(f"Defaulted num_speculative_tokens to {n} for suffix decoding.")
        checks = (
            ("suffix_decoding_max_tree_depth", suffix["suffix_decoding_max_tree_depth"] < 1, "must be >= 1"),
            ("suffix_decoding_max_cached_requests", suffix["suffix_decoding_max_cached_requests"] < 0, "must be >= 0"),
            ("suffix_decoding_max_spec_factor", suffix["suffix_decoding_max_spec_factor"] < 0, "must be >= 0"),
            ("suffix_decoding_min_token_prob", not 0 <= suffix["suffix_decoding_min_token_prob"] <= 1,
             "must be in [0, 1]"),
        )
        for name, failed, rule in checks:
            if failed:
                raise _value_error(f"{name}={suffix[name]} {rule}", name)
    else:
        lookup_min = lookup_max = None
        if model is not None:
            lowered = model.lower()
            if method not in ("eagle", "eagle3"):
                # speculative.py:1326-1355: detection by the draft's name. (vLLM also reads the
                # draft's config.json model_type: medusa, mlp_speculator, *_mtp; not possible here.)
                detected = method
                if "eagle-" in lowered:
                    detected = "eagle"
                elif "eagle3" in lowered:
                    detected = "eagle3"
                elif "dflash" in lowered:
                    raise _not_simulated("dflash", f"detected from model {model!r}")
                elif "dspark" in lowered:
                    raise _not_simulated("dspark", f"detected from model {model!r}")
                method = detected
            if n is None:
                raise _value_error("A speculative model was provided, but `num_speculative_tokens` was not "
                                   "provided (specwatch sim cannot read a default from the draft's n_predict)",
                                   "num_speculative_tokens")
            if v.get("dspark_draft_topk") is not None:
                raise _value_error("dspark_draft_topk is only supported by DSpark", "dspark_draft_topk")
            draft_tp = v.get("draft_tensor_parallel_size")
            if draft_tp is not None and target_tensor_parallel_size is not None \
                    and draft_tp not in (1, target_tensor_parallel_size):
                raise _value_error(f"speculative_draft_tensor_parallel_size={draft_tp} cannot be other value "
                                   "than 1 or target model tensor_parallel_size", "draft_tensor_parallel_size")
            draft_len = v.get("max_model_len")
            if draft_len is not None and target_max_model_len is not None and draft_len > target_max_model_len:
                raise _value_error(f"speculative_max_model_len={draft_len} cannot be larger than "
                                   f"target_max_model_len={target_max_model_len}", "max_model_len")

    if v.get("index_share_for_mtp_iteration") is not None and method != "mtp":
        raise _value_error("index_share_for_mtp_iteration is only supported with method='mtp'",
                           "index_share_for_mtp_iteration")
    if v.get("enable_adaptive_verification") and v.get("use_local_argmax_reduction"):
        raise _value_error("Adaptive verification estimates per-position acceptance from the draft logits, "
                           "which use_local_argmax_reduction never materializes. Disable one of them.",
                           "enable_adaptive_verification", "use_local_argmax_reduction")

    # ---- _verify_args, speculative.py:1811-1868
    if v.get("tensor_parallel_size") is not None:
        raise _value_error("'tensor_parallel_size' is not a valid argument in the speculative_config. "
                           "Please pass 'draft_tensor_parallel_size' instead.", "tensor_parallel_size")
    if n is None:
        raise _value_error("num_speculative_tokens must be provided with speculative model unless the draft "
                           "model config contains an n_predict parameter.", "num_speculative_tokens")
    rejection = v.get("rejection_sample_method", "standard")
    rates_in: list[float] | None = v.get("synthetic_acceptance_rates")
    length: float | None = v.get("synthetic_acceptance_length")
    rates: tuple[float, ...] | None = None
    if rejection == "synthetic":
        rates = _resolve_synthetic(n, rates_in, length)
    elif rates_in is not None or length is not None:
        raise _value_error("synthetic_acceptance_rates / synthetic_acceptance_length are only valid with "
                           "rejection_sample_method='synthetic'.",
                           "synthetic_acceptance_rates" if rates_in is not None else "synthetic_acceptance_length")
    draft_sample = v.get("draft_sample_method", "greedy")
    if v.get("use_heterogeneous_vocab") and method != "draft_model":
        raise _value_error("use_heterogeneous_vocab only works with method='draft_model'", "use_heterogeneous_vocab")
    if v.get("use_heterogeneous_vocab") and draft_sample != "greedy":
        raise _value_error("use_heterogeneous_vocab currently only supports greedy draft sampling. "
                           "Set draft_sample_method='greedy' (the default) or omit it.", "use_heterogeneous_vocab")

    # ---- the dynamic-SD schedule: validated when the scheduler starts (scheduler.py:307-314)
    schedule_in: list[tuple[int, int, int]] | None = v.get("num_speculative_tokens_per_batch_size")
    schedule = _normalise_schedule(schedule_in) if schedule_in else (None if schedule_in is None else ())

    return SpecConfig(
        method=cast(SimMethod, method),
        num_speculative_tokens=n,
        model=model,
        prompt_lookup_min=lookup_min,
        prompt_lookup_max=lookup_max,
        suffix_decoding_max_tree_depth=int(suffix["suffix_decoding_max_tree_depth"]),
        suffix_decoding_max_cached_requests=int(suffix["suffix_decoding_max_cached_requests"]),
        suffix_decoding_max_spec_factor=float(suffix["suffix_decoding_max_spec_factor"]),
        suffix_decoding_min_token_prob=float(suffix["suffix_decoding_min_token_prob"]),
        rejection_sample_method=rejection,
        synthetic_acceptance_rates=rates,
        synthetic_acceptance_length=length,
        num_speculative_tokens_per_batch_size=schedule,
        draft_sample_method=draft_sample,
        extra={k: val for k, val in v.items() if k not in _OWN_FIELDS},
        warnings=tuple(warnings),
    )
