"""`specwatch experiment`: the source article's study as a plan, run in its design (interleaved rounds, bracketed
rounds or variant by variant), resumable.

Modules: `plan` (YAML in, a validated frozen `StudyPlan` out), `runner` (the order of things),
`blocks` (the order of the performance blocks, and their merge), `passes` (warm-up, acceptance, one
Locust block, reconciliation), `environment` (what ran),
`timeline` (Prometheus beside the study), `layout` (where results go), `cli` (the verb).
Servers come from `specwatch.backends`.

Results layout, written as it is produced (every record specwatch writes goes through a temporary name and a
rename, `specwatch.files`; Locust writes its own CSVs and log of a block as it runs, and the server its log):

    results/<run-id>/
      plan.yaml                     the plan as given (a resume must pass the same text)
      run.json                      run id, specwatch version, sha256 of plan.yaml and every input,
                                    variant order, attempts (start / finish), final states, design, rounds
      inputs/<task>.jsonl           the task files the passes read (article sets written here)
      inputs/article-<lang>/        the article's code.jsonl / chat.jsonl and sha256.txt, when used
      variants/<name>/
        server.log                  the server's output (first line: the command)
        environment.json            specwatch / Python / server versions, backend (command, image,
                                    packages), argv, model records (PROVENANCE.json, revision),
                                    inputs' sha256, num_gpu_blocks (vllm:cache_config_info),
                                    startup seconds
        server-help.txt             `vllm serve --help` as the backend runs it (when it can)
        warmup.jsonl                warm-up requests, sent before the first snapshot
        metrics-before.prom         /metrics snapshot (specwatch.snapshot format)
        acceptance/<task>.jsonl     one line per request: task, index, finish_reason, text, usage,
                                    spec (metrics.speculative_decoding), the whole response
        perf/c<N>/rounds/r<R>/      round R's block at concurrency N, as `specwatch load` writes it:
                                    summary.json, summary.txt, requests.jsonl, locust_*.csv, locust.log
        perf/c<N>/requests.jsonl    every block's requests, each line with its `round`; summary.json
        metrics-after.prom          /metrics snapshot after the passes
        server-<n>.log, metrics-before-<n>.prom, metrics-after-<n>.prom
                                    lifetime n >= 2 of the server (a bracketed design restarts it)
        reconciliation.json         snapshot difference vs the summed per-request fields
                                    (C, D, R, every position; requests without the field)
        status.json                 written LAST: state done (ok: checks passed) or failed (error),
                                    timings, the design, every block (concurrency, round, start, end),
                                    how the server was confirmed gone
      interrupted/<name>-<time>/    an unfinished variant's partial results, set aside on --resume
      prometheus/                   the Prometheus that scraped each variant's server (config, data, log),
                                    when `prometheus` is on PATH and not --no-prometheus
      sweep.json                    a sweep plan's cells (k x concurrency), for `specwatch tune`
      tune/                         what `specwatch tune` writes: the recommendation, the cost table, the proof
      timeline.json                 the key dashboard queries (specwatch.grafana.key_queries) over each
                                    finished variant's window, 5 s steps: what the report plots over the run

A variant with `state: done` is skipped by `--resume` and never rewritten; any other variant
is set aside and redone from the start of its server.
"""

from specwatch.experiment.plan import PlanError, StudyPlan, load_plan, parse_plan
from specwatch.experiment.runner import RunConflict, RunOptions, RunResult, run_plan

__all__ = ["PlanError", "RunConflict", "RunOptions", "RunResult", "StudyPlan", "load_plan", "parse_plan", "run_plan"]
