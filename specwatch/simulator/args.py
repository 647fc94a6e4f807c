"""The `specwatch sim` command line: the `vllm serve` 0.32.0 argv a speculative-decoding study uses, plus `--sim-*`.

`parse_sim_args(argv)` takes the words after `vllm serve` (or `specwatch sim`). Errors:

- `SystemExit(2)` with argparse's usage message on stderr: unknown flags, a missing or
  badly typed value, a value outside a flag's choices, `--speculative-config` text that is
  not JSON (vLLM decodes it in the argparse type function, `arg_utils.py:1826`), and bad
  `--sim-*` values. vLLM 0.32.0 fails the same way for its own flags.
- `SpecConfigError` (a `ValueError`): `--speculative-config` (plus `--spec-*`) rejected as
  vLLM's `SpeculativeConfig` / `create_speculative_config` would reject it.
- `ValueError`: the other start-up refusals vLLM raises after parsing (with vLLM's messages),
  e.g. `--per-request-spec-decode-metrics` without a speculative config.

Differences from `vllm serve`, on purpose: `--host` defaults to 127.0.0.1 (vLLM binds every
interface); abbreviated flags are refused (`allow_abbrev=False`; vLLM's parser allows them);
`--disable-log-requests`, which 0.32.0 no longer has, is accepted and ignored like the other
GPU-only flags; the dotted JSON form (`--speculative-config.method ngram`) is supported only
for `--speculative-config` / `-sc`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from specwatch.simulator.spec_config import (
    CACHE_DTYPES,
    SPECULATIVE_METHODS,
    SpecConfig,
    SpecConfigError,
    build_spec_config,
)

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"  # ModelConfig.model, vllm/config/model.py:154
DEFAULT_HOST = "127.0.0.1"  # vLLM: None = all interfaces (cli_args.py:283)
ALL_INTERFACES = "0.0.0.0"
MODEL_DTYPES: tuple[str, ...] = ("auto", "half", "float16", "bfloat16", "float", "float32")  # model.py:99
PER_REQUEST_SPEC_DECODE_METRICS: tuple[str, ...] = ("none", "summary", "detailed")  # observability.py:50

# `get_batch_defaults`, arg_utils.py:2893-2985, for the OpenAI API server usage context:
# max_num_seqs 1024 and max_num_batched_tokens 8192 on >= 70 GiB GPUs other than A100
# (16384 tokens from 160 GiB up), 256 and 2048 on everything else.
_GPU_MEMORY_GIB: dict[str, float] = {
    "h100": 79.6, "h200": 140.4, "gh200": 94.5, "h20": 94.5, "b200": 178.4, "b300": 268.0,
    "a100": 79.2, "a100-40gb": 39.4, "l40s": 44.4, "l4": 22.0, "a10g": 22.0,
}


def default_batch_limits(gpu: str) -> tuple[int, int]:
    """vLLM 0.32.0's default (max_num_seqs, max_num_batched_tokens) for `vllm serve` on this GPU."""
    memory = _GPU_MEMORY_GIB.get(gpu.lower(), 0.0)
    if memory >= 160:
        return 1024, 16384
    if memory >= 70 and "a100" not in gpu.lower():
        return 1024, 8192
    return 256, 2048


@dataclass(frozen=True)
class SimKnobs:
    """The simulator-only `--sim-*` settings."""

    time_scale: float = 1.0  # multiplies every modelled duration; 0.01 makes tests fast
    # Conditional per-position acceptance probabilities for the modelled drafters (draft_model,
    # eagle, eagle3, mtp); None = the method's built-in profile. Not used by ngram or suffix.
    draft_acceptance: tuple[float, ...] | None = None
    gpu: str = "h200"
    kv_blocks: int | None = None  # KV capacity in blocks; None = derived from gpu_memory_utilization
    seed: int = 0


@dataclass(frozen=True)
class SimArgs:
    """Everything `specwatch sim` was started with."""

    model: str
    served_model_names: tuple[str, ...]
    host: str = DEFAULT_HOST
    port: int = 8000
    speculative: SpecConfig | None = None
    per_request_spec_decode_metrics: Literal["none", "summary", "detailed"] = "none"
    enable_force_include_usage: bool = False
    enable_per_request_metrics: bool = False
    disable_log_stats: bool = False
    max_num_seqs: int = 1024  # resolved as vLLM does when the flag is absent (see default_batch_limits)
    max_model_len: int | None = None  # None = the model's own length (`-1`/`auto` too)
    seed: int = 0  # vLLM 0.32.0's default (ModelConfig.seed = 0)
    gpu_memory_utilization: float = 0.92
    num_gpu_blocks_override: int | None = None
    block_size: int = 16  # CacheConfig.DEFAULT_BLOCK_SIZE
    # GPU-only flags that were given: accepted, logged, no effect. (flag, value as text)
    ignored: tuple[tuple[str, str], ...] = ()
    sim: SimKnobs = field(default_factory=SimKnobs)


