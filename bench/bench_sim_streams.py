"""Benchmark: can `specwatch sim` hold N concurrent streams on this machine at its modelled speed?

Runs the same N streaming chat requests (ignore_eos, fixed output length) twice:
1. in-process through the engine with a near-zero time scale, reading each request's
   TPOT off the timing model's own clock (what the model says);
2. against a real `specwatch sim` process at time scale 1 over HTTP with N concurrent
   streams of the benches' SSE client (perf/sse_client.py), measuring TPOT at the client (what a client sees).
Prints the median and p95 of both and their ratio, and writes them to a JSON file.

    .venv/bin/python bench/bench_sim_streams.py --streams 64 --tokens 128
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from specwatch.net import free_port
from specwatch.simulator.args import parse_sim_args
from specwatch.simulator.engine import EngineRequest
from specwatch.simulator.main import build
from specwatch.simulator.server import CHAT_TEMPLATE, GENERATION_PROMPT
from specwatch.simulator.target import generate
from specwatch.simulator.tokens import tokenize
from specwatch.supervisor import Supervisor
from specwatch.workloads import article_rows

sys.path.insert(0, str(Path(__file__).parent / "perf"))  # the benches' one SSE client
from sse_client import stream_chat  # noqa: E402


def modelled(argv: list[str], prompts: list[str], tokens: int) -> list[float]:
    _, engine = build(parse_sim_args([*argv, "--sim-time-scale", "0.000001"]))

    async def go() -> list[EngineRequest]:
        loop = asyncio.create_task(engine.run())
        reqs = []
        for i, prompt in enumerate(prompts):
            pieces = tokenize(CHAT_TEMPLATE.format(role="user", content=prompt) + GENERATION_PROMPT)
            reqs.append(EngineRequest(str(i), pieces, generate(prompt, tokens).tokens, tokens))
            engine.add(reqs[-1])
        while not all(r.finished for r in reqs):
            await asyncio.sleep(0.001)
        loop.cancel()
        return reqs

    return [((r.modelled_last_ms or 0) - (r.modelled_first_ms or 0)) / (tokens - 1) for r in asyncio.run(go())]


async def measured(url: str, prompts: list[str], tokens: int) -> list[float]:
    async def one(prompt: str) -> float:
        ex = await stream_chat(url, 300.0, model="spec-demo", prompt=prompt, max_tokens=tokens,
                               extra={"temperature": 0, "ignore_eos": True})
        completion = (ex.usage or {}).get("completion_tokens")
        assert not ex.error and completion == tokens and ex.times, (ex.error, completion)
        return (ex.times[-1] - ex.times[0]) * 1000 / (tokens - 1)

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median_ms": statistics.median(ordered), "p95_ms": ordered[int(0.95 * (len(ordered) - 1))]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "sim_streams.json")
    args = parser.parse_args()
    rows = article_rows("chat") + article_rows("code")
    prompts = [rows[i % len(rows)].prompt for i in range(args.streams)]
    results = {}
    for variant, extra in (("baseline", []), ("ngram", ["--speculative-config", json.dumps(
            {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4})])):
        argv = ["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096",
                "--max-num-seqs", str(args.streams), *extra]
        model = modelled(argv, prompts, args.tokens)
        url = f"http://127.0.0.1:{free_port()}"
        sim = Supervisor("sim", [sys.executable, "-m", "specwatch.cli", "sim", *argv, "--port", url.rsplit(":", 1)[1]],
                         Path(tempfile.gettempdir()) / f"bench-sim-streams-{variant}.log", url + "/health")
        with sim:
            client = asyncio.run(measured(url, prompts, args.tokens))
        m, c = summary(model), summary(client)
        median_ratio, p95_ratio = c["median_ms"] / m["median_ms"], c["p95_ms"] / m["p95_ms"]
        results[variant] = {"modelled": m, "measured": c, "median_ratio": median_ratio, "p95_ratio": p95_ratio}
        print(f"{variant:9s} {args.streams} streams x {args.tokens} tokens: TPOT median measured "
              f"{c['median_ms']:.2f} ms vs model {m['median_ms']:.2f} ms (ratio {median_ratio:.3f}),"
              f" p95 {c['p95_ms']:.2f} vs {m['p95_ms']:.2f} (ratio {p95_ratio:.3f})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"streams": args.streams, "tokens": args.tokens, "results": results}, indent=1))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
