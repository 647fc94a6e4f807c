"""Exact snapshots of a `/metrics` endpoint (vLLM's or the exporter's) and the difference of two.

A snapshot is the exposition text as served, behind one header line naming the URL and the time.
The difference of two gives, per variant (vLLM) or per variant and task (exporter), the
accepted tokens C, draft tokens D, verify steps R, the acceptance rate C / D, the mean acceptance
length 1 + C / R, the per-position counts and rates and, from the exporter, the histogram of steps
by accepted drafts. A process restart between the two (a different `process_start_time_seconds`
or `_created`, or any counter that went down) is an error, never a negative or silently wrong figure.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from specwatch.exporter.families import FAMILIES as F
from specwatch.files import write_text
from specwatch.vllm_metrics import ACCEPTED, DRAFT_TOKENS, DRAFTS, PER_POS, CounterResetError, samples

HEADER = "# specwatch-snapshot "
Key = tuple[str, tuple[tuple[str, str], ...]]


class SnapshotError(ValueError):
    """A file that is not a snapshot, or an endpoint that did not answer."""


@dataclass(frozen=True)
class Snapshot:
    url: str
    taken_at: float
    text: str

    def samples(self) -> dict[Key, float]:
        return samples(self.text)


def take(url: str, timeout: float = 10) -> Snapshot:
    """GET `url` (a base URL gets `/metrics` appended)."""
    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        resp = requests.get(target, timeout=timeout)
    except requests.RequestException as exc:
        raise SnapshotError(f"{target}: {exc}") from exc
    if resp.status_code != 200:
        raise SnapshotError(f"{target}: HTTP {resp.status_code}, expected 200 with a Prometheus exposition")
    return Snapshot(target, time.time(), resp.text)


def write(snapshot: Snapshot, path: Path) -> None:
    header = HEADER + json.dumps({"url": snapshot.url, "taken_at": snapshot.taken_at}) + "\n"
    write_text(path, header + snapshot.text)  # never half a snapshot on disk


def read(path: Path) -> Snapshot:
    text = path.read_text()
    first, _, body = text.partition("\n")
    if not first.startswith(HEADER):
        raise SnapshotError(f"{path}: expected a first line `{HEADER}{{...}}` (written by `specwatch snapshot`)")
    meta = json.loads(first[len(HEADER):])
    return Snapshot(str(meta["url"]), float(meta["taken_at"]), body)


@dataclass(frozen=True)
class Figures:
    """Summed counters over the interval and the ratios built from them (summed first, then divided)."""

    accepted: float = 0.0          # C
    draft_tokens: float = 0.0      # D
    steps: float = 0.0             # R (vLLM: drafts)
    per_position: tuple[float, ...] = ()
    histogram: tuple[float, ...] = ()   # exporter only: steps that accepted exactly 0..k drafts

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.steps if self.steps else None

    @property
    def per_position_rate(self) -> tuple[float, ...]:
        return tuple(p / self.steps for p in self.per_position) if self.steps else ()

    def as_dict(self) -> dict[str, Any]:
        return {"C": self.accepted, "D": self.draft_tokens, "R": self.steps,
                "acceptance_rate": self.acceptance_rate, "mean_acceptance_length": self.mean_acceptance_length,
                "per_position": list(self.per_position), "per_position_rate": list(self.per_position_rate),
                "histogram": list(self.histogram)}


@dataclass(frozen=True)
class Difference:
    url: str
    seconds: float
    server: Figures | None                      # vLLM's spec-decode counters (None: not a speculative vLLM)
    by_task: dict[tuple[str, str], Figures] = field(default_factory=dict)   # exporter: (variant, task)
    counters: dict[Key, float] = field(default_factory=dict)                # every counter's increase

    def increase(self, name: str, **labels: str) -> float:
        """The summed increase of counter `name` over the series that carry every one of `labels`."""
        return _sum(self.counters, name, labels)

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "seconds": self.seconds,
                "server": self.server.as_dict() if self.server else None,
                "by_task": [{"variant": v, "task": t, **f.as_dict()} for (v, t), f in sorted(self.by_task.items())]}


def _sum_tuples(a: tuple[float, ...], b: tuple[float, ...]) -> tuple[float, ...]:
    width = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0.0) + (b[i] if i < len(b) else 0.0) for i in range(width))


def _add_figures(a: Figures | None, b: Figures | None) -> Figures | None:
    if a is None or b is None:
        return a or b
    return Figures(a.accepted + b.accepted, a.draft_tokens + b.draft_tokens, a.steps + b.steps,
                   _sum_tuples(a.per_position, b.per_position), _sum_tuples(a.histogram, b.histogram))


def combine(differences: Sequence[Difference]) -> Difference:
    """The differences of several lifetimes of one server (restarted between them) added up: what it counted in all.

    Each lifetime's difference is taken within one process (`diff` refuses a restart); their sum is the total a
    reconciliation compares with the requests sent in all of them."""
    if not differences:
        raise SnapshotError("combine: no differences to add")
    total = differences[0]
    for d in differences[1:]:
        counters = dict(total.counters)
        for counter, value in d.counters.items():
            counters[counter] = counters.get(counter, 0.0) + value
        by_task = dict(total.by_task)
        for pair, figures in d.by_task.items():
            by_task[pair] = _add_figures(by_task.get(pair), figures) or figures
        total = Difference(d.url, total.seconds + d.seconds, _add_figures(total.server, d.server), by_task, counters)
    return total


def _check_same_process(before: dict[Key, float], after: dict[Key, float]) -> None:
    for (name, labels), value in before.items():
        if name == "process_start_time_seconds" or name.endswith("_created"):
            later = after.get((name, labels))
            if later is not None and later != value:
                raise CounterResetError(f"{name}{dict(labels)} changed from {value} to {later}: the process "
                                        "restarted between the two snapshots, so their difference means nothing")
        elif name.endswith("_total") and after.get((name, labels), value) < value:
            raise CounterResetError(f"counter {name}{dict(labels)} went from {value} to {after[(name, labels)]}: "
                                    "the process restarted between the two snapshots")


def _positions(values: dict[int, float]) -> tuple[float, ...]:
    return tuple(values.get(p, 0.0) for p in range(max(values) + 1)) if values else ()


def server_figures(before: str, after: str) -> Figures:
    """vLLM's spec-decode counters' differences between two expositions of one server process, for a caller that
    holds the texts (`diff` of two snapshots of them); all zero where the server does not speculate;
    CounterResetError across a restart."""
    return diff(Snapshot("", 0.0, before), Snapshot("", 0.0, after)).server or Figures()


def diff(before: Snapshot, after: Snapshot) -> Difference:
    if before.url != after.url:
        raise SnapshotError(f"snapshots of different endpoints: {before.url} and {after.url}")
    if after.taken_at < before.taken_at:
        raise SnapshotError("the second snapshot is older than the first: pass them in order")
    a, b = before.samples(), after.samples()
    _check_same_process(a, b)
    counters = {k: v - a.get(k, 0.0) for k, v in b.items() if k[0].endswith("_total")}

    server = None
    if any(name == DRAFTS for name, _ in counters):
        per_pos: dict[int, float] = {}
        for (name, labels), v in counters.items():
            if name == PER_POS:
                position = int(dict(labels)["position"])
                per_pos[position] = per_pos.get(position, 0.0) + v
        server = Figures(_sum(counters, ACCEPTED), _sum(counters, DRAFT_TOKENS), _sum(counters, DRAFTS),
                         _positions(per_pos))

    by_task: dict[tuple[str, str], Figures] = {}
    keys = {(dict(ls)["variant"], dict(ls)["task"]) for name, ls in counters
            if name == F.spec_steps}
    for variant, task in sorted(keys):
        sel = {"variant": variant, "task": task}
        pos = {int(dict(ls)["position"]): v for (n, ls), v in counters.items()
               if n == F.accepted_per_pos and _has(ls, sel)}
        hist = {int(dict(ls)["accepted"]): v for (n, ls), v in counters.items()
                if n == F.spec_steps_by_accepted and _has(ls, sel)}
        by_task[(variant, task)] = Figures(
            _sum(counters, F.accepted, sel), _sum(counters, F.draft_tokens, sel), _sum(counters, F.spec_steps, sel),
            _positions(pos), _positions(hist))
    return Difference(after.url, after.taken_at - before.taken_at, server, by_task, counters)


def _has(labels: tuple[tuple[str, str], ...], selector: dict[str, str]) -> bool:
    return all((k, v) in labels for k, v in selector.items())


def _sum(counters: dict[Key, float], name: str, selector: dict[str, str] | None = None) -> float:
    return sum(v for (n, ls), v in counters.items() if n == name and _has(ls, selector or {}))