def _dest(flag: str) -> str:
    return "ignored_" + flag.lstrip("-").replace("-", "_")


def _human_readable_int(value: str) -> int:
    """`human_readable_int`, vllm/utils/argparse_utils.py:29-73: 1k = 1000, 1K = 1024, 25.6k = 25600."""
    text = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", text)
    if match:
        number, suffix = match.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        if "." in number:
            raise argparse.ArgumentTypeError(
                f"Decimals are not allowed with binary suffixes like {suffix}. "
                f"Did you mean to use {number}{suffix.lower()} instead?")
        return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None


def _max_model_len(value: str) -> int | None:
    """`human_readable_int_or_auto`: -1 or "auto" (None here) means the model's own length."""
    if value.strip() == "-1" or value.strip().lower() == "auto":
        return None
    number = _human_readable_int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, -1 or 'auto', got {value!r}")
    return number


def _optional(inner: Callable[[str], Any]) -> Callable[[str], Any]:
    """vLLM's `optional_type`: "" and "None" mean None."""

    def parse(value: str) -> Any:
        return None if value in ("", "None") else inner(value)

    return parse


def _json(value: str) -> Any:
    """vLLM's `optional_type(json.loads)` for `--speculative-config` (arg_utils.py:171-176, 1826)."""
    if value in ("", "None"):
        return None
    try:
        return json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Value {value} cannot be converted to {json.loads}.") from None


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {value!r}")
    return number


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value!r}")
    return number


