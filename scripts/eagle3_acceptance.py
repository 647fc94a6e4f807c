"""The EAGLE-3 head on the real vLLM 0.32.0 CPU server: acceptance by draft position, per task, on the study's prompts.

    .venv/bin/python scripts/eagle3_acceptance.py [--k 3] [--rows 8] [--max-tokens 96] [--head DIR] [--out FILE]

Builds the head where missing (`specwatch models build --eagle3`; `--head` names another head folder, such as the
test tier's small one), starts the server with
`{"method": "eagle3", "model": <head>, "num_speculative_tokens": k}` and per-request metrics, sends each
task's first `--rows` prompts of `specwatch.workloads` one at a time (greedy), and sums the per-request
fields: acceptance at draft position i = steps that accepted at least i drafts / steps (vLLM's own
definition, every draft here reaching depth k), C / D, mean acceptance length. Checks that the sums equal
the server's counter differences over the run, and writes the figures as JSON (default: stdout only).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import requests

from specwatch.config import resolve_home
from specwatch.models import build as models
from specwatch.net import free_port
from specwatch.snapshot import server_figures
from specwatch.vllm_cpu.server import SERVED_MODEL_NAME, VllmServer, serve_argv
from specwatch.workloads import TASKS, article_rows


def main() -> int:
    p = argparse.ArgumentParser(prog="scripts/eagle3_acceptance.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", type=Path)
    p.add_argument("--head", type=Path, help="an EAGLE-3 head folder (default: the full head, built where missing)")
    args = p.parse_args()
    home = resolve_home(None)
    folders = models.build(home, eagle3=args.head is None)
    head = args.head or folders.eagle3
    if head is None or not (head / "config.json").is_file():
        p.error(f"--head {head}: expected an EAGLE-3 head folder (config.json and model.safetensors)")
    port = free_port()
    argv = serve_argv(folders.target, port=port, speculative_config={
        "method": "eagle3", "model": str(head), "num_speculative_tokens": args.k})
    log = Path(tempfile.mkdtemp(prefix="eagle3-")) / "server.log"
    with VllmServer(home, argv, port, log).start() as server:
        before = requests.get(server.url + "/metrics", timeout=30).text
        result: dict[str, object] = {"k": args.k, "rows": args.rows, "max_tokens": args.max_tokens,
                                     "head": json.loads((head / "TRAINING.json").read_text())}
        sums = {"R": 0, "C": 0, "D": 0}
        for task in TASKS:
            hist = [0] * (args.k + 1)
            started = time.monotonic()
            for row in article_rows(task, count=args.rows):
                body = {"model": SERVED_MODEL_NAME, "messages": row.messages(), "max_tokens": args.max_tokens,
                        "temperature": 0}
                spec = requests.post(server.url + "/v1/chat/completions", json=body, timeout=600).json()[
                    "metrics"]["speculative_decoding"]
                hist = [a + b for a, b in zip(hist, spec["acceptance_histogram"], strict=True)]
                sums["R"] += spec["num_spec_steps"]
                sums["C"] += spec["num_accepted_draft_tokens"]
                sums["D"] += spec["num_draft_tokens"]
            steps = sum(hist)
            result[task] = {
                "steps": steps, "seconds": round(time.monotonic() - started, 1),
                "acceptance_by_position": [round(sum(hist[i:]) / steps, 3) for i in range(1, args.k + 1)],
                "acceptance_rate": round(sum(i * h for i, h in enumerate(hist)) / (steps * args.k), 3),
                "mean_acceptance_length": round(1 + sum(i * h for i, h in enumerate(hist)) / steps, 3)}
        after = requests.get(server.url + "/metrics", timeout=30).text
    delta = server_figures(before, after)
    server_delta = {"R": delta.steps, "C": delta.accepted, "D": delta.draft_tokens}
    result["reconciled"] = server_delta == sums
    result["server_counters"], result["summed_fields"] = server_delta, sums
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["reconciled"] else 3


if __name__ == "__main__":
    sys.exit(main())
