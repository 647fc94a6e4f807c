"""Where the test suite's time and the machine's CPU go, per tier: a pytest plugin for issue 43's budget.

Loaded beside the README's test command (`PYTHONPATH=bench PYTEST_ADDOPTS="-p suite_cpu --suite-cpu=OUT"
make test`), it reads the whole machine's CPU time (`/proc/stat`: every process, Docker's containers and the
background image build included) before and after each test's setup, call and teardown, and writes OUT.json
(one row per test) and OUT.md (per tier: tests, wall seconds, busy CPU seconds, mean busy cores). A tier is
the first marker of `real_vllm`, `compose`, `prometheus` / `servers` / `browser` ("servers") a test carries,
else "unit". The last line says what the run's CPU work alone costs on this machine's cores: busy CPU seconds
over the core count is the shortest wall time any scheduling of the same work could reach.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

TIERS = (("real_vllm", "real_vllm"), ("compose", "compose"), ("prometheus", "servers"), ("servers", "servers"),
         ("browser", "servers"))
TICKS = os.sysconf("SC_CLK_TCK")
STAT = Path("/proc/stat")


def machine_cpu() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine since boot: user, nice, system, irq, softirq and steal
    are busy (guest time is inside user); idle and iowait are not."""
    fields = [int(x) for x in STAT.read_text().splitlines()[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / TICKS, (idle + iowait) / TICKS


@dataclass
class Row:
    nodeid: str
    tier: str
    wall_s: float
    busy_cpu_s: float


def tier_of(item: pytest.Item) -> str:
    names = {m.name for m in item.iter_markers()}
    return next((tier for marker, tier in TIERS if marker in names), "unit")


class SuiteCpu:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.rows: list[Row] = []
        self.began = time.monotonic()
        self.busy0, self.idle0 = machine_cpu()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        start, (busy, _) = time.monotonic(), machine_cpu()
        yield
        self.rows.append(Row(item.nodeid, tier_of(item), time.monotonic() - start, machine_cpu()[0] - busy))

    def pytest_sessionfinish(self) -> None:
        wall = time.monotonic() - self.began
        busy, idle = machine_cpu()
        cores = os.cpu_count() or 1
        total_busy = busy - self.busy0
        self.out.with_suffix(".json").write_text(json.dumps({
            "cores": cores, "wall_s": wall, "busy_cpu_s": total_busy, "idle_cpu_s": idle - self.idle0,
            "tests": [asdict(r) for r in self.rows]}, indent=1))
        lines = [f"# The suite's wall time and the machine's CPU, per tier ({time.strftime('%Y-%m-%d %H:%M')})", "",
                 f"{len(self.rows)} tests, {cores} cores; busy CPU = the whole machine's (`/proc/stat`), containers "
                 "and the background image build included.", "",
                 "| tier | tests | wall s | busy CPU s | mean busy cores |", "|---|---:|---:|---:|---:|"]
        for tier in ("unit", *dict.fromkeys(tier for _, tier in TIERS)):
            rows = [r for r in self.rows if r.tier == tier]
            w, b = sum(r.wall_s for r in rows), sum(r.busy_cpu_s for r in rows)
            lines.append(f"| {tier} | {len(rows)} | {w:.0f} | {b:.0f} | {b / w if w else 0:.2f} |")
        lines += [f"| all (pytest's session) | {len(self.rows)} | {wall:.0f} | {total_busy:.0f} | "
                  f"{total_busy / wall if wall else 0:.2f} |", "",
                  f"The same CPU work on {cores} cores takes at least {total_busy / cores / 60:.1f} min "
                  f"(busy CPU s / cores), whatever runs beside what.", ""]
        self.out.with_suffix(".md").write_text("\n".join(lines))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-cpu", metavar="OUT", help="write OUT.json and OUT.md: wall and machine CPU per tier")


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--suite-cpu")
    if out:
        config.pluginmanager.register(SuiteCpu(Path(out)), "suite-cpu-recorder")
