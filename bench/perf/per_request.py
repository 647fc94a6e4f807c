"""Per-request CPU of a proxy: a stub upstream with one content chunk and no delays, N requests sent
one at a time and N sent at once (a burst), the proxy's CPU time (utime+stime from /proc) per request.

Usage: python per_request.py [-n 2000] [--burst 64] [--burst-only] name=URL@PID[,PID] ...
Each request is the harness's streamed chat request (include_usage set, as proxy_bench sends it), over
the benches' shared client (sse_client.py). Prints, per mode, CPU µs per request for each PID (the
proxy, then the stub) and the client-seen TTFT (request written -> first content chunk).
--burst-only skips the one-at-a-time pass (a stub of long streams: 64 chunks 10 ms apart take 0.65 s each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from urllib.parse import urlsplit

from sse_client import HttpConn, chat_path, chat_request, connect

TICK = os.sysconf("SC_CLK_TCK")


def cpu(pid: int) -> float:
    total = 0.0
    for p in [pid, *_children(pid)]:
        try:
            with open(f"/proc/{p}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(f[11]) + int(f[12])) / TICK
    return total


def _children(pid: int) -> list[int]:
    try:
        kids = [int(x) for x in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


async def one(conn: HttpConn, payload: bytes) -> float:
    ex = await conn.request(payload, 60.0)
    if ex.error or ex.status != 200 or not ex.times:
        raise RuntimeError(ex.error or f"HTTP {ex.status}, {len(ex.times)} content chunks")
    return ex.times[0] - ex.t0


async def measure(url: str, pids: list[int], n: int, burst: int, burst_only: bool = False) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    payload = chat_request(host, port, chat_path(parts.path))
    conns = await asyncio.gather(*(connect(host, port) for _ in range(max(burst, 16))))
    await asyncio.gather(*(one(c, payload) for c in conns))  # warm: every connection has served one
    out: dict[str, object] = {}
    for mode in ((f"burst{burst}",) if burst_only else ("sequential", f"burst{burst}")):
        c0 = [cpu(p) for p in pids]
        t0 = time.perf_counter()
        ttfts: list[float] = []
        if mode == "sequential":
            for _ in range(n):
                ttfts.append(await one(conns[0], payload))
        else:
            for _ in range(n // burst):
                ttfts += await asyncio.gather(*(one(c, payload) for c in conns[:burst]))
        wall = time.perf_counter() - t0
        c1 = [cpu(p) for p in pids]
        out[mode] = {"cpu_us_per_req": [round((b - a) / len(ttfts) * 1e6, 1) for a, b in zip(c0, c1, strict=True)],
                     "ttft_ms_p50": round(statistics.median(ttfts) * 1e3, 3),
                     "ttft_ms_max": round(max(ttfts) * 1e3, 3), "wall_s": round(wall, 2), "n": len(ttfts)}
    for c in conns:
        c.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("target", nargs="+", metavar="name=URL@PID[,PID]")
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--burst", type=int, default=64)
    p.add_argument("--burst-only", action="store_true", help="no one-at-a-time pass")
    a = p.parse_args()
    for t in a.target:
        name, rest = t.split("=", 1)
        url, pids = rest.rsplit("@", 1)
        res = asyncio.run(measure(url, [int(x) for x in pids.split(",")], a.n, a.burst, a.burst_only))
        print(name, json.dumps(res))


if __name__ == "__main__":
    main()
