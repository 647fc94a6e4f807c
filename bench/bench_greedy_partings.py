"""Measurement: where greedy speculative outputs part from the baseline's on the real CPU server, and by how much.

Starts the real vLLM 0.32.0 CPU server three times in turn (baseline, the article's n-gram config, the
truncated 8-layer draft model, k = 4), sends the same article rows to each (greedy, `--tokens` output
tokens, 2 in flight, the top 3 logprobs of every token) and, for every output that differs from the
baseline's, reports the first differing token with both runs' margins and the swing that
`specwatch.report.quality` compares with `NEAR_TIE_NATS`. What it measured sets that constant.

    .venv/bin/python bench/bench_greedy_partings.py --rows 4 --tokens 160 --out bench/results/greedy-partings-cpu

Writes `<out>/<variant>.jsonl` (each response whole, as the acceptance pass saves it; a variant already there
is not run again) and `<out>/partings.md` (the table); the servers' logs go to the temporary folder.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from specwatch.config import resolve_home
from specwatch.models import build as models
from specwatch.net import free_port
from specwatch.report.quality import NEAR_TIE_NATS, parting
from specwatch.report.results import Output, output_tokens
from specwatch.vllm_cpu.server import NGRAM_CONFIG, VllmServer, serve_argv
from specwatch.workloads import article_prompt

TASKS = ("code", "chat")


def ask(url: str, model: str, task: str, index: int, tokens: int) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": article_prompt(task, index)}],
            "max_tokens": tokens, "temperature": 0, "logprobs": True, "top_logprobs": 3}
    reply = requests.post(url + "/v1/chat/completions", json=body, timeout=600)
    reply.raise_for_status()
    response = reply.json()
    return {"task": task, "index": index, "text": response["choices"][0]["message"]["content"], "response": response}


def run_variant(name: str, spec: dict[str, Any] | None, rows: int, tokens: int, out: Path, logs: Path) -> None:
    path = out / f"{name}.jsonl"
    if path.exists():
        return
    home = resolve_home(None)
    port = free_port()
    argv = serve_argv(models.build(home).target, port=port, speculative_config=spec, extra=["--max-num-seqs", "8"])
    with VllmServer(home, argv, port, logs / f"{name}.log").start() as server:
        model = requests.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]
        asks = [(task, i) for task in TASKS for i in range(rows)]
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda a: ask(server.url, model, a[0], a[1], tokens), asks))
    path.write_text("".join(json.dumps(a) + "\n" for a in answers))
    print(f"{name}: {len(answers)} answers", flush=True)


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def outputs(path: Path) -> dict[tuple[str, int], Output]:
    got = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        a = json.loads(line)  # a record as the acceptance pass saves it: read by the report's own parser
        toks = output_tokens(a, f"{path}, record {number}")
        got[a["task"], a["index"]] = Output(a["task"], a["index"], a["text"], None, len(toks), toks)
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4, help="article rows per task")
    parser.add_argument("--tokens", type=int, default=160, help="output tokens per request")
    parser.add_argument("--out", type=Path, default=Path("bench/results/greedy-partings-cpu"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    drafts = models.build(resolve_home(None)).drafts
    variants: dict[str, dict[str, Any] | None] = {
        "baseline": None, "ngram": dict(NGRAM_CONFIG),
        "draft-first8": {"method": "draft_model", "model": str(drafts[8]), "num_speculative_tokens": 4}}
    for name, spec in variants.items():
        run_variant(name, spec, args.rows, args.tokens, args.out, Path(tempfile.gettempdir()))
    base = outputs(args.out / "baseline.jsonl")
    lines = [f"# Greedy partings on the real CPU server ({args.rows} rows per task, {args.tokens} tokens, 2 in flight)",
             "", f"`NEAR_TIE_NATS` = {NEAR_TIE_NATS:g}. Margin: how far a run preferred its own token there.", "",
             "| variant | task | row | token | baseline's | variant's | baseline margin | variant margin | swing |",
             "|---|---|--:|--:|---|---|--:|--:|--:|"]
    for name in variants:
        if name == "baseline":
            continue
        mine = outputs(args.out / f"{name}.jsonl")
        same = sum(mine[k].text == base[k].text for k in base)
        print(f"{name}: {same} of {len(base)} identical to the baseline's")
        for key in sorted(base):
            if mine[key].text == base[key].text:
                continue
            p = parting(mine[key], base[key])
            if p is None:
                lines.append(f"| {name} | {key[0]} | {key[1]} | - | - | - | - | - | (no differing token) |")
                continue
            lines.append(f"| {name} | {key[0]} | {key[1]} | {p.position} | {p.baseline_token!r} | "
                         f"{p.variant_token!r} | {fmt(p.baseline_margin)} | {fmt(p.variant_margin)} | {fmt(p.swing)} |")
            print(lines[-1])
        lines.append(f"| {name} | all | | | | | | | {same} of {len(base)} identical |")
    (args.out / "partings.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'partings.md'}")


if __name__ == "__main__":
    main()
