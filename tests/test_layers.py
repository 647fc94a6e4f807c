"""The import graph of `specwatch/`, read with `ast` (lazy imports inside functions included): floors, not knots.

`tune/` is on the top floor, with nothing below importing it; the verbs take their exit codes from the leaf
`specwatch.exit_codes`, so only entry points import `specwatch.cli` (which loads every verb); and no module or
package imports one that imports it back, however far round.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "specwatch"
TUNE = "specwatch.tune"
ENTRY_POINTS = {"specwatch.cli", "specwatch.__main__"}


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, modules: Mapping[str, Path]) -> Iterator[str]:
    """Every specwatch module `path` imports; `from pkg import sub` names the submodule, not its package."""
    here = _name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            yield from subs if len(subs) == len(node.names) else [base, *subs]


@cache
def graph() -> dict[str, frozenset[str]]:
    modules = {_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: frozenset(d for d in _imported(path, modules) if d in modules and d != name)
            for name, path in modules.items()}


def _cycles(edges: Mapping[str, frozenset[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(component)
    return out


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_nothing_below_tune_imports_it() -> None:
    """Every module outside `tune/`, every package and the root's modules alike (the verb table names
    `specwatch.tune.cli` as a string, loaded on demand, which is no import)."""
    below = [m for m in graph() if _package(m) != TUNE]
    assert len({_package(m) for m in below}) > 20, below  # the packages and the root modules, not a chosen few
    wrong = sorted(f"{m} imports {d}" for m in below for d in graph()[m] if _package(d) == TUNE)
    assert not wrong, wrong


def test_only_entry_points_import_the_cli() -> None:
    wrong = sorted(m for m, deps in graph().items() if "specwatch.cli" in deps and m not in ENTRY_POINTS)
    assert not wrong, f"import the exit codes from specwatch.exit_codes instead: {wrong}"


def test_no_module_imports_itself_round_a_circle() -> None:
    assert not _cycles(graph()), _cycles(graph())


def test_no_package_imports_itself_round_a_circle() -> None:
    packages: dict[str, set[str]] = {}
    for module, deps in graph().items():
        here = _package(module)
        packages.setdefault(here, set()).update(_package(d) for d in deps if _package(d) != here)
    cycles = _cycles({p: frozenset(d) for p, d in packages.items()})
    assert not cycles, cycles


def test_the_check_sees_a_circle_and_a_lazy_import() -> None:
    assert _cycles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset()}) == [
        {"a", "b", "c"}]
    assert "specwatch.models.build" in graph()["specwatch.models.cli"]  # imported inside run()
