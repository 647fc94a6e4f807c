"""The rounds the runner found disturbed, and which it re-measured: the report's "Rounds re-measured" section.

The runner watches the machine while each performance block runs and writes what it saw into the block's entry
of the variant's `status.json` `blocks` list: `machine` ({outside_cores, steal_cores, seconds}: the CPU that
processes outside the study took while the block ran, in cores), `disturbed` (the reason, or null), and for a
round run again `replaces` (the round it stands in for) and, on every block of the round it replaced,
`replaced_by`. A round is replaced as a whole at a concurrency (every variant's block of it), and the merged
requests (`summary.json`'s `rounds`) leave replaced rounds out, so the verdicts rest on clean rounds only; this
section says which were left out and why. A disturbed round without `replaced_by` stayed in: the plan's extra
rounds ran out before it could be re-measured. Runs from before the runner watched have no `machine` key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from specwatch.report.results import RunResults


@dataclass(frozen=True)
class Round:
    """One round at one concurrency, every variant's block of it together."""

    concurrency: int
    number: int
    reasons: tuple[str, ...]  # each distinct `disturbed` reason of its blocks, in variant order
    outside_cores: float | None  # the most any of its blocks saw taken outside the study
    steal_cores: float | None
    replaced_by: int | None
    replaces: int | None

    @property
    def disturbed(self) -> bool:
        return bool(self.reasons)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _most(values: Iterable[float | None]) -> float | None:
    seen = [x for x in values if x is not None]
    return max(seen) if seen else None


def rounds(run: RunResults) -> list[Round]:
    """Every (concurrency, round) of any variant's blocks, in order."""
    grouped: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for v in run.variants:
        for b in v.blocks:
            if isinstance(b.get("concurrency"), int) and isinstance(b.get("round"), int):
                grouped.setdefault((b["concurrency"], b["round"]), []).append(b)
    out = []
    for (c, r), blocks in sorted(grouped.items()):
        machines: list[Mapping[str, Any]] = [m if isinstance(m := b.get("machine"), dict) else {} for b in blocks]
        reasons = tuple(dict.fromkeys(str(b["disturbed"]) for b in blocks if b.get("disturbed")))
        by = {b["replaced_by"] for b in blocks if isinstance(b.get("replaced_by"), int)}
        stands_for = {b["replaces"] for b in blocks if isinstance(b.get("replaces"), int)}
        out.append(Round(c, r, reasons, _most(_number(m.get("outside_cores")) for m in machines),
                         _most(_number(m.get("steal_cores")) for m in machines),
                         min(by) if by else None, min(stands_for) if stands_for else None))
    return out


def _cores(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def section(run: RunResults) -> list[str]:
    """The report's "Rounds re-measured": each replaced round (its reason, the signal, the round that replaced it),
    each disturbed round that stayed in, or that no round was disturbed (with the most seen outside the study)."""
    found = rounds(run)
    lines = ["", "## Rounds re-measured", ""]
    if not found:
        return lines + ["The study recorded no performance blocks (nothing to re-measure)."]
    if all(x.outside_cores is None and x.steal_cores is None and not x.disturbed for x in found):
        return lines + ["The runner did not record the machine during the blocks (a run from before it watched): no "
                        "round was judged disturbed or re-measured."]
    replaced = [x for x in found if x.replaced_by is not None]
    kept = [x for x in found if x.disturbed and x.replaced_by is None]
    if not replaced and not kept:
        most = _most(x.outside_cores for x in found)
        return lines + [f"No round was disturbed: the most CPU that processes outside the study took during a block "
                        f"was {_cores(most)} cores."]
    lines += ["A round is disturbed by a rule fixed before any effect is read (CPU taken by processes outside the "
              "study while its blocks ran); a disturbed round is re-run at the end as a whole, every variant's block "
              "of it, and the verdicts rest on the rounds that replaced it. Signal: the most any of the round's "
              "blocks saw, in cores.", "",
              "| concurrency | round | why | outside the study (cores) | steal (cores) | replaced by |",
              "|--:|--:|---|--:|--:|---|"]
    for x in replaced + kept:
        why = "; ".join(x.reasons).replace("|", "\\|") or "-"
        by = (f"round {x.replaced_by}" if x.replaced_by is not None else
              "none: the extra rounds ran out, so it stayed in the verdicts")
        lines.append(f"| {x.concurrency} | {x.number} | {why} | {_cores(x.outside_cores)} | "
                     f"{_cores(x.steal_cores)} | {by} |")
    if kept:
        lines += ["", f"{len(kept)} disturbed round{'s' if len(kept) != 1 else ''} stayed in (no extra round left to "
                  "re-measure it): the verdicts at that concurrency rest on it too, and its drift is judged on each "
                  "line."]
    return lines
