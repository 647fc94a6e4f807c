"""A variant's passes: warm-up, acceptance (non-streaming, greedy, outputs kept), Locust performance, reconciliation.

Reconciliation is exact: the server's counter differences between the two snapshots must equal
the sums of the per-request `metrics.speculative_decoding` fields of every request sent in
between (acceptance pass and every performance request, Locust's warm-ups included).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from specwatch.acceptance import Acceptance, AcceptanceFieldError, spec_field
from specwatch.chat_client import run_chat
from specwatch.experiment.layout import VariantFolder, read_jsonl
from specwatch.experiment.plan import AcceptancePass, PerformancePass
from specwatch.files import write_text
from specwatch.load.results import read_results
from specwatch.load.run import LoadConfig
from specwatch.load.run import run as run_load
from specwatch.reconcile import reconcile
from specwatch.snapshot import Difference
from specwatch.workloads import Row

TOP_LOGPROBS = 2  # the chosen token's runner-up: enough to see a near-tie where two outputs part


def _lines(records: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def chat_pass(url: str, rows: Sequence[Row], path: Path, *, max_tokens: int, concurrency: int, model: str,
              top_logprobs: int = 0) -> None:
    """Send `rows` (non-streaming, temperature 0) and save one line per request, in row order (the response
    whole: with `top_logprobs`, each output token's logprob and its runners-up)."""
    extra = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else None
    results = run_chat(url, rows, max_tokens=max_tokens, concurrency=concurrency, model=model, extra=extra)
    records = []
    for index, r in enumerate(results):
        choice = (r.body.get("choices") or [{}])[0]
        records.append({
            "task": r.row.task, "index": index, "seconds": round(r.seconds, 4),
            "finish_reason": choice.get("finish_reason"),
            "text": (choice.get("message") or {}).get("content"),
            "usage": r.body.get("usage"), "spec": spec_field(r.body), "response": r.body,
        })
    write_text(path, _lines(records))


def acceptance_pass(url: str, task: str, rows: Sequence[Row], folder: VariantFolder, cfg: AcceptancePass,
                    model: str) -> None:
    """The greedy outputs the quality check compares, with each token's top logprobs: where a variant's text
    leaves the baseline's, they say whether that token was a near-tie (`specwatch.report.quality`)."""
    chat_pass(url, rows[:cfg.rows], folder.acceptance(task), max_tokens=cfg.max_tokens,
              concurrency=cfg.concurrency, model=model, top_logprobs=TOP_LOGPROBS)


def performance_pass(url: str, workloads: Mapping[str, Path], out: Path, cfg: PerformancePass, concurrency: int,
                     model: str, *, requests: int, warmup: int) -> dict[str, Any]:
    """One block of the performance pass: `requests` per task (after `warmup` per task) at `concurrency`, into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "summary.txt").open("w") as report:  # Locust's table, kept instead of printed
        return run_load(LoadConfig(url, concurrency, requests, dict(workloads), out, warmup, cfg.ignore_eos,
                                   cfg.max_tokens, cfg.max_seconds, model), Console(file=report, width=160))


# -- reconciliation ---------------------------------------------------------------------------------

def per_request_sums(folder: VariantFolder) -> tuple[Acceptance, list[str]]:
    """The spec fields of every request sent between the snapshots, summed, and the files they came from.

    A malformed field is an AcceptanceFieldError naming the file and line; a malformed line, a RunFolderError."""
    files: list[tuple[Path, list[Any]]] = [(path, [record.get("spec") for record in read_jsonl(path)])
                                           for path in folder.acceptance_files()]
    files += [(folder.requests_file(c), [r.spec for r in folder.requests(c)])
              for c in folder.concurrencies() if folder.requests_file(c).exists()]
    files += [(path, [r.spec for r in read_results([path])])  # rounds measured again: served all the same
              for c in folder.concurrencies() for path in folder.replaced_blocks(c)]
    summed = Acceptance()
    sources = [str(path.relative_to(folder.root)) for path, _ in files]
    for source, (_, fields) in zip(sources, files, strict=True):
        for number, field in enumerate(fields, 1):
            try:
                summed = summed.add(field, 0)
            except AcceptanceFieldError as exc:
                raise AcceptanceFieldError(f"{source} line {number}: {exc}") from None
    return summed, sources


def check_counters(difference: Difference, folder: VariantFolder, speculative: bool) -> dict[str, Any]:
    """The variant's reconciliation (`reconciliation.json`): each server counter's difference against the sum of the
    per-request fields (`per_request_sums`); a baseline must have drafted nothing."""
    summed, sources = per_request_sums(folder)
    per_request: dict[str, Any] = {
        "C": summed.accepted, "D": summed.drafted, "R": summed.steps,
        "per_position": list(summed.survival),  # steps that accepted at least p + 1
        "requests": summed.requests, "missing_field": summed.missing}
    server: dict[str, Any] | None = None
    if difference.server is not None:
        s = difference.server
        server = {"C": s.accepted, "D": s.draft_tokens, "R": s.steps, "per_position": list(s.per_position)}
    checks = [{"counter": c.name, "per_request_sum": c.per_request, "server_delta": c.server, "equal": c.equal}
              for c in reconcile(summed, difference.server, speculative)]
    return {"ok": all(c["equal"] for c in checks), "checks": checks, "per_request": per_request, "server": server,
            "snapshot_seconds": round(difference.seconds, 3), "sources": sources}
