"""The experiment plan: YAML in, a validated frozen `StudyPlan` out; every error names the key and what was expected.

Parsed once, by `parse_plan(text, base_dir, home)`. `{models}` and `{home}` in model names
(and in a speculative config's `model`) expand to the specwatch home's folders, so a plan can
name the SmolLM2 target built by `specwatch models build`. Relative task paths are relative
to the plan file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import yaml

from specwatch.backends import KINDS, BackendSpec, Kind
from specwatch.backends.base import BackendError
from specwatch.backends.docker import DockerSettings
from specwatch.backends.process import DEFAULT_COMMAND
from specwatch.backends.url import server_url
from specwatch.config import Home
from specwatch.experiment.disturbance import DEFAULT_LIMIT_CORES
from specwatch.vllm_cpu.server import DEFAULT_MAX_NUM_SEQS, SERVED_MODEL_NAME
from specwatch.workloads import TASKS

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
LANGS = ("en", "zh")
Design = Literal["interleaved", "bracketed", "sequential"]
DESIGNS: tuple[Design, ...] = ("interleaved", "bracketed", "sequential")
# Backends whose servers can all be up at once beside each other on this host: processes that need no GPU.
# A GPU server (`process`, `docker`) takes the whole device, so a plan on one runs its variants in turn. Servers
# already running (`url`) are up beside each other by definition, and cannot be restarted for a bracketed block.
SIDE_BY_SIDE = ("sim", "vllm_cpu", "url")
DEFAULT_ROUNDS = 4


class PlanError(ValueError):
    """The plan is not valid; the message names the key (`variants.ngram.speculative_config`) and what was expected."""


@dataclass(frozen=True)
class ServerFlags:
    """What every variant's `vllm serve` gets beyond `serve_argv`'s common flags."""

    dtype: str | None = None  # None: serve_argv's choice (the CPU's fastest); set bfloat16 on a GPU
    enforce_eager: bool = True  # a CPU start-up shortcut; false on a GPU
    args: tuple[str, ...] = ()
    startup_timeout: float = 600.0


@dataclass(frozen=True)
class Task:
    name: str
    path: Path | None  # a user JSONL file, or None for the article's built-in set
    article: str | None = None  # "code" or "chat"


@dataclass(frozen=True)
class AcceptancePass:
    rows: int = 8
    max_tokens: int = 256
    concurrency: int = 4


@dataclass(frozen=True)
class PerformancePass:
    concurrencies: tuple[int, ...] = (1, 8)
    requests: int = 64
    warmup: int = 4
    max_tokens: int = 128
    ignore_eos: bool = True
    max_seconds: int = 3600
    by_concurrency: Mapping[int, int] | None = None  # requests per task at each concurrency, when they differ

    def requests_at(self, concurrency: int) -> int:
        """Requests per task at `concurrency`: a high one needs more to keep its batch full for a while."""
        return (self.by_concurrency or {}).get(concurrency, self.requests)

    def block_requests(self, concurrency: int, rounds: int, round_: int) -> int:
        """Requests per task in round `round_` (1-based) of `rounds`: the pass's share, the first rounds taking
        one more where they do not divide evenly."""
        whole, extra = divmod(self.requests_at(concurrency), rounds)
        return whole + (1 if round_ <= extra else 0)


@dataclass(frozen=True)
class Variant:
    name: str
    model: str
    speculative_config: Mapping[str, Any] | None
    backend: BackendSpec
    args: tuple[str, ...] = ()
    baseline: str | None = None  # the variant it is compared with (None: it is a baseline, or has none)


@dataclass(frozen=True)
class SweepPlan:
    """A tuning sweep: one method at every draft length in `ks` (0 = the baseline) at every performance concurrency.

    Expanded into variants `k0`, `k1`, ... (`sweep_variant_name`); with `proof`, `specwatch tune` then measures
    its recommended dynamic config as the variant `dynamic`, a second run into the sweep's folder.
    """

    method: Mapping[str, Any]  # the speculative config without num_speculative_tokens
    ks: tuple[int, ...]
    proof: bool = True
    max_tpot_ms: float | None = None  # the TPOT objective tune applies (None: none)

    @property
    def label(self) -> str:
        return str(self.method["method"])


def sweep_variant_name(k: int) -> str:
    return f"k{k}"


DYNAMIC = "dynamic"  # the variant that measures the recommended per-batch-size config
# Every sweep server times each request itself (engine clock): the step cost must not depend on how
# promptly a busy client reads its streams.
SWEEP_ARGS = ("--enable-per-request-metrics",)


def batch_size(args: Sequence[str], concurrencies: Sequence[int]) -> int | None:
    """The `--max-num-seqs` a variant's server gets: room for the plan's largest concurrency in one batch (a cell
    above the batch would measure queueing), at least serve_argv's 16; None where the plan's or the variant's
    own flags set it (theirs win)."""
    if any(a == "--max-num-seqs" or a.startswith("--max-num-seqs=") for a in args):
        return None
    return max((DEFAULT_MAX_NUM_SEQS, *concurrencies))  # a plan without a performance pass: none


@dataclass(frozen=True)
class StudyPlan:
    name: str
    model: str
    served_model_name: str
    server: ServerFlags
    lang: str
    tasks: tuple[Task, ...]
    warmup_requests: int
    acceptance: AcceptancePass
    performance: PerformancePass | None
    variants: tuple[Variant, ...]
    text: str  # the plan file as given (saved as results/<run-id>/plan.yaml)
    sweep: SweepPlan | None = None
    # interleaved: every variant's server up at once, the performance pass in `rounds` rounds of one block per
    # variant, the order rotated from round to round; bracketed: the same rounds with one server up at a time,
    # restarted for each block, the order reversed every other round; sequential: each variant in turn, one block
    design: Design = "sequential"
    rounds: int = 1
    # Recovery from a noisy machine (`specwatch.experiment.disturbance`): a block during which processes outside
    # the study (or the hypervisor's steal) took more than `disturbed_above_cores` is disturbed; its round is
    # measured again at the end, up to `max_extra_rounds` extra rounds per concurrency (in a sequential design
    # the block again, at once, as many times per variant and concurrency); 0 turns re-measuring off.
    max_extra_rounds: int = 1
    disturbed_above_cores: float = DEFAULT_LIMIT_CORES

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)


def load_plan(path: Path, home: Home) -> StudyPlan:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan: {exc.strerror}") from None
    return parse_plan(text, path.resolve().parent, home)


# -- small typed readers: each names the key it read --------------------------------------------

def _mapping(value: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise PlanError(f"{key}: expected a mapping with keys {', '.join(allowed)}, got {_kind(value)}")
    unknown = [k for k in value if k not in allowed]
    if unknown:
        raise PlanError(f"{key}.{unknown[0]}: unknown key; expected one of {', '.join(allowed)}")
    return value


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"[:80]


def _int(m: dict[str, Any], key: str, where: str, default: int, minimum: int = 1) -> int:
    value = m.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise PlanError(f"{where}.{key}: expected an integer >= {minimum}, got {_kind(value)}")
    return value


def _cores(m: dict[str, Any], key: str, default: float) -> float:
    value = m.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise PlanError(f"{key}: expected a positive number of cores (CPU seconds per second), got {_kind(value)}")
    return float(value)


def _bool(m: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = m.get(key, default)
    if not isinstance(value, bool):
        raise PlanError(f"{where}.{key}: expected true or false, got {_kind(value)}")
    return value


def _str(m: dict[str, Any], key: str, where: str, default: str | None) -> str:
    value = m.get(key, default)
    if not isinstance(value, str) or not value:
        raise PlanError(f"{where}.{key}: expected a non-empty string, got {_kind(value)}")
    return value


def _strings(m: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = m.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) and not isinstance(v, bool)
                                              for v in value):
        raise PlanError(f"{where}.{key}: expected a list of strings (command-line words), got {_kind(value)}")
    return tuple(str(v) for v in value)


def _expand(text: str, home: Home) -> str:
    return text.replace("{models}", str(home.models)).replace("{home}", str(home.root))


# -- sections -------------------------------------------------------------------------------------

def _backend(value: Any, where: str, home: Home) -> BackendSpec:
    if isinstance(value, str):
        value = {"kind": value}
    m = _mapping(value, where, ("kind", "args", "command", "kv_cache_gib", "image", "base_url", "gpus",
                                "hf_cache", "shm_size", "stop_timeout", "url"))
    kind = m.get("kind", "sim")
    if kind not in KINDS:
        raise PlanError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {_kind(kind)}")
    url = m.get("url")
    if (kind == "url") != (url is not None):
        raise PlanError(f"{where}.url: the running server's address, given with `kind: url` and only with it")
    if url is not None:
        try:
            url = server_url(str(url))
        except BackendError as exc:
            raise PlanError(f"{where}.url: {exc}") from None
    gpus = m.get("gpus", "all")
    if isinstance(gpus, list) and all(isinstance(g, int | str) for g in gpus) and gpus:
        gpus = tuple(str(g) for g in gpus)
    elif gpus != "all":
        raise PlanError(f"{where}.gpus: expected \"all\" or a list of device ids, got {_kind(gpus)}")
    hf_cache = m.get("hf_cache")
    if hf_cache is not None and not isinstance(hf_cache, str):
        raise PlanError(f"{where}.hf_cache: expected a host folder path, got {_kind(hf_cache)}")
    base_url = m.get("base_url")
    if base_url is not None and not isinstance(base_url, str):
        raise PlanError(f"{where}.base_url: expected a Docker engine URL such as unix:///var/run/docker.sock")
    shm = m.get("shm_size")
    if shm is not None and not isinstance(shm, str):
        raise PlanError(f"{where}.shm_size: expected a size such as \"16g\", got {_kind(shm)}")
    command = _strings(m, "command", where) if "command" in m else DEFAULT_COMMAND
    if not command:
        raise PlanError(f"{where}.command: expected at least the program to run, e.g. [vllm, serve]")
    docker = DockerSettings(
        image=_str(m, "image", where, DockerSettings.image), base_url=base_url, gpus=gpus,
        hf_cache=Path(_expand(hf_cache, home)).expanduser() if hf_cache else None, shm_size=shm,
        stop_timeout=_int(m, "stop_timeout", where, DockerSettings.stop_timeout))
    return BackendSpec(cast(Kind, kind), _strings(m, "args", where), command,
                       _int(m, "kv_cache_gib", where, 1), docker, url)


def _server(value: Any) -> ServerFlags:
    m = _mapping(value, "server", ("dtype", "enforce_eager", "args", "startup_timeout"))
    dtype = m.get("dtype")
    if dtype is not None and not isinstance(dtype, str):
        raise PlanError(f"server.dtype: expected a vLLM dtype such as bfloat16, got {_kind(dtype)}")
    return ServerFlags(dtype, _bool(m, "enforce_eager", "server", True), _strings(m, "args", "server"),
                       float(_int(m, "startup_timeout", "server", 600)))


def _tasks(value: Any, base_dir: Path, inputs: Path | None = None) -> tuple[Task, ...]:
    if not isinstance(value, dict) or not value:
        raise PlanError("tasks: expected a mapping of task name to a JSONL path or `article`, "
                        f"e.g. {{code: article, chat: data/chat.jsonl}}, got {_kind(value)}")
    tasks = []
    for name, source in value.items():
        where = f"tasks.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            raise PlanError(f"{where}: a task name is letters, digits, `_`, `-`, `.`")
        if not isinstance(source, str) or not source:
            raise PlanError(f"{where}: expected a JSONL path or `article` / `article:code`, got {_kind(source)}")
        if inputs is not None:  # a run's own copy, whatever the source was
            source = str(inputs / f"{name}.jsonl")
        elif source == "article" or source.startswith("article:"):
            article = source.partition(":")[2] or name
            if article not in TASKS:
                raise PlanError(f"{where}: the article's built-in sets are {', '.join(TASKS)}; "
                                f"write `article:code` or `article:chat` for a task named {name!r}")
            tasks.append(Task(name, None, article))
            continue
        path = (base_dir / source).resolve()
        if not path.is_file():
            raise PlanError(f"{where}: no JSONL file at {path}")
        tasks.append(Task(name, path))
    return tuple(tasks)


def _acceptance(value: Any) -> AcceptancePass:
    m = _mapping(value, "acceptance", ("rows", "max_tokens", "concurrency"))
    d = AcceptancePass()
    return AcceptancePass(_int(m, "rows", "acceptance", d.rows), _int(m, "max_tokens", "acceptance", d.max_tokens),
                          _int(m, "concurrency", "acceptance", d.concurrency))


def _performance(value: Any) -> PerformancePass | None:
    if value is False:
        return None
    m = _mapping(value, "performance", ("concurrencies", "requests", "warmup", "max_tokens", "ignore_eos",
                                        "max_seconds"))
    d = PerformancePass()
    conc = m.get("concurrencies", list(d.concurrencies))
    if not isinstance(conc, list) or not conc or not all(
            isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in conc) or len(set(conc)) != len(conc):
        raise PlanError(f"performance.concurrencies: expected a list of distinct integers >= 1 such as [1, 8], "
                        f"got {_kind(conc)}")
    requests = m.get("requests", d.requests)
    by_concurrency: dict[int, int] | None = None
    if isinstance(requests, dict):
        if set(requests) != set(conc) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                 for n in requests.values()):
            raise PlanError(f"performance.requests: expected requests per task (an integer >= 1), or a mapping of "
                            f"every concurrency {conc} to one, got {_kind(requests)}")
        by_concurrency = {int(c): int(n) for c, n in requests.items()}
        requests = max(by_concurrency.values())
    return PerformancePass(tuple(conc), _int({"requests": requests}, "requests", "performance", d.requests),
                           _int(m, "warmup", "performance", d.warmup, minimum=0),
                           _int(m, "max_tokens", "performance", d.max_tokens),
                           _bool(m, "ignore_eos", "performance", d.ignore_eos),
                           _int(m, "max_seconds", "performance", d.max_seconds), by_concurrency)


def _spec_config(value: Any, where: str, home: Home) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise PlanError(f"{where}: expected a mapping such as {{method: ngram, num_speculative_tokens: 4}} "
                        f"or nothing (no speculation), got {_kind(value)}")
    method = value.get("method")
    if not isinstance(method, str) or not method:
        raise PlanError(f"{where}.method: expected a method name (ngram, suffix, draft_model, eagle3, mtp, ...), "
                        f"got {_kind(method)}")
    k = value.get("num_speculative_tokens")
    if k is not None and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise PlanError(f"{where}.num_speculative_tokens: expected an integer >= 1, got {_kind(k)}")
    if isinstance(value.get("model"), str):
        value = {**value, "model": _expand(value["model"], home)}
    return dict(value)


def _variants(value: Any, plan_model: str, default_backend: BackendSpec, home: Home) -> tuple[Variant, ...]:
    if not isinstance(value, dict) or not value:
        raise PlanError("variants: expected a mapping of variant name to its settings, e.g. "
                        "{baseline: {}, ngram: {speculative_config: {method: ngram}}}, " f"got {_kind(value)}")
    parsed: list[Variant] = []
    baselines: dict[str, str | None] = {}
    for name, body in value.items():
        where = f"variants.{name}"
        if not isinstance(name, str) or not NAME.match(name):
            raise PlanError(f"{where}: a variant name is letters, digits, `_`, `-`, `.` (it names a folder)")
        m = _mapping(body, where, ("speculative_config", "model", "baseline", "backend", "args"))
        model = _expand(_str(m, "model", where, plan_model), home)
        backend = _backend(m["backend"], f"{where}.backend", home) if "backend" in m else default_backend
        baseline = m.get("baseline")
        if baseline is not None and not isinstance(baseline, str):
            raise PlanError(f"{where}.baseline: expected the name of another variant, got {_kind(baseline)}")
        baselines[name] = baseline
        parsed.append(Variant(name, model, _spec_config(m.get("speculative_config"), f"{where}.speculative_config",
                                                        home), backend, _strings(m, "args", where), baseline))
    by_name = {v.name: v for v in parsed}
    out = []
    for v in parsed:
        baseline = baselines[v.name]
        where = f"variants.{v.name}.baseline"
        if baseline is None and v.speculative_config is not None:
            same = [b for b in parsed if b.speculative_config is None and b.model == v.model]
            baseline = same[0].name if same else None
            if baseline is None and any(b.speculative_config is None for b in parsed):
                raise PlanError(f"{where}: {v.name} serves {v.model}, and no variant without speculative_config "
                                "serves that model: add one (its own baseline, as the article does for MTP) "
                                "and name it here")
        if baseline is not None:
            if baseline not in by_name:
                raise PlanError(f"{where}: no variant named {baseline!r}; expected one of {', '.join(by_name)}")
            b = by_name[baseline]
            if b.speculative_config is not None:
                raise PlanError(f"{where}: {baseline!r} has a speculative_config; a baseline has none")
            if b.model != v.model:
                raise PlanError(f"{where}: {baseline!r} serves {b.model}, {v.name} serves {v.model}; "
                                "compare a variant only with a baseline of the same model")
            if baseline == v.name:
                baseline = None
        out.append(Variant(v.name, v.model, v.speculative_config, v.backend, v.args, baseline))
    return tuple(out)


def _sweep(value: Any, model: str, backend: BackendSpec, perf: PerformancePass | None, server: ServerFlags,
           home: Home) -> tuple[SweepPlan, tuple[Variant, ...]]:
    m = _mapping(value, "sweep", ("method", "ks", "proof", "max_tpot_ms"))
    method = _spec_config(m.get("method"), "sweep.method", home)
    if method is None:
        raise PlanError("sweep.method: expected the speculative config without num_speculative_tokens, "
                        "e.g. {method: ngram, prompt_lookup_min: 2, prompt_lookup_max: 4}")
    for key in ("num_speculative_tokens", "num_speculative_tokens_per_batch_size"):
        if key in method:
            raise PlanError(f"sweep.method.{key}: the sweep sets it (from `ks`, and the tuned table); leave it out")
    ks = m.get("ks")
    if not isinstance(ks, list) or not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 0
                                                     for k in ks) or len(set(ks)) != len(ks) or 0 not in ks \
            or max(ks) < 1:
        raise PlanError(f"sweep.ks: expected a list of distinct draft lengths >= 0 with 0 (the baseline) and at "
                        f"least one >= 1, such as [0, 1, 2, 4], got {_kind(ks)}")
    if perf is None or not perf.ignore_eos:
        raise PlanError("performance: a sweep needs the performance pass with ignore_eos: true (fixed work per cell)")
    tpot = m.get("max_tpot_ms")
    if tpot is not None and (not isinstance(tpot, int | float) or isinstance(tpot, bool) or tpot <= 0):
        raise PlanError(f"sweep.max_tpot_ms: expected a positive number of milliseconds, got {_kind(tpot)}")
    sweep = SweepPlan(method, tuple(sorted(ks)), _bool(m, "proof", "sweep", True),
                  None if tpot is None else float(tpot))
    variants = tuple(
        Variant(sweep_variant_name(k), model, None if k == 0 else {**method, "num_speculative_tokens": k}, backend,
                SWEEP_ARGS, None if k == 0 else sweep_variant_name(0))
        for k in sweep.ks)
    return sweep, variants


TOP_KEYS = ("name", "backend", "model", "served_model_name", "server", "lang", "tasks", "warmup_requests",
            "acceptance", "performance", "variants", "sweep", "design", "rounds", "max_extra_rounds",
            "disturbed_above_cores")


def _design(m: dict[str, Any], variants: tuple[Variant, ...], sweep: SweepPlan | None,
            performance: PerformancePass | None) -> tuple[Design, int]:
    """The plan's design and rounds; by default the strongest that fits: interleaved where every variant's
    server can run beside the others (a study on `sim` or `vllm_cpu`), else bracketed (one server at a time,
    restarted for each block). A sweep is sequential (its proof measures one more variant after tuning)."""
    fits = sweep is None and all(v.backend.kind in SIDE_BY_SIDE for v in variants)
    design = m.get("design", "interleaved" if fits else "bracketed" if sweep is None else "sequential")
    if design not in DESIGNS:
        raise PlanError(f"design: expected one of {', '.join(DESIGNS)}, got {_kind(design)}")
    if design == "interleaved" and not fits:
        why = ("a sweep runs its cells in turn" if sweep is not None else
               "every variant's server must run beside the others, and "
               + ", ".join(f"{v.name} runs on {v.backend.kind}" for v in variants
                           if v.backend.kind not in SIDE_BY_SIDE) + f" (side by side: {', '.join(SIDE_BY_SIDE)})")
        raise PlanError(f"design: interleaved does not fit this plan: {why}; write `design: sequential`")
    running = sorted(v.name for v in variants if v.backend.kind == "url")
    if design == "bracketed" and running:
        raise PlanError(f"design: bracketed restarts each server for every block, and {', '.join(running)} "
                        "run on servers already running (`kind: url`); write `design: interleaved` or `sequential`")
    fewest = min((performance.requests_at(c) for c in performance.concurrencies), default=1) if performance else 1
    rounds = _int(m, "rounds", "plan", min(DEFAULT_ROUNDS, fewest) if design != "sequential" else 1)
    if design == "sequential" and rounds != 1:
        raise PlanError(f"rounds: a sequential design measures each variant in one block, got {rounds}; "
                        "use `design: interleaved` or `bracketed` for rounds")
    if rounds > fewest:
        raise PlanError(f"rounds: {rounds} rounds need at least as many requests per task at every concurrency, "
                        f"and performance.requests gives {fewest}")
    return cast(Design, design), rounds


def parse_plan(text: str, base_dir: Path, home: Home, inputs: Path | None = None) -> StudyPlan:
    """`inputs`: read every task from its copy there (`<inputs>/<task>.jsonl`, a run folder's `inputs/`) instead of
    its source: the plan of a run, loaded again for a later run into the same folder."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PlanError(f"not YAML: {exc}") from None
    m = _mapping(raw, "plan", TOP_KEYS)
    if not m:
        raise PlanError("plan: expected a mapping with at least `model`, `tasks` and `variants`")
    for required in ("model", "tasks"):
        if required not in m:
            raise PlanError(f"{required}: required key missing")
    if ("variants" in m) == ("sweep" in m):
        raise PlanError("variants: a plan has either `variants` (a study) or `sweep` (a tuning sweep), "
                        "not " + ("both" if "variants" in m else "neither"))
    model = _expand(_str(m, "model", "plan", None), home)
    lang = m.get("lang", "en")
    if lang not in LANGS:
        raise PlanError(f"lang: expected one of {', '.join(LANGS)} (the article's built-in prompts), got {_kind(lang)}")
    backend = _backend(m.get("backend", "sim"), "backend", home)
    performance = _performance(m.get("performance"))
    sweep: SweepPlan | None = None
    if "sweep" in m:
        sweep, variants = _sweep(m["sweep"], model, backend, performance, _server(m.get("server")), home)
    else:
        variants = _variants(m["variants"], model, backend, home)
    design, rounds = _design(m, variants, sweep, performance)
    return StudyPlan(
        name=_str(m, "name", "plan", "experiment"), model=model,
        served_model_name=_str(m, "served_model_name", "plan", SERVED_MODEL_NAME),
        server=_server(m.get("server")), lang=lang, tasks=_tasks(m["tasks"], base_dir, inputs),
        warmup_requests=_int(m, "warmup_requests", "plan", 1, minimum=0),
        acceptance=_acceptance(m.get("acceptance")), performance=performance,
        variants=variants, text=text, sweep=sweep, design=design, rounds=rounds,
        # by default half the rounds again at most (one block again in a sequential design): the done-when of
        # a study that recovers is that a disturbance costs at most half the quiet study's measuring
        max_extra_rounds=_int(m, "max_extra_rounds", "plan", max(1, rounds // 2), minimum=0),
        disturbed_above_cores=_cores(m, "disturbed_above_cores", DEFAULT_LIMIT_CORES))
