"""The `specwatch diff` verb: two snapshots' difference as C, D, R and the acceptance figures (a table or JSON).

Exit codes: 0 printed, 3 a restart between the two snapshots (never a number).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specwatch.config import Home
from specwatch.exit_codes import EXIT_CHECK, EXIT_OK


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--json", action="store_true", help="JSON instead of a table")


def run(home: Home, args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from specwatch import snapshot
    from specwatch.vllm_metrics import CounterResetError

    try:
        d = snapshot.diff(snapshot.read(args.before), snapshot.read(args.after))
    except CounterResetError as exc:
        print(f"specwatch diff: {exc}", file=sys.stderr)
        return EXIT_CHECK
    if args.json:
        print(json.dumps(d.as_dict(), indent=2))
        return EXIT_OK
    table = Table(title=f"{d.url}, {d.seconds:.1f} s apart: summed first, then divided")
    for col in ("variant", "task", "C", "D", "R", "C/D", "1+C/R", "per position (/R)", "histogram 0..k"):
        table.add_column(col)

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.4g}"

    rows = ([("server", "all", d.server)] if d.server else []) + [(v, t, f) for (v, t), f in d.by_task.items()]
    for variant, task, f in rows:
        table.add_row(variant, task, fmt(f.accepted), fmt(f.draft_tokens), fmt(f.steps), fmt(f.acceptance_rate),
                      fmt(f.mean_acceptance_length), " ".join(f"{r:.3f}" for r in f.per_position_rate),
                      " ".join(f"{h:g}" for h in f.histogram))
    Console().print(table if rows else "no spec-decode counters in these snapshots")
    return EXIT_OK