def _probabilities(value: str) -> tuple[float, ...]:
    parts = [p.strip() for p in value.split(",")]
    try:
        numbers = tuple(float(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated probabilities such as 0.8,0.6,0.5, got {value!r}") from None
    if not all(0.0 <= p <= 1.0 for p in numbers):
        raise argparse.ArgumentTypeError(f"every probability must be in [0, 1], got {value!r}")
    return numbers


def _gpu_name(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return value.strip().lower()


# (canonical flag, aliases, argparse kwargs) of the GPU-only flags that are accepted and only logged,
# typed as vLLM 0.32.0 types them (so a bad --dtype still fails like vLLM's parser).
_IGNORED_FLAGS: tuple[tuple[str, tuple[str, ...], dict[str, Any]], ...] = (
    ("--dtype", (), {"choices": MODEL_DTYPES}),
    ("--tensor-parallel-size", ("-tp",), {"type": int}),
    ("--kv-cache-dtype", (), {"choices": CACHE_DTYPES}),
    ("--max-num-batched-tokens", (), {"type": _human_readable_int}),
    ("--enable-prefix-caching", (), {"action": argparse.BooleanOptionalAction}),
    ("--generation-config", (), {"type": str}),
    ("--enforce-eager", (), {"action": argparse.BooleanOptionalAction}),
    ("--trust-remote-code", (), {"action": argparse.BooleanOptionalAction}),
    ("--enable-log-requests", (), {"action": argparse.BooleanOptionalAction}),
    ("--disable-log-requests", (), {"action": "store_true"}),  # gone from 0.32.0; accepted anyway
)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (after `_preprocess_argv`); `parse_sim_args` adds vLLM's post-parse checks."""
    p = argparse.ArgumentParser(prog="specwatch sim", allow_abbrev=False,
                                description="Simulated `vllm serve` 0.32.0 for speculative-decoding studies.")
    p.add_argument("model_tag", nargs="?", default=None, help="the model to serve (as `vllm serve MODEL`)")
    p.add_argument("--model", dest="model_option", default=None, help=argparse.SUPPRESS)
    p.add_argument("--served-model-name", nargs="+", type=_optional(str), default=None)
    p.add_argument("--host", type=_optional(str), default=DEFAULT_HOST,
                   help="default 127.0.0.1 (vLLM's default is every interface); '' or None = every interface")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--speculative-config", "-sc", type=_json, default=None)
    p.add_argument("--spec-method", type=_optional(str), choices=[*sorted(SPECULATIVE_METHODS), None], default=None)
    p.add_argument("--spec-model", type=_optional(str), default=None)
    p.add_argument("--spec-tokens", type=int, default=None)
    p.add_argument("--per-request-spec-decode-metrics", choices=sorted(PER_REQUEST_SPEC_DECODE_METRICS),
                   default="none")
    p.add_argument("--enable-force-include-usage", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--enable-per-request-metrics", action=argparse.BooleanOptionalAction, default=False)
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=_max_model_len, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gpu-memory-utilization", "--device-memory-utilization", dest="gpu_memory_utilization",
                   type=float, default=0.92)
    p.add_argument("--num-gpu-blocks-override", type=_optional(int), default=None)
    p.add_argument("--block-size", type=_optional(int), default=None)

    gpu_only = p.add_argument_group("accepted for compatibility with `vllm serve`, logged, no effect")
    for flag, aliases, kwargs in _IGNORED_FLAGS:
        options = dict(kwargs)
        if "type" in options:
            options["metavar"] = flag.lstrip("-").upper().replace("-", "_")
        gpu_only.add_argument(flag, *aliases, dest=_dest(flag), default=None, **options)

    sim = p.add_argument_group("simulator")
    sim.add_argument("--sim-time-scale", type=_positive_float, default=1.0,
                     help="multiplies every modelled duration (0.01 makes tests fast)")
    sim.add_argument("--sim-draft-acceptance", type=_probabilities, default=None,
                     help="comma-separated conditional per-position acceptance probabilities for "
                          "draft_model/eagle/eagle3/mtp (default: the method's built-in profile)")
    sim.add_argument("--sim-gpu", type=_gpu_name, default="h200")
    sim.add_argument("--sim-kv-blocks", type=_positive_int, default=None,
                     help="KV capacity in blocks (default: derived from --gpu-memory-utilization)")
    sim.add_argument("--sim-seed", type=int, default=0)
    return p


_JSON_OPTIONS = ("--speculative-config", "-sc")


def _preprocess_argv(argv: Sequence[str]) -> list[str]:
    """What vLLM's `FlexibleArgumentParser.parse_args` does before argparse (argparse_utils.py:276-462).

    `--model X` moves to the front; `--served-model-name` without a positional model is refused;
    underscores in flag names become dashes; `--speculative-config.key value` pieces are merged
    into one JSON object appended at the end (so they replace an earlier whole JSON).
    """
    args = list(argv)
    model_idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
    if model_idx is not None:
        if args[model_idx] == "--model":
            if model_idx + 1 >= len(args):
                return args  # argparse reports the missing value
            tag, rest = args[model_idx + 1], model_idx + 2
        else:
            tag, rest = args[model_idx].removeprefix("--model="), model_idx + 1
        args = [tag, *args[:model_idx], *args[rest:]]
    if args and args[0].startswith("-") and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args):
        raise ValueError("`model` should be provided as the first positional argument when using `vllm serve`. "
                         "i.e. `vllm serve <model> --<arg> <value>`.")

    processed: list[str] = []
    for arg in args:
        if arg.startswith("--"):
            key, eq, given = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            processed.append("--" + head.replace("_", "-") + dot + tail + eq + given)
        else:
            processed.append(arg)

    merged: dict[str, dict[str, Any]] = {}
    out: list[str] = []
    i = 0
    while i < len(processed):
        arg = processed[i]
        name = arg.partition("=")[0]
        option, dot, path = name.partition(".")
        if dot and option in _JSON_OPTIONS:
            if "=" in arg:
                value_text = arg.partition("=")[2]
                i += 1
            elif i + 1 < len(processed):
                value_text = processed[i + 1]
                i += 2
            else:
                out.append(arg)
                i += 1
                continue
            if path.endswith("+"):
                path = path[:-1]
                value_text = json.dumps(value_text.split(","))
            value: Any
            try:
                value = json.loads(value_text)
            except ValueError:
                try:
                    value = _human_readable_int(value_text)
                except argparse.ArgumentTypeError:
                    value = value_text
            target = merged.setdefault("--speculative-config", {})
            *parents, leaf = path.split(".")
            for parent in parents:
                target = target.setdefault(parent, {})
            if isinstance(value, list) and isinstance(target.get(leaf), list):
                target[leaf] = target[leaf] + value
            else:
                target[leaf] = value
            continue
        out.append(arg)
        i += 1
    for option, obj in merged.items():
        out += [option, json.dumps(obj)]
    return out


def _pydantic_range_error(config: str, name: str, value: float, bound: str, kind: str) -> ValueError:
    return ValueError(f"1 validation error for {config}\n{name}\n  Input should be {bound} "
                      f"[type={kind}, input_value={value!r}, input_type={type(value).__name__}]")


def _speculative(ns: argparse.Namespace, target_model: str, target_tp: int) -> SpecConfig | None:
    """`EngineArgs.create_speculative_config`, arg_utils.py:2060-2099."""
    config: Any = ns.speculative_config
    for flag, key, value in (
        ("--spec-method", "method", ns.spec_method),
        ("--spec-model", "model", ns.spec_model),
        ("--spec-tokens", "num_speculative_tokens", ns.spec_tokens),
    ):
        if value is None:
            continue
        if config is None:
            config = {}
        if isinstance(config, dict) and key in config:
            raise SpecConfigError(f"{flag} and --speculative-config['{key}'] are mutually exclusive",
                                  keys=(flag, key))
        if isinstance(config, dict):
            config[key] = value
    if config is None:
        return None
    if not isinstance(config, dict):
        raise SpecConfigError(f"--speculative-config must be a JSON object of SpeculativeConfig fields, "
                              f"got {type(config).__name__}", keys=("--speculative-config",))
    return build_spec_config(config, target_model=target_model, target_max_model_len=ns.max_model_len,
                             target_tensor_parallel_size=target_tp)


def parse_sim_args(argv: Sequence[str]) -> SimArgs:
    """Parse `specwatch sim` / `vllm serve` arguments (without the program or subcommand name).

    Checks run in vLLM 0.32.0's order: argparse (`SystemExit(2)`), `validate_parsed_serve_args`,
    the engine configs (`--gpu-memory-utilization`, `--speculative-config`, `--max-num-seqs`),
    then `VllmConfig.__post_init__` (`--per-request-spec-decode-metrics`).
    """
    ns = build_parser().parse_args(_preprocess_argv(argv))

    # validate_parsed_serve_args, vllm/entrypoints/launchers/cli_args.py:535-541
    if ns.enable_per_request_metrics and ns.disable_log_stats:
        raise ValueError("Error: --enable-per-request-metrics requires engine statistics logging; "
                         "remove --disable-log-stats to enable per-request metrics.")

    model = ns.model_tag or ns.model_option or DEFAULT_MODEL  # serve.py:56-57: the positional wins
    names = tuple(n for n in (ns.served_model_name or ()) if n) or (model,)

    # CacheConfig / ParallelConfig / SchedulerConfig field bounds (pydantic)
    gmu = ns.gpu_memory_utilization
    if not gmu > 0:
        raise _pydantic_range_error("CacheConfig", "gpu_memory_utilization", gmu, "greater than 0", "greater_than")
    if not gmu <= 1:
        raise _pydantic_range_error("CacheConfig", "gpu_memory_utilization", gmu, "less than or equal to 1",
                                    "less_than_equal")
    block_size = ns.block_size if ns.block_size is not None else 16
    if block_size <= 0:
        raise _pydantic_range_error("CacheConfig", "block_size", block_size, "greater than 0", "greater_than")
    tp = getattr(ns, _dest("--tensor-parallel-size"))
    if tp is not None and tp < 1:
        raise _pydantic_range_error("ParallelConfig", "tensor_parallel_size", tp, "greater than or equal to 1",
                                    "greater_than_equal")

    speculative = _speculative(ns, model, tp if tp is not None else 1)

    batched_tokens = getattr(ns, _dest("--max-num-batched-tokens"))
    if ns.max_num_seqs is not None:
        if ns.max_num_seqs < 1:
            raise _pydantic_range_error("SchedulerConfig", "max_num_seqs", ns.max_num_seqs,
                                        "greater than or equal to 1", "greater_than_equal")
        max_num_seqs = ns.max_num_seqs
    else:
        # _set_default_max_num_seqs_and_batched_tokens_args, arg_utils.py:3097-3186
        default_seqs, default_tokens = default_batch_limits(ns.sim_gpu)
        max_num_seqs = min(default_seqs, batched_tokens if batched_tokens is not None else default_tokens)

    # VllmConfig.__post_init__, vllm/config/vllm.py:1659-1666
    if ns.per_request_spec_decode_metrics != "none" and speculative is None:
        raise ValueError("--per-request-spec-decode-metrics requires speculative decoding "
                         "to be enabled (via --speculative-config).")

    ignored: list[tuple[str, str]] = []
    for flag, _aliases, _kwargs in _IGNORED_FLAGS:
        value = getattr(ns, _dest(flag))
        if value is not None:
            ignored.append((flag, str(value)))

    return SimArgs(
        model=model,
        served_model_names=names,
        host=ns.host if ns.host is not None else ALL_INTERFACES,
        port=ns.port,
        speculative=speculative,
        per_request_spec_decode_metrics=cast(Literal["none", "summary", "detailed"],
                                             ns.per_request_spec_decode_metrics),
        enable_force_include_usage=ns.enable_force_include_usage,
        enable_per_request_metrics=ns.enable_per_request_metrics,
        disable_log_stats=ns.disable_log_stats,
        max_num_seqs=max_num_seqs,
        max_model_len=ns.max_model_len,
        seed=ns.seed,
        gpu_memory_utilization=gmu,
        num_gpu_blocks_override=ns.num_gpu_blocks_override,
        block_size=block_size,
        ignored=tuple(ignored),
        sim=SimKnobs(
            time_scale=ns.sim_time_scale,
            draft_acceptance=ns.sim_draft_acceptance,
            gpu=ns.sim_gpu,
            kv_blocks=ns.sim_kv_blocks,
            seed=ns.sim_seed,
        ),
    )
