"""Whether the machine stayed quiet while a performance block ran: the CPU that others took, read from /proc.

Two signals, each in cores (CPU seconds per second of the block):
- `outside_cores`: the machine's busy time (`/proc/stat`: user, nice, system, irq, softirq) less the CPU of the
  study's own processes (the runner and every process under it: the servers and their engine processes,
  Locust, the timeline's Prometheus; `utime + stime + cutime + cstime` summed over the tree, so a child that
  ended during the block still counts as the study's once its parent reaped it);
- `steal_cores`: the time the hypervisor gave the machine's CPUs to another guest (`/proc/stat` steal).

The rule is fixed before any result is read, and reads nothing a variant's requests measured: a block is
disturbed when either signal is above the plan's `disturbed_above_cores` (0.5 by default: half a core
taken from a study that expects the machine to itself). The runner re-measures a disturbed round at the
end (`specwatch.experiment.runner`, the plan's `max_extra_rounds`). Where /proc cannot be read (not Linux),
nothing is measured and nothing is called disturbed. A server in a container (the `docker` backend) runs
outside the runner's tree: its CPU would read as another's, so such a study is not watched (`unwatchable`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
DEFAULT_LIMIT_CORES = 0.5
BUSY_FIELDS = (0, 1, 2, 5, 6)  # user nice system irq softirq (guest time is inside user already)
STEAL_FIELD = 7


@dataclass(frozen=True)
class Reading:
    """One look at the machine: cumulative clock ticks, and when."""

    at: float  # time.monotonic()
    busy: int
    steal: int
    own: int  # the study's process tree


@dataclass(frozen=True)
class Machine:
    """What others took from the machine between two readings."""

    outside_cores: float
    steal_cores: float
    seconds: float

    def disturbed(self, limit: float) -> str | None:
        """The reason this block was disturbed, or None."""
        over = [f"processes outside the study used {self.outside_cores:.2f} cores" if self.outside_cores > limit
                else "", f"the hypervisor took {self.steal_cores:.2f} cores (steal)" if self.steal_cores > limit
                else ""]
        said = [x for x in over if x]
        return f"{' and '.join(said)} over the block's {self.seconds:.0f} s (limit {limit:g})" if said else None

    def record(self) -> dict[str, Any]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


def _ticks_per_second() -> int:
    return int(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100


def _process_table(proc: Path) -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, its own and its reaped children's CPU ticks)} of every process readable now."""
    table: dict[int, tuple[int, int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        fields = text.rpartition(")")[2].split()  # after the command, which may hold spaces and parentheses
        # fields[0] is the state: ppid at 1, utime stime cutime cstime at 11..14 (proc(5) fields 4, 14-17)
        table[int(entry.name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    return table


def tree_ticks(root: int, proc: Path = PROC) -> int:
    """The CPU ticks of `root` and every process under it."""
    table = _process_table(proc)
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += table.get(pid, (0, 0))[1]
        todo += children.get(pid, [])
    return total


def read(root: int | None = None, proc: Path = PROC) -> Reading | None:
    """The machine now, with `root`'s tree (this process by default) as the study's own; None without /proc."""
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
        values = [int(x) for x in first[1:]]
        own = tree_ticks(os.getpid() if root is None else root, proc)
    except (OSError, IndexError, ValueError):
        return None
    return Reading(time.monotonic(), sum(values[i] for i in BUSY_FIELDS if i < len(values)),
                   values[STEAL_FIELD] if len(values) > STEAL_FIELD else 0, own)


def between(before: Reading | None, after: Reading | None) -> Machine | None:
    """What others took between two readings; None where either is missing or no time passed."""
    if before is None or after is None or after.at <= before.at:
        return None
    seconds, hz = after.at - before.at, _ticks_per_second()
    outside = max(0, (after.busy - before.busy) - (after.own - before.own))
    return Machine(outside / hz / seconds, max(0, after.steal - before.steal) / hz / seconds, seconds)


def unwatchable(backends: Mapping[str, str]) -> str | None:
    """Why a study with these backends ({variant: backend kind}) is not watched, or None where it is."""
    boxed = sorted(name for name, kind in backends.items() if kind == "docker")
    if boxed:
        return (f"{', '.join(boxed)} run{'s' if len(boxed) == 1 else ''} in a container, outside this process tree: "
                "its CPU would read as another's")
    running = sorted(name for name, kind in backends.items() if kind == "url")
    if running:
        return (f"{', '.join(running)} run{'s' if len(running) == 1 else ''} on a server started elsewhere "
                "(`kind: url`), outside this process tree: its CPU would read as another's")
    return None
