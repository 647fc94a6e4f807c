"""The Acceptance tab's figures: what the exporter counted per variant and task since the run started.

The Locust master (or the standalone process) snapshots the exporter's `/metrics` when a run starts and again
when the tab is read (at most once a second while the run goes on, once more when it has stopped, then frozen);
the difference of the two (`specwatch.snapshot.diff`, which refuses a restarted exporter) gives per variant and
task: requests ok and failed (every other outcome), acceptance rate C / D, mean acceptance length 1 + C / R, the
drafted share of decode steps R / decode steps, acceptance by position per draft (steps accepting >= i / R, as
vLLM defines it) and of drafts that reached the position (only when every step of the window came with vLLM's
per-step arrays), and the counts they rest on. Every row says where the numbers come from and when they were
scraped. Cells are text, rounded here: the web UI shows them as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from specwatch.exporter.families import FAMILIES as F
from specwatch.snapshot import Difference, Snapshot, SnapshotError, diff, take
from specwatch.vllm_metrics import CounterResetError

NONE = "—"
COLUMNS = (("variant", "Variant"), ("task", "Task"), ("ok", "Requests ok"), ("failed", "Requests failed"),
           ("rate", "Acceptance rate C/D"), ("length", "Mean acceptance length 1+C/R"),
           ("share", "Drafted share of decode steps"), ("positions", "By position, per draft"),
           ("reached", "By position, of drafts that reached it"), ("accepted", "C"), ("drafted", "D"),
           ("steps", "R"), ("source", "Source"))


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(epoch))


def _number(value: float | None, digits: int = 3) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def _positions(values: list[float | None]) -> str:
    return " · ".join(_number(v) for v in values) if values else NONE


def rows(difference: Difference, source: str) -> list[dict[str, str]]:
    """One row per (variant, task) that saw a request in the window; vLLM's server-wide figures when the
    endpoint is vLLM's own (no specwatch families)."""
    requests = F.requests
    pairs = sorted({(dict(ls)["variant"], dict(ls)["task"]) for name, ls in difference.counters if name == requests})
    out = []
    for variant, task in pairs:
        increase = partial(difference.increase, variant=variant, task=task)
        sent = increase(requests)
        if not sent:
            continue
        ok = increase(requests, outcome="ok")
        figures = difference.by_task.get((variant, task))
        row = {"variant": variant, "task": task, "ok": f"{ok:.0f}", "failed": f"{sent - ok:.0f}", "source": source}
        if figures is None or not figures.steps:
            row.update(dict.fromkeys(("rate", "length", "share", "positions", "reached"), NONE))
            row.update(accepted=f"{figures.accepted if figures else 0:.0f}",
                       drafted=f"{figures.draft_tokens if figures else 0:.0f}", steps="0")
            out.append(row)
            continue
        decode_steps = increase(F.decode_steps)
        reach = [increase(F.drafts_reaching, position=str(i))
                 for i in range(len(figures.per_position))]
        detailed = not increase(F.steps_without_per_step) and any(reach)
        of_reached = ([p / n if n else None for p, n in zip(figures.per_position, reach, strict=True)]
                      if detailed else [])
        row.update(rate=_number(figures.acceptance_rate), length=_number(figures.mean_acceptance_length, 2),
                   share=_number(figures.steps / decode_steps if decode_steps else None),
                   positions=_positions(list(figures.per_position_rate)), reached=_positions(of_reached),
                   accepted=f"{figures.accepted:.0f}", drafted=f"{figures.draft_tokens:.0f}",
                   steps=f"{figures.steps:.0f}")
        out.append(row)
    if not pairs and difference.server is not None:  # vLLM's own /metrics: every task together
        s = difference.server
        out.append({"variant": "server-wide (vLLM)", "task": "all tasks", "ok": NONE, "failed": NONE,
                    "rate": _number(s.acceptance_rate), "length": _number(s.mean_acceptance_length, 2),
                    "share": NONE, "positions": _positions(list(s.per_position_rate)), "reached": NONE,
                    "accepted": f"{s.accepted:.0f}", "drafted": f"{s.draft_tokens:.0f}", "steps": f"{s.steps:.0f}",
                    "source": source})
    return out


def message_row(source: str) -> dict[str, str]:
    """A row that carries only a message (no exporter set, not reachable, restarted, nothing counted yet)."""
    return {**{key: NONE for key, _ in COLUMNS}, "source": source}


@dataclass
class AcceptanceView:
    """The run's window at the exporter: a snapshot at the start, a later one refreshed on demand."""

    url: str | None                      # the exporter's /metrics (None: the tab says it is off)
    timeout_s: float = 3.0
    min_refresh_s: float = 1.0
    clock: Callable[[], float] = time.time
    baseline: Snapshot | None = None
    latest: Snapshot | None = None
    error: str | None = None
    final: bool = False

    def start(self) -> None:
        self.baseline = self.latest = None
        self.final = False
        self.baseline, self.error = self._take()
        self.latest = self.baseline

    def refresh(self) -> None:
        """A new snapshot unless the last one is under `min_refresh_s` old or the run has ended (frozen)."""
        if self.final or self.baseline is None:
            return
        if self.latest is not None and self.clock() - self.latest.taken_at < self.min_refresh_s:
            return
        latest, error = self._take()
        if latest is not None:
            self.latest = latest
        self.error = error

    def finish(self) -> None:
        """The run has stopped: one last snapshot, after every request ended, then the figures stay."""
        if self.final or self.baseline is None:
            return
        latest, self.error = self._take()
        self.latest = latest or self.latest
        self.final = True

    def _take(self) -> tuple[Snapshot | None, str | None]:
        if self.url is None:
            return None, None
        try:
            return take(self.url, timeout=self.timeout_s), None
        except SnapshotError as exc:
            return None, str(exc)

    def rows(self) -> list[dict[str, str]]:
        if self.url is None:
            return [message_row("no exporter: set --exporter-metrics URL (its /metrics)")]
        if self.baseline is None:
            why = f": {self.error}" if self.error else ""
            return [message_row(f"{self.url}: no snapshot when the run started{why}; starts with the next run")]
        if self.latest is None:
            return [message_row(f"{self.url}: {self.error or 'not scraped since the run started'}")]
        age = max(0.0, self.clock() - self.latest.taken_at)
        status = "final, after the run stopped" if self.final and not self.error else f"{age:.0f} s old"
        stale = f"; last scrape failed: {self.error}" if self.error else ""
        source = (f"{self.url} scraped {_clock(self.latest.taken_at)} ({status}), counted since the run started "
                  f"{_clock(self.baseline.taken_at)}{stale}")
        try:
            found = rows(diff(self.baseline, self.latest), source)
        except (CounterResetError, SnapshotError) as exc:
            return [message_row(f"{self.url}: {exc}")]
        return found or [message_row(f"{source}: no request counted yet")]

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "rows": self.rows()}
