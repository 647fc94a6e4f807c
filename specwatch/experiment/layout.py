"""Where an experiment's results go, written atomically as they are produced; a variant's status comes last.

The one map of a run folder, and the writer of its records: the runner schedules and hands each record to
`RunFolder` / `VariantFolder` (`write_*`, whole files through `specwatch.files`); every reader (the report,
`specwatch tune`, the reconciliation) takes its paths from them, and a performance pass's requests through
`VariantFolder.requests`. Locust writes a block's own files (`block`) as it runs; the acceptance pass and the
timeline write to the paths named here.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.files import read_json_object, write_bytes, write_json, write_text
from specwatch.load.results import RequestResult, read_results

DONE = "done"  # a finished variant (its checks may still have failed); resume skips it
FAILED = "failed"  # an error stopped the variant; resume redoes it


class RunFolderError(ValueError):
    """A file of a run folder that cannot be read; the message names it (and the line)."""


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file written here (blank lines skipped); RunFolderError names a bad line."""
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise RunFolderError(f"{path}:{number}: {exc}") from exc
    return records


@dataclass(frozen=True)
class VariantFolder:
    root: Path

    @property
    def environment(self) -> Path:
        return self.root / "environment.json"

    @property
    def help_text(self) -> Path:
        return self.root / "server-help.txt"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def warmup(self) -> Path:
        return self.root / "warmup.jsonl"

    @property
    def metrics_before(self) -> Path:
        return self.root / "metrics-before.prom"

    @property
    def metrics_after(self) -> Path:
        return self.root / "metrics-after.prom"

    def lifetime(self, n: int) -> tuple[Path, Path, Path]:
        """Lifetime `n` (1-based) of the variant's server, restarted between blocks in a bracketed design: its log
        and its two snapshots (the first lifetime's are the plain names)."""
        if n == 1:
            return self.server_log, self.metrics_before, self.metrics_after
        return (self.root / f"server-{n}.log", self.root / f"metrics-before-{n}.prom",
                self.root / f"metrics-after-{n}.prom")

    def snapshot_pairs(self) -> list[tuple[Path, Path]]:
        """The (before, after) snapshots of every lifetime that has both, in order."""
        pairs: list[tuple[Path, Path]] = []
        n = 1
        while True:
            _, before, after = self.lifetime(n)
            if not before.exists():
                return pairs
            if after.exists():
                pairs.append((before, after))
            n += 1

    @property
    def reconciliation(self) -> Path:
        return self.root / "reconciliation.json"

    @property
    def status(self) -> Path:
        return self.root / "status.json"

    def acceptance(self, task: str) -> Path:
        return self.root / "acceptance" / f"{task}.jsonl"

    def acceptance_files(self) -> list[Path]:
        """Every task's acceptance pass (`acceptance/<task>.jsonl`), by task name."""
        return sorted((self.root / "acceptance").glob("*.jsonl"))

    def perf(self, concurrency: int) -> Path:
        """The performance pass at one concurrency: every block's requests merged (`requests.jsonl`, each line
        with its round) and their `summary.json`."""
        return self.root / "perf" / f"c{concurrency}"

    def concurrencies(self) -> list[int]:
        """The concurrencies the performance pass has a folder for (`perf/c<N>`), smallest first."""
        found = (re.fullmatch(r"c(\d+)", p.name) for p in (self.root / "perf").glob("c*") if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m)

    def requests_file(self, concurrency: int) -> Path:
        return self.perf(concurrency) / "requests.jsonl"

    def summary_file(self, concurrency: int) -> Path:
        return self.perf(concurrency) / "summary.json"

    def requests(self, concurrency: int) -> list[RequestResult]:
        """The performance pass's requests at one concurrency, one typed record per line of its `requests.jsonl`,
        in order (warm-ups and failures included; none where the pass wrote no file). RunFolderError names a
        malformed file."""
        path = self.requests_file(concurrency)
        try:
            return read_results([path])
        except (ValueError, TypeError) as exc:
            raise RunFolderError(f"{path}: {exc}") from exc

    def block(self, concurrency: int, round_: int) -> Path:
        """One round's block of the performance pass, as Locust wrote it."""
        return self.perf(concurrency) / "rounds" / f"r{round_}"

    def block_requests(self, concurrency: int, round_: int) -> Path:
        return self.block(concurrency, round_) / "requests.jsonl"

    def block_summary(self, concurrency: int, round_: int) -> Path:
        return self.block(concurrency, round_) / "summary.json"

    def replaced_blocks(self, concurrency: int) -> list[Path]:
        """The `requests.jsonl` of each block the merged pass leaves out (a round measured again, `rounds/r<R>` kept
        on disk): requests the server did serve, which the reconciliation counts."""
        merged = (read_json_object(self.perf(concurrency) / "summary.json") or {}).get("rounds")
        if not isinstance(merged, list):
            return []
        found = [(int(p.name[1:]), p / "requests.jsonl") for p in (self.perf(concurrency) / "rounds").glob("r*")
                 if p.name[1:].isdigit()]
        return [path for r, path in sorted(found) if r not in merged and path.exists()]

    def read_status(self) -> dict[str, Any] | None:
        return read_json_object(self.status)

    # -- the variant's records, each written whole (`specwatch.files`), as the runner produces them
    def write_help(self, text: str) -> None:
        write_text(self.help_text, text)

    def write_environment(self, record: dict[str, Any]) -> None:
        write_json(self.environment, record)

    def write_acceptance(self, task: str, lines: str) -> None:
        write_text(self.acceptance(task), lines)

    def write_merged_pass(self, concurrency: int, lines: str, summary: dict[str, Any]) -> None:
        """The performance pass at one concurrency: its blocks' requests in one file, then their summary."""
        write_text(self.requests_file(concurrency), lines)
        write_json(self.summary_file(concurrency), summary)

    def write_reconciliation(self, record: dict[str, Any]) -> None:
        write_json(self.reconciliation, record)

    def write_status(self, status: dict[str, Any]) -> None:
        """Last: the variant is finished only from here on (`finished`)."""
        write_json(self.status, status)

    def finished(self) -> bool:
        status = self.read_status()
        return status is not None and status.get("state") == DONE


