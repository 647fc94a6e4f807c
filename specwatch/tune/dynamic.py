"""The proof's measurement: the recommended per-batch-size config run as the variant `dynamic` of the sweep's folder.

A second `run_plan` into the sweep's own run folder: the plan it saved (`plan.yaml`, its tasks read from the run's
copies in `inputs/`) with the one variant `dynamic` instead of the cells, on the first cell's backend and server
arguments, compared with `k0`. The runner adds it to `run.json` beside the cells; `proof.write_proof` then reads it
as `tune.sweep.load` does every cell. Prometheus records it where it recorded the sweep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console

from specwatch.config import Home
from specwatch.experiment.layout import RunFolder
from specwatch.experiment.plan import DYNAMIC, PlanError, Variant, parse_plan, sweep_variant_name
from specwatch.experiment.runner import RunOptions, RunResult, run_plan, stop_on_sigterm


def measure(root: Path, config: Mapping[str, Any], home: Home, environ: Mapping[str, str],
            console: Console) -> RunResult:
    """Measure `config` as the variant `dynamic` of the sweep run at `root`; PlanError where its plan no longer
    loads, RunConflict where the folder does not fit (its task files changed). A relative `root` (`make tune-sim`'s
    `results/...`) is made absolute first: the plan's task paths are read against it and the inputs under it."""
    root = root.resolve()
    run = RunFolder(root)
    try:
        text = run.plan.read_text(encoding="utf-8")
    except OSError as exc:
        raise PlanError(f"{run.plan}: {exc}") from exc
    plan = parse_plan(text, root, home, inputs=run.inputs)
    first = plan.variants[0]
    dynamic = Variant(DYNAMIC, plan.model, dict(config), first.backend, first.args, sweep_variant_name(0))
    options = RunOptions(root.parent, root.name, home, resume=True, environ=dict(environ),
                         prometheus="prometheus" if run.prometheus.exists() else None)
    stop_on_sigterm()
    return run_plan(replace(plan, variants=(dynamic,)), options, console)
