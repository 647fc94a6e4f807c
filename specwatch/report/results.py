"""Read an experiment's results folder (the layout of `specwatch.experiment`) into typed figures.

Nothing is recomputed from anything but the files: acceptance is the sum of the saved
per-request fields (summed first, then divided), performance is each pass's `summary.json` and,
for the judge, its per-request lines (`requests.jsonl`, warm-ups left out): TPOT, the ITL p95
of each request and each request's output tokens per second (completion tokens / its e2e time),
the server-side figures are the difference of the two saved `/metrics` snapshots, the curves
over the run are `timeline.json` as the study's Prometheus answered the dashboard queries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from specwatch import snapshot
from specwatch.acceptance import Acceptance, parse, spec_field
from specwatch.experiment.environment import server_identity
from specwatch.experiment.layout import RunFolder, RunFolderError, VariantFolder, read_jsonl
from specwatch.load.results import RequestResult, percentile
from specwatch.workloads import WorkloadError, load_jsonl

PERF_METRICS = ("tpot", "itl_p95", "output_tps")  # per-request performance samples, named as the canary names them


class ResultsError(ValueError):
    """Not an experiment results folder, or a file in it that cannot be read; the message names it."""


@dataclass(frozen=True)
class Token:
    """One output token as the server reported it: its text, its logprob, and the most likely tokens at that
    position with theirs (the chosen one among them, for greedy decoding)."""

    text: str
    logprob: float
    top: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Output:
    task: str
    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int
    tokens: tuple[Token, ...] = ()  # empty when the response had no logprobs (asked for since the quality check)


def request_value(r: RequestResult, metric: str, server_clock: bool = False) -> float | None:
    """One request's TPOT (the client's, or the server's mean inter-token latency), ITL p95 or output tokens/s."""
    if metric == "tpot":
        itl = (r.server or {}).get("mean_itl_ms")
        return itl / 1000 if server_clock and isinstance(itl, int | float) else r.tpot_s
    if metric == "itl_p95":
        return percentile(r.itl_s, 95)
    if metric == "output_tps":
        return r.completion_tokens / (r.end - r.start) if r.end > r.start else None
    raise KeyError(f"{metric}: expected one of {', '.join(PERF_METRICS)}")


@dataclass
class VariantResults:
    name: str
    state: str                                   # done, failed, or missing (never finished)
    error: str | None = None
    backend: str | None = None
    speculative: bool = False
    method: str | None = None
    baseline: str | None = None                  # the variant the plan compares it with (status.json), if any
    num_gpu_blocks: int | None = None
    acceptance: dict[str, Acceptance] = field(default_factory=dict)      # task -> acceptance pass sums
    outputs: dict[str, list[Output]] = field(default_factory=dict)      # task -> per request, by index
    perf: dict[int, dict[str, dict[str, Any]]] = field(default_factory=dict)  # concurrency -> task -> summary
    requests: dict[int, dict[str, list[RequestResult]]] = field(default_factory=dict)  # measured, per request
    spec_requests: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # task -> (C, D), acceptance pass
    server: snapshot.Figures | None = None       # snapshot difference over all passes
    reconciled: bool | None = None
    blocks: list[dict[str, Any]] = field(default_factory=list)  # the performance blocks: concurrency, round, times
    server_version: str | None = None            # environment.json: the server's `GET /version`
    model_runner: str | None = None              # environment.json: "V1" / "V2" where the server's log said
    argv: list[str] | None = None                # environment.json: the server's arguments

    def server_clock(self, concurrency: int, task: str) -> bool:
        """Whether every ok measured request has the server's own TPOT (`--enable-per-request-metrics`)."""
        rows = [r for r in self.requests.get(concurrency, {}).get(task, []) if r.ok]
        return bool(rows) and all(isinstance((r.server or {}).get("mean_itl_ms"), int | float) for r in rows)

    def samples(self, concurrency: int, task: str, metric: str, server_clock: bool = False) -> list[float]:
        """One value per ok measured request of the performance pass (only positive values: they go on logs)."""
        return [x for values in self.samples_by_round(concurrency, task, metric, server_clock).values() for x in values]

    def samples_by_round(self, concurrency: int, task: str, metric: str, server_clock: bool = False
                         ) -> dict[int, list[float]]:
        """`samples` per round of the study (one round: a sequential design, or a run before rounds).

        `server_clock`: TPOT as the server timed it (its mean inter-token latency), not as a busy client read it."""
        out: dict[int, list[float]] = {}
        for r in self.requests.get(concurrency, {}).get(task, []):
            if r.ok:
                value = request_value(r, metric, server_clock)
                if value is not None and value > 0:
                    out.setdefault(r.round, []).append(value)
        return dict(sorted(out.items()))