@dataclass(frozen=True)
class RunFolder:
    root: Path

    @property
    def plan(self) -> Path:
        return self.root / "plan.yaml"

    @property
    def run(self) -> Path:
        return self.root / "run.json"

    @property
    def inputs(self) -> Path:
        return self.root / "inputs"

    def task_file(self, task: str) -> Path:
        """The copy of a task's workload the passes read (`inputs/<task>.jsonl`)."""
        return self.inputs / f"{task}.jsonl"

    def task_files(self) -> dict[str, Path]:
        """Every task's copy, by task name."""
        return {p.stem: p for p in sorted(self.inputs.glob("*.jsonl"))}

    def article_file(self, lang: str, article: str) -> Path:
        """The article's workload written for a run (`inputs/article-<lang>/<code|chat>.jsonl`)."""
        return self.inputs / f"article-{lang}" / f"{article}.jsonl"

    @property
    def prometheus(self) -> Path:
        return self.root / "prometheus"

    @property
    def timeline(self) -> Path:
        return self.root / "timeline.json"

    @property
    def sweep(self) -> Path:
        """A sweep plan's cells: method, draft lengths, concurrencies, tasks (what `specwatch tune` reads)."""
        return self.root / "sweep.json"

    @property
    def tune(self) -> Path:
        """`specwatch tune`'s outputs, and the proof of its recommendation."""
        return self.root / "tune"

    def timeline_variants(self) -> set[str]:
        """The variants `timeline.json` already holds."""
        return set((read_json_object(self.timeline) or {}).get("variants", {}))

    def variant(self, name: str) -> VariantFolder:
        return VariantFolder(self.root / "variants" / name)

    # -- the run's records, each written whole (`specwatch.files`)
    def write_plan(self, text: str) -> None:
        write_text(self.plan, text)

    def read_record(self) -> dict[str, Any] | None:
        return read_json_object(self.run)

    def write_record(self, record: dict[str, Any]) -> None:
        write_json(self.run, record)

    def write_sweep(self, record: dict[str, Any]) -> None:
        write_json(self.sweep, record)

    def copy_input(self, task: str, source: Path) -> Path:
        """A task's workload copied into `inputs/` (what the passes read, and a resume checks); its path."""
        target = self.task_file(task)
        write_bytes(target, source.read_bytes())  # byte for byte: a resume compares the two files' sha256
        return target

    def set_aside(self, name: str) -> Path | None:
        """Move an unfinished variant's partial results under `interrupted/` before it is redone."""
        folder = self.variant(name).root
        if not folder.exists():
            return None
        target = self.root / "interrupted" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), str(target))
        return target
