"""A sweep run folder in: per cell (k, concurrency) the measured requests, each with its TPOT and decode steps.

Step cost comes from the client's own TPOT, not from the server: a request of n output tokens
gets its first token from its prefill and the other n - 1 over its decode steps, each of which
emits 1 + (accepted drafts) tokens, so it took `max(R, n - 1 - C)` decode steps (R = steps that
drafted, C = accepted drafts, both from its `metrics.speculative_decoding`; R is the exact count
for async-scheduled methods, where every decode step drafts; n - 1 - C for n-gram / suffix, which
skip steps without a match, is short by at most the drafts a `max_tokens` cut discarded in the
last step). The step time of that request is then (last token - first token) / decode steps =
TPOT x (n - 1) / decode steps. Why not vLLM's own timing: 0.32.0 exposes no per-step duration
on `/metrics` (only per-request histograms and `vllm:iteration_tokens_total`, a token count),
and the same client-side figure works on the simulator, the CPU build and a GPU alike. Every
request at concurrency C ran in steps of about C requests (a closed loop with fixed work per
request), so the cell's median step time is the cost at batch size C, prefills of the
requests that replace finished ones included (they are part of serving at C).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.acceptance import parse, survival
from specwatch.experiment.layout import DONE, RunFolder, read_json_object


class SweepError(ValueError):
    """The folder is not a finished sweep; the message says what is missing."""


@dataclass(frozen=True)
class Sample:
    """One measured request of a cell."""

    task: str
    tpot_s: float
    output_tokens: int
    accepted: int  # C
    decode_steps: int  # max(R, n - 1 - C)
    survival: tuple[int, ...]  # decode steps that accepted at least i + 1 drafts, i = 0..k-1

    @property
    def step_s(self) -> float:
        return self.tpot_s * (self.output_tokens - 1) / self.decode_steps


@dataclass(frozen=True)
class Cell:
    variant: str
    k: int
    concurrency: int
    samples: tuple[Sample, ...]


@dataclass(frozen=True)
class Sweep:
    root: Path
    label: str  # the method, e.g. ngram
    method: Mapping[str, Any]
    ks: tuple[int, ...]
    concurrencies: tuple[int, ...]
    tasks: tuple[str, ...]
    cells: Mapping[tuple[int, int], Cell]  # (k, concurrency)
    dynamic: Mapping[int, Cell]  # the proof's cells by concurrency, when measured
    dynamic_config: Mapping[str, Any] | None
    max_tpot_ms: float | None

    def cell(self, k: int, concurrency: int) -> Cell:
        return self.cells[(k, concurrency)]


def sample(record: Mapping[str, Any]) -> Sample | None:
    """A measured request of `requests.jsonl`, or None (a warm-up, a failure, fewer than 2 tokens)."""
    n = int(record.get("completion_tokens") or 0)
    if record.get("warmup") or not record.get("ok") or record.get("tpot_s") is None or n < 2:
        return None
    field = record.get("spec")
    if field is None:
        return Sample(str(record["task"]), float(record["tpot_s"]), n, 0, n - 1, ())
    f = parse(field)
    steps = max(f.steps, n - 1 - f.accepted, 1)
    return Sample(str(record["task"]), float(record["tpot_s"]), n, f.accepted, steps, survival(f.histogram))


def read_cell(folder: Path, variant: str, k: int, concurrency: int) -> Cell:
    path = folder / "perf" / f"c{concurrency}" / "requests.jsonl"
    if not path.exists():
        raise SweepError(f"{path}: missing (the cell {variant} at concurrency {concurrency} did not run)")
    samples = [s for line in path.read_text().splitlines() if line.strip()
               if (s := sample(json.loads(line))) is not None]
    if not samples:
        raise SweepError(f"{path}: no measured request finished")
    return Cell(variant, k, concurrency, tuple(samples))


def load(root: Path) -> Sweep:
    run = RunFolder(root)
    record = read_json_object(run.sweep)
    if record is None:
        raise SweepError(f"{run.sweep}: missing; `specwatch tune` reads a run of a sweep plan "
                         "(a plan with `sweep:`, see examples/plans/tune-sim.yaml)")
    concurrencies = tuple(int(c) for c in record["concurrencies"])
    cells: dict[tuple[int, int], Cell] = {}
    for name, k in record["variants"].items():
        folder = run.variant(name)
        status = folder.read_status() or {}
        if status.get("state") != DONE:
            raise SweepError(f"{folder.root}: the variant {name} has not finished (state "
                             f"{status.get('state', 'missing')}); finish it with `specwatch experiment --resume`")
        for c in concurrencies:
            cells[(int(k), c)] = read_cell(folder.root, name, int(k), c)
    dynamic: dict[int, Cell] = {}
    dynamic_status = run.variant(record.get("dynamic", "dynamic")).read_status() or {}
    if dynamic_status.get("state") == DONE:
        where = run.variant(record.get("dynamic", "dynamic")).root
        dynamic = {c: read_cell(where, where.name, -1, c) for c in concurrencies}
    method = record["method"]
    return Sweep(root, str(method["method"]), method, tuple(int(k) for k in record["ks"]), concurrencies,
                 tuple(record["tasks"]), cells, dynamic,
                 dynamic_status.get("speculative_config") if dynamic else None, record.get("max_tpot_ms"))


def tpots(samples: Sequence[Sample]) -> list[float]:
    return [s.tpot_s for s in samples]
