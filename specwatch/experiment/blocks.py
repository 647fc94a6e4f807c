"""The performance pass in blocks: which variant's block comes when in a round, and the blocks merged per pass.

A study measures each variant in `rounds` blocks of requests per concurrency. In an interleaved design
every round holds one block of every variant, the order rotated from round to round, so each variant
is measured early and late in a round as often as the others. In a bracketed design (one server at
a time) the order is reversed every other round instead, so the baseline's blocks bracket the others'.
The blocks of one variant at one concurrency are merged into the pass's `requests.jsonl` (each line
tagged with its round) and its `summary.json`, the files every reader of a run reads.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from specwatch.experiment.layout import VariantFolder
from specwatch.load.results import read_results, summarise


def rotation(names: Sequence[str], round_: int) -> list[str]:
    """The order of round `round_` (1-based): `names` rotated by one place per round."""
    if not names:
        return []
    k = (round_ - 1) % len(names)
    return [*names[k:], *names[:k]]


def bracket(names: Sequence[str], round_: int) -> list[str]:
    """The order of round `round_` in a bracketed design: `names` in odd rounds, reversed in even ones, so that
    with the baseline first the blocks run B C | C B | B C | C B: each candidate's pair of blocks lies between
    the baseline's, and a drift linear in time cancels over two rounds."""
    return list(names) if round_ % 2 else list(reversed(names))


def merge(folder: VariantFolder, concurrency: int, rounds: Sequence[int]) -> dict[str, Any]:
    """Merge the blocks of `rounds` at `concurrency` into the pass's requests.jsonl and summary.json; the summary.

    Every line keeps what Locust wrote and gains its round; warm-ups are kept (the reconciliation counts them).
    Locust's exit code is the worst of the blocks'."""
    rows = []
    codes: list[int] = []
    config: dict[str, Any] = {}
    for r in rounds:
        for row in read_results([folder.block_requests(concurrency, r)]):
            row.round = r
            rows.append(row)
        summary_path = folder.block_summary(concurrency, r)
        block_summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
        code = block_summary.get("locust_exit_code")
        codes.append(code if isinstance(code, int) else -1)
        config = config or dict(block_summary.get("config") or {})
    summary = summarise(rows)
    summary["locust_exit_code"] = next((c for c in codes if c != 0), 0) if codes else -1
    summary["rounds"] = list(rounds)
    summary["config"] = {**config, "requests_per_task": sum(1 for r in rows if not r.warmup) // max(
        len(summary["tasks"]), 1), "rounds": list(rounds)}
    folder.write_merged_pass(concurrency, "".join(r.line() for r in rows), summary)
    return summary

