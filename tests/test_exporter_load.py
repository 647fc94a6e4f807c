"""The exporter under 1,000 concurrent streams: every one relayed and counted, memory bounded."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import aiohttp

from tests.conftest import NGRAM_SIM_ARGS

STREAMS, TOKENS = 1000, 24


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def one_stream(session: aiohttp.ClientSession, url: str, i: int) -> int:
    body = {"model": "spec-demo", "messages": [{"role": "user", "content": f"Case {i}: explain queues."}],
            "max_tokens": TOKENS, "ignore_eos": True, "temperature": 0, "stream": True}
    completion = 0
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"X-Specwatch-Task": "chat"}) as resp:
        async for line in resp.content:
            if line.startswith(b"data: {"):
                completion += bool(json.loads(line[6:])["choices"])
    return completion


def test_a_thousand_concurrent_streams(sim_factory, service_factory):
    args = [a if a != "16" else "1024" for a in NGRAM_SIM_ARGS]  # --max-num-seqs 1024
    upstream = sim_factory([*args[:-1], "0.005"])
    tap = service_factory("exporter", ["--upstream", f"baseline={upstream.url}"])
    baseline_rss = rss_mib(tap.proc.pid)
    peak = [baseline_rss]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(rss_mib(tap.proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()

    async def run() -> list[int]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=300)) as session:
            return list(await asyncio.gather(*(one_stream(session, tap.url, i) for i in range(STREAMS))))

    try:
        chunks = asyncio.run(run())
    finally:
        done.set()
        sampler.join()
    assert all(c > 0 for c in chunks) and len(chunks) == STREAMS
    metrics = asyncio.run(_get(tap.url + "/metrics"))
    ok = [line for line in metrics.splitlines()
          if line.startswith('specwatch_requests_total{outcome="ok",task="chat",variant="baseline"}')]
    assert ok and float(ok[0].split()[-1]) == STREAMS
    print(f"exporter RSS {baseline_rss:.0f} MiB idle, {max(peak):.0f} MiB peak under {STREAMS} streams")
    assert max(peak) - baseline_rss < 150, f"RSS grew from {baseline_rss:.0f} to {max(peak):.0f} MiB"


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await resp.text()