@dataclass
class RunResults:
    folder: Path
    run_id: str
    plan: dict[str, Any]
    variants: list[VariantResults]
    prompts: dict[str, list[str]]                # task -> prompts in row order (for the quality checks)
    timeline: dict[str, Any] | None = None       # timeline.json: key dashboard queries over each variant's window
    design: str = "sequential"                   # run.json: how the variants were measured (interleaved rounds or not)
    rounds: int = 1

    def variant(self, name: str) -> VariantResults | None:
        return next((v for v in self.variants if v.name == name), None)

    def candidates(self, default: str) -> list[tuple[VariantResults, VariantResults | None]]:
        """Every variant to judge, with the variant it is judged against.

        Its own baseline where the plan gave it one (MTP against MiMo's plain model), else `default`;
        `default` and the variants that are some candidate's baseline are baselines, not candidates.
        """
        def base_of(v: VariantResults) -> str:
            return v.baseline if v.baseline and self.variant(v.baseline) is not None else default

        baselines = {default} | {base_of(v) for v in self.variants if v.speculative}
        return [(v, self.variant(base_of(v))) for v in self.variants if v.name not in baselines]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ResultsError(f"{path}: {exc}") from exc


def _jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        return read_jsonl(path)
    except RunFolderError as exc:
        raise ResultsError(str(exc)) from exc


def output_tokens(rec: dict[str, Any], where: str) -> tuple[Token, ...]:
    """The tokens of an acceptance-pass record's `response.choices[0].logprobs.content` (OpenAI's shape, as vLLM
    answers it); none when the server sent no logprobs (a run before they were asked for, a server that sends none). A
    malformed entry is named (`where`: the file and record), not skipped."""
    try:
        choice = ((rec.get("response") or {}).get("choices") or [{}])[0]
        content = (choice.get("logprobs") or {}).get("content")
        if not content:
            return ()
        return tuple(Token(str(t["token"]), float(t["logprob"]),
                           tuple((str(a["token"]), float(a["logprob"])) for a in t.get("top_logprobs") or ()))
                     for t in content)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ResultsError(f"{where}: response.choices[0].logprobs.content is not a list of "
                           f"{{token, logprob, top_logprobs}}: {exc!r}") from None


def _prompts(run: RunFolder) -> dict[str, list[str]]:
    """Each task's prompts as the load sent them: read by the workload loader itself (`messages`: the last user
    message, as `specwatch.workloads.load_jsonl` takes it), not a reading of our own."""
    out: dict[str, list[str]] = {}
    for task, path in run.task_files().items():
        try:
            out[task] = [row.prompt for row in load_jsonl(path, default_task=task)]
        except WorkloadError as exc:
            raise ResultsError(f"{path}: the run's copy of the task file no longer loads: {exc}") from None
    return out


def _requests(folder: VariantFolder, concurrency: int) -> dict[str, list[RequestResult]]:
    try:
        rows = folder.requests(concurrency)
    except RunFolderError as exc:
        raise ResultsError(str(exc)) from exc
    out: dict[str, list[RequestResult]] = {}
    for r in rows:
        if not r.warmup:
            out.setdefault(r.task, []).append(r)
    return out


