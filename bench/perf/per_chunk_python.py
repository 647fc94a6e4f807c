"""The tap's own Python per relayed content chunk, for two builds side by side in one run.

Feeds one framed vLLM content chunk (chunked transfer coding around one SSE event) to the relay's
upstream `Connection.data_received` again and again, with the tap's SSE relay and accounting behind
it and a transport that only counts writes: what one chunk costs in Python alone, with no socket,
event loop or kernel (those are the rest of a chunk's cost; see docs/benchmarks.md). Each build runs
in its own process (`PYTHONPATH` = its source folder, `PYTHONSAFEPATH=1`), the builds alternate for
`--repeats` rounds, and the median per build is reported with the ratio.

Usage: python bench/perf/per_chunk_python.py --build now=SRC --build before=SRC [--chunks 200000]
       [--repeats 5] [--chunk plain --chunk logprobs] [--out FILE.md]
A SRC folder holds the `specwatch` package (e.g. `git archive REV specwatch | tar -x -C SRC`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r'''
import asyncio, json, sys, time
import specwatch
from prometheus_client import CollectorRegistry
from specwatch.exporter import config as config_mod, upstream
from specwatch.exporter.accounting import RequestRecord
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.tap import SseRelay, UpstreamRequest

cfg = config_mod.load({"upstream": ["baseline=http://127.0.0.1:1"]}, None)
metrics = ExporterMetrics(CollectorRegistry(), cfg)
CHUNKS = {
    "plain": {"id": "chatcmpl-b8a1c0f3e0a54e7b9c3e2f1a0d9c8b7a", "object": "chat.completion.chunk",
              "created": 1764662400, "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
              "choices": [{"index": 0, "delta": {"content": " token"}, "logprobs": None, "finish_reason": None,
                           "token_ids": None}]},
    # as the real vLLM 0.32.0 CPU server streams a chat asked for logprobs and top_logprobs 2 (tests/fixtures)
    "logprobs": {"id": "chatcmpl-9726ec47ec644059", "object": "chat.completion.chunk", "created": 1796372699,
                 "model": "spec-demo",
                 "choices": [{"index": 0, "delta": {"content": " code"},
                              "logprobs": {"content": [{"token": " code", "logprob": -0.9353300333023071,
                                                        "bytes": [32, 99, 111, 100, 101],
                                                        "top_logprobs": [
                                                            {"token": " code", "logprob": -0.9353300333023071,
                                                             "bytes": [32, 99, 111, 100, 101]},
                                                            {"token": " function", "logprob": -1.5603300333023071,
                                                             "bytes": [32, 102, 117, 110, 99, 116, 105, 111, 110]}]}]},
                              "finish_reason": None, "token_ids": None}]},
}
event = b"data: " + json.dumps(CHUNKS[sys.argv[2]], separators=(",", ":")).encode() + b"\n\n"
framed = b"%x\r\n%b\r\n" % (len(event), event)


class Transport:
    writes = 0

    def write(self, data):
        self.writes += 1

    def is_closing(self):
        return False

    def get_write_buffer_size(self):
        return 0


transport = Transport()
conn = upstream.Connection(asyncio.new_event_loop())
conn._state = upstream._CHUNK_SIZE
record = RequestRecord(request_id="x", variant="baseline", task="other", path="/v1/chat/completions",
                       stream=True, greedy=False, single=True)
relay = SseRelay(UpstreamRequest(b"", {}, True, False), record, metrics)


def sink(chunk):  # the tap's sink and deliver, as _relay_direct writes them once the headers are out
    out = relay.feed(chunk)
    if out and not transport.is_closing():
        transport.write(b"%x\r\n%b\r\n" % (len(out), out))
        transport.get_write_buffer_size()


conn._sink = sink
n = int(sys.argv[1])
for _ in range(n // 10):
    conn.data_received(framed)  # warm-up
start = time.perf_counter()
for _ in range(n):
    conn.data_received(framed)
elapsed = time.perf_counter() - start
assert transport.writes == n + n // 10, transport.writes
print(json.dumps({"us_per_chunk": elapsed / n * 1e6, "package": specwatch.__file__}))
'''


def run_one(src: Path, chunks: int, kind: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONSAFEPATH": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(chunks), kind], env=env, cwd=src, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"per_chunk_python: the build in {src} failed:\n{done.stderr[-2000:]}")
    import json
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(result["package"]).startswith(str(src)):
        raise SystemExit(f"per_chunk_python: {src} imported specwatch from {result['package']}, not its own folder")
    return float(result["us_per_chunk"])


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="append", required=True, metavar="NAME=SRC")
    p.add_argument("--chunks", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunk", action="append", choices=("plain", "logprobs"),
                   help="the content chunk relayed (repeatable; default plain): an ordinary one, or one with "
                        "logprobs as the real server streams them (the tap parses those in full)")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    kinds = args.chunk or ["plain"]
    builds = {}
    for item in args.build:
        name, sep, src = item.partition("=")
        if not sep or not (Path(src) / "specwatch" / "__init__.py").is_file():
            p.error(f"--build {item}: expected NAME=SRC with SRC/specwatch/__init__.py")
        builds[name] = Path(src).resolve()
    runs: dict[str, list[float]] = {f"{name}, {kind}": [] for name in builds for kind in kinds}
    for _ in range(args.repeats):  # alternating, so a busy spell on the machine hits every build alike
        for name, src in builds.items():
            for kind in kinds:
                runs[f"{name}, {kind}"].append(run_one(src, args.chunks, kind))
    first = next(iter(runs))
    lines = [f"# The tap's Python per relayed content chunk ({args.chunks} chunks x {args.repeats} rounds, "
             f"alternating; Python {sys.version.split()[0]}, {os.cpu_count()} CPUs)", "",
             "| build, chunk | median us / chunk | runs | ratio to " + first + " |", "|---|---:|---|---:|"]
    base = statistics.median(runs[first])
    for name, values in runs.items():
        med = statistics.median(values)
        lines.append(f"| {name} | {med:.2f} | {', '.join(f'{v:.2f}' for v in values)} | {med / base:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
