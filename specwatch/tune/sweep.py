"""A sweep run folder in: per cell (k, concurrency) the measured requests, each with its TPOT and decode steps.

Step cost from each request's TPOT and its decode steps: a request of n output tokens gets its
first token from its prefill and the other n - 1 over its decode steps, each of which emits
1 + (accepted drafts) tokens, so it took `max(R, n - 1 - C)` decode steps (R = steps that
drafted, C = accepted drafts, both from its `metrics.speculative_decoding`; R is the exact count
for async-scheduled methods, where every decode step drafts; n - 1 - C for n-gram / suffix, which
skip steps without a match, is short by at most the drafts a `max_tokens` cut discarded in the
last step). Its step time is then (last token - first token) / decode steps = TPOT x (n - 1) /
decode steps. The TPOT is the server's own (`mean_itl_ms` of `--enable-per-request-metrics`,
engine-core timestamps, which sweep plans turn on), the client's where the server gave none: on
a 2-core machine a client reading 64 streams falls behind and bunches tokens, which the engine
clock does not see. vLLM 0.32.0 has no per-step duration on `/metrics` (per-request histograms
only, and `vllm:iteration_tokens_total`, a token count), hence per request.

The batch a request ran in: the time-weighted mean number of the cell's requests in flight
(itself included, Locust's warm-ups too) over its decode window (first token to end, client
clock). A closed loop at concurrency C keeps about C running, but not while Locust spawns its
users (C per second) or drains the last round, nor when a busy client is slow to send the next
request; the cell's step cost is the cost at its median measured batch, prefills of the requests
that replace finished ones included (they are part of serving at that concurrency).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specwatch.acceptance import parse, survival
from specwatch.experiment.layout import DONE, RunFolder, RunFolderError, VariantFolder
from specwatch.files import read_json_object
from specwatch.load.results import RequestResult


class SweepError(ValueError):
    """The folder is not a finished sweep; the message says what is missing."""


@dataclass(frozen=True)
class Sample:
    """One measured request of a cell."""

    task: str
    tpot_s: float  # the server's (engine clock) when it reported one, else the client's
    output_tokens: int
    accepted: int  # C
    decode_steps: int  # max(R, n - 1 - C)
    survival: tuple[int, ...]  # decode steps that accepted at least i + 1 drafts, i = 0..k-1
    batch: float = 0.0  # requests in flight over its decode window (0: not known)

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
    proof: bool = False  # the plan asks `specwatch tune` to measure its recommendation as the variant `dynamic`
    backend: str | None = None  # the backend kind the cells ran on (sim, vllm_cpu, ...)

    def cell(self, k: int, concurrency: int) -> Cell:
        return self.cells[(k, concurrency)]


def sample(r: RequestResult) -> Sample | None:
    """A measured request of `requests.jsonl`, or None (a warm-up, a failure, fewer than 2 tokens)."""
    n = r.completion_tokens
    if r.warmup or not r.ok or r.tpot_s is None or n < 2:
        return None
    server_itl = (r.server or {}).get("mean_itl_ms")
    tpot = float(server_itl) / 1000 if isinstance(server_itl, int | float) and server_itl > 0 else float(r.tpot_s)
    if r.spec is None:
        return Sample(r.task, tpot, n, 0, n - 1, ())
    f = parse(r.spec)
    steps = max(f.steps, n - 1 - f.accepted, 1)
    return Sample(r.task, tpot, n, f.accepted, steps, survival(f.histogram))


def in_flight(window: tuple[float, float], intervals: Sequence[tuple[float, float]]) -> float:
    """The time-weighted mean number of `intervals` overlapping `window`."""
    a, b = window
    if b <= a:
        return float(sum(1 for s, e in intervals if s <= a <= e))
    return sum(max(0.0, min(b, e) - max(a, s)) for s, e in intervals) / (b - a)


def read_cell(folder: VariantFolder, variant: str, k: int, concurrency: int) -> Cell:
    path = folder.requests_file(concurrency)
    if not path.exists():
        raise SweepError(f"{path}: missing (the cell {variant} at concurrency {concurrency} did not run)")
    try:
        records = folder.requests(concurrency)
    except RunFolderError as exc:
        raise SweepError(str(exc)) from exc
    intervals = [(r.start, r.end) for r in records if r.start and r.end]
    samples = []
    for r in records:
        s = sample(r)
        if s is None:
            continue
        if r.start and r.end and r.ttft_s is not None:
            s = replace(s, batch=in_flight((r.start + r.ttft_s, r.end), intervals))
        samples.append(s if s.batch > 0 else replace(s, batch=float(concurrency)))
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
            cells[(int(k), c)] = read_cell(folder, name, int(k), c)
    dynamic: dict[int, Cell] = {}
    measured = str(record.get("dynamic", "dynamic"))
    dynamic_status = run.variant(measured).read_status() or {}
    if dynamic_status.get("state") == DONE:
        dynamic = {c: read_cell(run.variant(measured), measured, -1, c) for c in concurrencies}
    method = record["method"]
    return Sweep(root, str(method["method"]), method, tuple(int(k) for k in record["ks"]), concurrencies,
                 tuple(record["tasks"]), cells, dynamic,
                 dynamic_status.get("speculative_config") if dynamic else None, record.get("max_tpot_ms"),
                 bool(record.get("proof")), record.get("backend"))


def tpots(samples: Sequence[Sample]) -> list[float]:
    return [s.tpot_s for s in samples]