def _variant(folder: VariantFolder, name: str, spec: dict[str, Any]) -> VariantResults:
    status = _json(folder.status) if folder.status.exists() else {"state": "missing"}
    config = spec.get("speculative_config") or None
    declared = status.get("baseline") or spec.get("baseline")
    result = VariantResults(name, str(status.get("state", "missing")), status.get("error"),
                            speculative=config is not None, baseline=str(declared) if declared else None,
                            method=(config or {}).get("method") or (config or {}).get("model") if config else None)
    if folder.environment.exists():
        env = _json(folder.environment)
        backend = env.get("backend")
        result.backend = str(backend.get("kind") or backend.get("name")) if isinstance(backend, dict) else backend
        blocks = env.get("num_gpu_blocks")
        result.num_gpu_blocks = int(blocks) if blocks not in (None, "None", "") else None
        identity = server_identity(env)
        result.server_version, result.model_runner = identity["vllm_version"], identity["model_runner"]
        argv = env.get("argv")
        result.argv = [str(a) for a in argv] if isinstance(argv, list) else None
    for path in folder.acceptance_files():
        acc = Acceptance()
        outputs: list[Output] = []
        pairs: list[tuple[int, int]] = []
        for rec in _jsonl(path):
            usage = rec.get("usage") or {}
            tokens = int(usage.get("completion_tokens") or 0)
            sd = spec_field({"metrics": {"speculative_decoding": rec.get("spec")}}) if rec.get("spec") else None
            acc = acc.add(sd, tokens)
            if sd is not None:
                fields = parse(sd)
                pairs.append((fields.accepted, fields.drafted))
            outputs.append(Output(path.stem, int(rec.get("index", len(outputs))), str(rec.get("text") or ""),
                                  rec.get("finish_reason"), tokens,
                                  output_tokens(rec, f"{path}, record {len(outputs) + 1}")))
        result.acceptance[path.stem] = acc
        result.outputs[path.stem] = sorted(outputs, key=lambda o: o.index)
        result.spec_requests[path.stem] = pairs
    for concurrency in folder.concurrencies():
        if folder.summary_file(concurrency).exists():
            result.perf[concurrency] = _json(folder.summary_file(concurrency)).get("tasks", {})
            result.requests[concurrency] = _requests(folder, concurrency)
    snapshots = folder.snapshot_pairs()  # one pair per server lifetime (several in a bracketed design)
    if snapshots:
        lifetimes = [snapshot.diff(snapshot.read(b), snapshot.read(a)) for b, a in snapshots]
        result.server = snapshot.combine(lifetimes).server
    blocks = status.get("blocks")
    result.blocks = [b for b in blocks if isinstance(b, dict)] if isinstance(blocks, list) else []
    if folder.reconciliation.exists():
        doc = _json(folder.reconciliation)
        result.reconciled = bool(doc.get("equal", doc.get("ok"))) if isinstance(doc, dict) else None
    return result


def load(folder: Path) -> RunResults:
    layout = RunFolder(folder)
    if not layout.plan.exists():
        raise ResultsError(f"{folder}: no plan.yaml; expected a folder written by `specwatch experiment`")
    plan = yaml.safe_load(layout.plan.read_text()) or {}
    run = _json(layout.run) if layout.run.exists() else {}
    declared = plan.get("variants") or {}
    if isinstance(declared, list):  # a list of {name: ..., ...} is accepted too
        declared = {str(v["name"]): v for v in declared if isinstance(v, dict) and "name" in v}
    if not declared and isinstance(plan.get("sweep"), dict):  # a sweep: k0, k1, ... and dynamic, as they ran
        for name in run.get("variants", []):
            status_path = layout.variant(str(name)).status
            status = _json(status_path) if status_path.exists() else {}
            declared[str(name)] = {"speculative_config": status.get("speculative_config")}
    variants = [_variant(layout.variant(str(name)), str(name), spec if isinstance(spec, dict) else {})
                for name, spec in declared.items()]
    timeline = _json(layout.timeline) if layout.timeline.exists() else None
    if timeline is not None and not (isinstance(timeline, dict) and isinstance(timeline.get("queries"), list)
                                     and isinstance(timeline.get("variants"), dict)):
        raise ResultsError(f"{layout.timeline}: expected an object with `queries` and `variants`")
    design = str(run.get("design") or "sequential")
    rounds = int(run.get("rounds") or 1)
    return RunResults(folder, str(run.get("run_id", folder.name)), plan, variants, _prompts(layout), timeline,
                      design, rounds)
