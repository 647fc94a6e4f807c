"""Measures the latency and CPU that HTTP reverse proxies add to streamed (SSE) chat completions.

For each concurrency level C the client runs a closed loop (C connections, each sending the
next request as soon as its stream ends) against the DIRECT upstream and against every PROXY
in front of the same upstream. Paths are interleaved in rounds, in palindromic order
(D P1 P2 .. Pn, then Pn .. P2 P1 D), so slow drift of the machine cancels out of the
differences. Each block opens C fresh connections and primes each with one unrecorded max_tokens=1
request. Per request it records TTFT (request written -> first non-empty content chunk),
every gap between content chunks (ITL), TPOT and E2E (-> `data: [DONE]`).

Added latency = proxy percentile - direct percentile, over the pooled samples of all rounds;
the per-round spread of the paired p50 differences is kept as a noise indicator.
Proxy CPU = utime+stime from /proc/PID/stat summed over the proxy's process tree, read before
and after each of its own blocks, per 1,000 content chunks delivered. The client measures its
own CPU too: a block where it used more than --client-cpu-limit of a core is flagged, because
its timestamps are then delayed by its own work.

The HTTP/1.1 client is the benches' shared one (sse_client.py: a small asyncio Protocol, keep-alive,
chunked or length-delimited bodies) so the per-chunk cost of the measuring side stays low; uvloop is
used when installed.

--client-processes P (default 1: everything in this process, as before): the connections of each
block are split over P client processes forked at start-up (each with its own event loop, all on
the CPU set the parent inherited), so one process does not saturate at high concurrency. Each
process opens and primes its share; the parent reads /proc (proxy trees, machine) once all are
ready, starts them together, reads /proc again once all are done, then collects their samples
and merges them before the percentiles. Requests are split in proportion to the connections, and
each process runs its share closed-loop as one process would. The client CPU of a block is then
the sum over the processes (and the parent); a block is flagged when one process exceeded
--client-cpu-limit of a core.

Usage:
  proxy_bench.py --direct http://127.0.0.1:18001@PID nginx=http://127.0.0.1:18600@PID ...
                 [--concurrency 1,16,64] [--requests 1:100,16:480,64:960] [--rounds 4]
                 [--out-json r.json] [--out-md r.md] [--client-processes P]
Exit codes: 0 ok, 1 some requests failed or the run was cut short, 2 bad arguments.

Origin: ../shared/perf/proxy_bench.py (the issue 18 reference harness), brought into the repo as is.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import multiprocessing.connection
import os
import platform
import random
import signal
import sys
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple
from urllib.parse import urlsplit

from sse_client import PROMPT, Exchange, HttpConn, chat_path, chat_request, connect, perf_counter

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1

# ----------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Target:
    """One path to the upstream: the direct one or a proxy."""

    name: str
    url: str
    host: str
    port: int
    path: str
    pid: int | None

    @property
    def is_direct(self) -> bool:
        return self.name == "direct"


def parse_target(spec: str, default_name: str | None = None) -> Target:
    """`name=URL[@PID]` (or `URL[@PID]` when default_name is given) -> Target."""
    name = default_name
    if "=" in spec.split("://", 1)[0]:
        name, spec = spec.split("=", 1)
    if not name:
        raise ValueError(f"{spec!r}: expected name=URL[@PID]")
    pid = None
    if "@" in spec:
        url, tail = spec.rsplit("@", 1)
        if tail.isdigit():
            spec, pid = url, int(tail)
    parts = urlsplit(spec)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"{name}: {spec!r} is not an http://host:port[/prefix] URL")
    path = chat_path(parts.path)
    if pid is not None and not os.path.exists(f"/proc/{pid}/stat"):
        raise ValueError(f"{name}: no process with PID {pid}")
    return Target(name, spec, parts.hostname, parts.port or 80, path, pid)


# ----------------------------------------------------------------------------- /proc


def scan_procs() -> dict[int, tuple[int, int]]:
    """pid -> (ppid, utime+stime in ticks) for every process visible in /proc."""
    out: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw[raw.rfind(b")") + 2:].split()
        out[int(entry)] = (int(rest[1]), int(rest[11]) + int(rest[12]))
    return out


def tree_ticks(procs: dict[int, tuple[int, int]], root: int) -> dict[int, int]:
    """CPU ticks of root and all its descendants."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[int, int] = {}
    stack = [root] if root in procs else []
    while stack:
        pid = stack.pop()
        out[pid] = procs[pid][1]
        stack.extend(children.get(pid, ()))
    return out


def tree_delta_s(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds spent between two tree readings (new processes count in full)."""
    ticks = sum(t - before.get(pid, 0) for pid, t in after.items())
    return max(ticks, 0) / CLK_TCK


def machine_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return total - idle, total


def build_request(target: Target, args: argparse.Namespace, max_tokens: int = 0) -> bytes:
    return chat_request(target.host, target.port, target.path, model=args.model, prompt=args.prompt,
                        max_tokens=max_tokens, include_usage=not args.no_include_usage, api_key=args.api_key)


# ----------------------------------------------------------------------------- results


class Sample(NamedTuple):
    """What one request yielded, latencies in seconds; a plain tuple on the pipe from a client process."""

    ok: bool
    error: str
    ttft: float = 0.0
    e2e: float = 0.0
    tpot: float = 0.0
    gaps: tuple[float, ...] = ()
    chunks: int = 0
    crc: int = 0
    usage: bool = False
    spec: bool = False


def to_sample(ex: Exchange) -> Sample:
    if ex.error or ex.status != 200:
        msg = ex.error or f"HTTP {ex.status}: {ex.err_body[:200].decode('utf-8', 'replace')}"
        return Sample(False, msg, chunks=len(ex.times))
    if not ex.times:
        return Sample(False, "no content chunk in the stream")
    times = ex.times
    end = ex.t_done or ex.t_end
    gaps = tuple(b - a for a, b in zip(times, times[1:], strict=False))
    tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else 0.0
    return Sample(True, "" if ex.t_done else "no [DONE]", times[0] - ex.t0, end - ex.t0, tpot,
                  gaps, len(times), zlib.crc32("".join(ex.parts).encode()), bool(ex.usage), ex.spec)


@dataclass
class Block:
    """One closed-loop block of requests on one path, with resource readings."""

    path: str
    round: int
    samples: list[Sample]
    wall_s: float
    client_cpu_s: float
    machine_busy_cores: float
    cpu_s: dict[str, float]  # tree CPU seconds per monitored process (proxies, direct)
    monitored_cpu_s: float  # the same, each process tree counted once
    cut_short: bool = False
    client_proc_max_s: float | None = None  # --client-processes > 1: the busiest client process

    @property
    def foreign_cores(self) -> float:
        """Machine CPU not used by the client or any monitored process (other workloads)."""
        if not self.wall_s:
            return 0.0
        ours = (self.client_cpu_s + self.monitored_cpu_s) / self.wall_s
        return max(self.machine_busy_cores - ours, 0.0)

    @property
    def chunks(self) -> int:
        return sum(s.chunks for s in self.samples if s.ok)


def pct(values: list[float], p: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def dist(values: list[float]) -> dict[str, float | None]:
    """p50/p95/p99/mean in milliseconds."""
    ms = lambda x: None if x is None else round(x * 1000, 4)  # noqa: E731
    return {"p50": ms(pct(values, 50)), "p95": ms(pct(values, 95)), "p99": ms(pct(values, 99)),
            "mean": ms(sum(values) / len(values)) if values else None, "n": len(values)}


# ----------------------------------------------------------------------------- runner


def closed_loop(target: Target, conns: list[HttpConn], payload: bytes, n: int, timeout: float,
                stagger: float, rng: random.Random, samples: list[Sample]) -> asyncio.Future:
    """n requests over conns, each connection sending its next request when its stream ends."""
    remaining = n

    async def worker(conn: HttpConn) -> None:
        nonlocal remaining
        if stagger:  # desynchronise the loop: a random start within one stagger period
            await asyncio.sleep(rng.uniform(0.0, stagger))
        first = True
        while remaining > 0:
            remaining -= 1
            if stagger and not first:  # and a short random think time, so streams do not re-align
                await asyncio.sleep(rng.uniform(0.0, stagger / 10))
            first = False
            if conn.closed:
                try:
                    conn = await connect(target.host, target.port)
                except (TimeoutError, OSError) as exc:
                    samples.append(Sample(False, f"connect: {exc!r}"))
                    continue
            samples.append(to_sample(await conn.request(payload, timeout)))

    return asyncio.gather(*(worker(c) for c in conns))


# ---- --client-processes: a pool of forked client processes, driven over pipes

async def pipe_recv(conn: multiprocessing.connection.Connection) -> tuple:
    """The next message on a pipe, without blocking the event loop while waiting for it."""
    if not conn.poll():
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        fd = conn.fileno()

        def readable() -> None:
            if not fut.done():
                fut.set_result(None)

        loop.add_reader(fd, readable)
        try:
            await fut
        finally:
            loop.remove_reader(fd)
            os.set_blocking(fd, True)  # uvloop's add_reader made it non-blocking; recv/send block
    return conn.recv()


def split_shares(nconn: int, n: int, procs: int) -> list[tuple[int, int]]:
    """(connections, requests) per process: connections as even as possible, requests in
    proportion to them (the remainder one each to the first processes with connections)."""
    conns = [nconn // procs + (1 if i < nconn % procs else 0) for i in range(procs)]
    reqs = [n * c // nconn if nconn else 0 for c in conns]
    left = n - sum(reqs)
    for i, c in enumerate(conns):
        if left <= 0:
            break
        if c:
            reqs[i] += 1
            left -= 1
    return list(zip(conns, reqs, strict=True))


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (best effort)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def client_proc_main(pipe: multiprocessing.connection.Connection, index: int,
                     args: argparse.Namespace,
                     inherited: list[multiprocessing.connection.Connection]) -> None:
    """Entry point of client process `index` (forked before the parent's event loop started)."""
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles ^C and stops us
    for other in inherited:
        other.close()
    asyncio.run(client_proc_loop(pipe, index, args))


async def client_proc_loop(pipe: multiprocessing.connection.Connection, index: int,
                           args: argparse.Namespace) -> None:
    targets = {t.name: t for t in args.targets}
    payloads = {t.name: build_request(t, args, args.max_tokens) for t in args.targets}
    primes = {t.name: build_request(t, args, 1) for t in args.targets}
    timeout = args.timeout_s
    stagger = args.stagger_ms / 1000.0
    while True:
        try:
            msg = await pipe_recv(pipe)
        except EOFError:
            return
        if msg[0] != "block":
            return  # "stop"
        _, name, nconn, n, rnd, conc = msg
        target = targets[name]
        conns: list[HttpConn] = []
        try:
            for c in await asyncio.gather(*(connect(target.host, target.port) for _ in range(nconn)),
                                          return_exceptions=True):
                if isinstance(c, BaseException):
                    raise c
                conns.append(c)
            if not args.no_prime:
                await asyncio.gather(*(c.request(primes[name], timeout) for c in conns))
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            for c in conns:
                c.close()
            pipe.send(("error", f"client process {index}: {exc!r}"))
            continue
        gc.collect()
        gc.disable()
        pipe.send(("ready",))
        msg = await pipe_recv(pipe)
        if msg[0] != "go":  # "abort": another process failed to connect
            gc.enable()
            for c in conns:
                c.close()
            continue
        budget = msg[1]
        samples: list[Sample] = []
        rng = random.Random((rnd * 7919 + conc) * 1009 + index)
        cpu0, w0 = time.process_time(), perf_counter()
        cut = False
        try:
            await asyncio.wait_for(closed_loop(target, conns, payloads[name], n, timeout, stagger,
                                               rng, samples), budget)
        except TimeoutError:
            cut = True
        w1, cpu1 = perf_counter(), time.process_time()
        pipe.send(("done", cpu1 - cpu0, w1 - w0, cut))
        gc.enable()
        await pipe_recv(pipe)  # "collect": the parent has read /proc
        for c in conns:
            c.close()
        pipe.send(("samples", [tuple(s) for s in samples]))


class ClientPool:
    """P client processes, forked before any event loop runs; the parent only coordinates."""

    def __init__(self, args: argparse.Namespace, procs: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self.pipes: list[multiprocessing.connection.Connection] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        sys.stdout.flush()
        sys.stderr.flush()
        for i in range(procs):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=client_proc_main, name=f"proxy_bench-client-{i}",
                               args=(theirs, i, args, [*self.pipes, mine]), daemon=True)
            proc.start()
            theirs.close()
            self.pipes.append(mine)
            self.procs.append(proc)
        self.pids = [p.pid for p in self.procs if p.pid]

    def check(self) -> None:
        dead = [p for p in self.procs if not p.is_alive()]
        if dead:
            raise RuntimeError(f"client process {dead[0].name} exited ({dead[0].exitcode})")

    def close(self) -> None:
        for pipe in self.pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(2)


class Window:
    """The measured span of one block, garbage collection off inside it: from /proc, each monitored
    proxy's process-tree CPU and the machine's busy share; this process's CPU; the wall time."""

    def __init__(self, monitored: dict[str, int]) -> None:
        self.monitored = monitored
        gc.collect()
        gc.disable()
        procs = scan_procs()
        self.trees0 = {name: tree_ticks(procs, pid) for name, pid in monitored.items()}
        self.busy0 = machine_busy()
        self.cpu0, self.w0 = time.process_time(), perf_counter()

    def close(self) -> tuple[float, float, float, dict[str, float], float]:
        """Wall s, this process's CPU s, busy cores, CPU s per monitored name, and their sum counting each
        process tree once (two names may watch one PID)."""
        w1, cpu1 = perf_counter(), time.process_time()
        busy1 = machine_busy()
        procs1 = scan_procs()
        gc.enable()
        cpu_s = {name: tree_delta_s(self.trees0[name], tree_ticks(procs1, pid))
                 for name, pid in self.monitored.items()}
        once = {pid: name for name, pid in self.monitored.items()}
        db, dt = busy1[0] - self.busy0[0], busy1[1] - self.busy0[1]
        return (w1 - self.w0, cpu1 - self.cpu0, NCPU * db / dt if dt else 0.0, cpu_s,
                sum(cpu_s[name] for name in once.values()))


class Bench:
    def __init__(self, args: argparse.Namespace, targets: list[Target],
                 pool: ClientPool | None = None) -> None:
        self.args = args
        self.pool = pool
        self.targets = targets
        self.payload = {t.name: build_request(t, args, args.max_tokens) for t in targets}
        self.prime = {t.name: build_request(t, args, 1) for t in targets}
        self.monitored = {t.name: t.pid for t in targets if t.pid}
        self.deadline = time.monotonic() + args.max_seconds
        self.cut_short = False
        self.quiet_wait_left = args.quiet_wait_s
        self.quiet_waited = 0.0

    async def foreign_now(self, probe_s: float = 0.5) -> float:
        """Cores used by processes other than ours over a short probe (we are idle now)."""
        w0, procs0, busy0, cpu0 = perf_counter(), scan_procs(), machine_busy(), \
            time.process_time()
        await asyncio.sleep(probe_s)
        w1, procs1, busy1, cpu1 = perf_counter(), scan_procs(), machine_busy(), \
            time.process_time()
        ours = cpu1 - cpu0
        for pid in set(self.monitored.values()) | set(self.pool.pids if self.pool else ()):
            ours += tree_delta_s(tree_ticks(procs0, pid), tree_ticks(procs1, pid))
        db, dt = busy1[0] - busy0[0], busy1[1] - busy0[1]
        busy_cores = NCPU * db / dt if dt else 0.0
        return max(busy_cores - ours / (w1 - w0), 0.0)

    async def wait_quiet(self) -> None:
        """Hold the next round while other workloads load the machine (bounded in total)."""
        limit = self.args.quiet_below
        if limit <= 0:
            return
        t0 = time.monotonic()
        load = await self.foreign_now()
        if load > limit and self.quiet_wait_left > 0:
            log(f"  other workloads use {load:.2f} cores; waiting up to "
                f"{self.quiet_wait_left:.0f} s for < {limit}")
        while load > limit and self.quiet_wait_left - (time.monotonic() - t0) > 0 \
                and self.time_left() > 60:
            await asyncio.sleep(1.0)
            load = await self.foreign_now()
        waited = time.monotonic() - t0
        self.quiet_wait_left -= waited
        self.quiet_waited += waited

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    async def block(self, target: Target, conc: int, n: int, rnd: int) -> Block:
        if self.pool is not None:
            return await self.block_pool(target, conc, n, rnd)
        conns = await asyncio.gather(*(connect(target.host, target.port) for _ in range(min(conc, n))))
        payload = self.payload[target.name]
        timeout = self.args.timeout_s
        if not self.args.no_prime:
            # One short unrecorded request per fresh connection, so per-connection set-up
            # in the server under test (or the upstream, on the direct path) stays out of
            # the timed window.
            prime = self.prime[target.name]
            await asyncio.gather(*(c.request(prime, timeout) for c in conns))
        samples: list[Sample] = []
        stagger = self.args.stagger_ms / 1000.0
        rng = random.Random(rnd * 7919 + conc)

        window = Window(self.monitored)
        cut = False
        try:
            budget = max(self.time_left(), 1.0)
            await asyncio.wait_for(closed_loop(target, conns, payload, n, timeout, stagger, rng,
                                               samples), budget)
        except TimeoutError:
            cut = True
        wall, own, busy, cpu_s, proxies = window.close()
        for c in conns:
            c.close()
        return Block(target.name, rnd, samples, wall, own, busy, cpu_s, proxies, cut)

    async def block_pool(self, target: Target, conc: int, n: int, rnd: int) -> Block:
        """block(), its connections and requests split over the client processes."""
        assert self.pool is not None
        self.pool.check()
        shares = split_shares(min(conc, n), n, len(self.pool.pipes))
        active = [(pipe, c, k) for pipe, (c, k) in zip(self.pool.pipes, shares, strict=True)
                  if c]
        for pipe, c, k in active:
            pipe.send(("block", target.name, c, k, rnd, conc))
        replies = await asyncio.gather(*(pipe_recv(pipe) for pipe, _, _ in active))
        errors = [r[1] for r in replies if r[0] == "error"]
        if errors:
            for (pipe, _, _), r in zip(active, replies, strict=True):
                if r[0] == "ready":
                    pipe.send(("abort",))
            raise OSError(errors[0])
        window = Window(self.monitored)
        budget = max(self.time_left(), 1.0)
        for pipe, _, _ in active:
            pipe.send(("go", budget))
        dones = await asyncio.gather(*(pipe_recv(pipe) for pipe, _, _ in active))
        wall, own, busy, cpu_s, proxies = window.close()
        for pipe, _, _ in active:
            pipe.send(("collect",))
        samples = [Sample(*t) for r in await asyncio.gather(*(pipe_recv(pipe)
                                                              for pipe, _, _ in active))
                   for t in r[1]]
        return Block(target.name, rnd, samples, wall, own + sum(d[1] for d in dones), busy, cpu_s, proxies,
                     any(d[3] for d in dones), max([own] + [d[1] for d in dones]))

    async def level(self, conc: int, requests: int) -> dict:
        a = self.args
        log(f"level C={conc}: warm-up ({a.warmup} request(s) per connection per path)")
        wave: dict[str, float] = {}
        for t in self.targets:
            b = await self.block(t, conc, conc * a.warmup, -1)
            bad = [s.error for s in b.samples if not s.ok]
            if bad:
                log(f"  warm-up {t.name}: {len(bad)} failed, first: {bad[0]}")
            wave[t.name] = b.wall_s / a.warmup
        planned = requests
        projected = sum(requests / conc * w for w in wave.values())
        budget = min(a.level_budget_s, max(self.time_left() - 5, 1.0))
        if projected > budget:
            per_req = sum(w / conc for w in wave.values())
            fit = int(budget / per_req)
            unit = a.rounds * conc if fit >= a.rounds * conc else a.rounds
            requests = max(a.rounds, fit // unit * unit)
            log(f"  projected {projected:.0f} s > budget {budget:.0f} s: R {planned} -> {requests}")
        sizes = [requests // a.rounds + (1 if i < requests % a.rounds else 0)
                 for i in range(a.rounds)]
        blocks: list[Block] = []
        for rnd, size in enumerate(sizes):
            if size == 0:
                continue
            order = self.targets if rnd % 2 == 0 else self.targets[::-1]
            need = sum(size / conc * wave[t.name] for t in order)
            if rnd > 0 and need > self.time_left():
                log(f"  stopping after {rnd} round(s): {need:.0f} s needed, "
                    f"{self.time_left():.0f} s left")
                self.cut_short = True
                break
            await self.wait_quiet()
            for t in order:
                b = await self.block(t, conc, size, rnd)
                blocks.append(b)
                self.cut_short |= b.cut_short
            log(f"  round {rnd + 1}/{a.rounds} done ({size} requests per path)")
        return self.summarize(conc, planned, blocks, wave)

    def summarize(self, conc: int, planned: int, blocks: list[Block],
                  wave: dict[str, float]) -> dict:
        lim = self.args.client_cpu_limit
        paths: dict[str, dict] = {}
        direct_crc = Counter(s.crc for b in blocks if b.path == "direct"
                             for s in b.samples if s.ok).most_common(1)
        ref_crc = direct_crc[0][0] if direct_crc else None
        for t in self.targets:
            own = [b for b in blocks if b.path == t.name]
            ok = [s for b in own for s in b.samples if s.ok]
            errs = [s.error for b in own for s in b.samples if not s.ok]
            warn = Counter(s.error for s in ok if s.error)
            chunks = sum(b.chunks for b in own)
            wall = sum(b.wall_s for b in own)
            entry: dict = {
                "requests": sum(len(b.samples) for b in own), "ok": len(ok),
                "errors": len(errs), "error_examples": sorted(set(errs))[:3],
                "warnings": dict(warn), "chunks": chunks,
                "ttft_ms": dist([s.ttft for s in ok]),
                "itl_ms": dist([g for s in ok for g in s.gaps]),
                "tpot_ms": dist([s.tpot for s in ok]),
                "e2e_ms": dist([s.e2e for s in ok]),
                "content_mismatch": sum(1 for s in ok if s.crc != ref_crc),
                "usage_chunk_frac": round(sum(s.usage for s in ok) / len(ok), 4) if ok else None,
                "spec_metrics_frac": round(sum(s.spec for s in ok) / len(ok), 4) if ok else None,
                "wall_s": round(wall, 3),
                "warmup_wave_s": round(wave[t.name], 4),
                "client_cpu_frac": round(sum(b.client_cpu_s for b in own) / wall, 4)
                if wall else None,
                "client_cpu_frac_max_block": round(max((b.client_cpu_s / b.wall_s for b in own
                                                        if b.wall_s), default=0), 4),
                "machine_busy_cores": round(sum(b.machine_busy_cores * b.wall_s for b in own)
                                            / wall, 3) if wall else None,
                "foreign_cores": round(sum(b.foreign_cores * b.wall_s for b in own) / wall, 3)
                if wall else None,
                "foreign_cores_max_block": round(max((b.foreign_cores for b in own), default=0),
                                                 3),
                "rounds": [{"round": b.round, "requests": len(b.samples), "wall_s":
                            round(b.wall_s, 3),
                            "ttft_p50_ms": dist([s.ttft for s in b.samples if s.ok])["p50"],
                            "ttft_p99_ms": dist([s.ttft for s in b.samples if s.ok])["p99"],
                            "itl_p50_ms": dist([g for s in b.samples if s.ok
                                                for g in s.gaps])["p50"],
                            "e2e_p50_ms": dist([s.e2e for s in b.samples if s.ok])["p50"],
                            "client_cpu_frac": round(b.client_cpu_s / b.wall_s, 4)
                            if b.wall_s else None,
                            "machine_busy_cores": round(b.machine_busy_cores, 3),
                            "foreign_cores": round(b.foreign_cores, 3)}
                           for b in own],
            }
            if self.pool is not None:
                entry["client_cpu_frac_max_proc"] = round(max(
                    (b.client_proc_max_s / b.wall_s for b in own
                     if b.wall_s and b.client_proc_max_s is not None), default=0), 4)
                entry["client_suspect"] = entry["client_cpu_frac_max_proc"] > lim
            else:
                entry["client_suspect"] = entry["client_cpu_frac_max_block"] > lim
            if t.pid:
                cpu = sum(b.cpu_s[t.name] for b in own)
                others = [b for b in blocks if b.path != t.name]
                other_wall = sum(b.wall_s for b in others)
                entry["cpu"] = {
                    "cpu_s": round(cpu, 3),
                    "cpu_s_per_1k_chunks": round(cpu / chunks * 1000, 4) if chunks else None,
                    "chunks_per_cpu_s": round(chunks / cpu) if cpu else None,
                    "cores_used": round(cpu / wall, 3) if wall else None,
                    "idle_cores_used": None if t.is_direct or not other_wall else
                    round(sum(b.cpu_s[t.name] for b in others) / other_wall, 4),
                }
            if "direct" in self.monitored:
                up = sum(b.cpu_s["direct"] for b in own)
                entry["upstream_cpu_s_per_1k_chunks"] = round(up / chunks * 1000, 4) \
                    if chunks else None
            paths[t.name] = entry
        d = paths.get("direct")
        for t in self.targets:
            if t.is_direct or d is None:
                continue
            p = paths[t.name]
            added = {}
            for key, metric, q in (("ttft_p50_ms", "ttft_ms", "p50"),
                                   ("ttft_p99_ms", "ttft_ms", "p99"),
                                   ("itl_p50_ms", "itl_ms", "p50"),
                                   ("itl_p99_ms", "itl_ms", "p99"),
                                   ("tpot_p50_ms", "tpot_ms", "p50"),
                                   ("e2e_p50_ms", "e2e_ms", "p50"),
                                   ("e2e_p99_ms", "e2e_ms", "p99")):
                pv, dv = p[metric][q], d[metric][q]
                added[key] = None if pv is None or dv is None else round(pv - dv, 4)
            spread = {}
            for key in ("ttft_p50_ms", "itl_p50_ms", "e2e_p50_ms"):
                diffs = []
                for pr in p["rounds"]:
                    dr = next((x for x in d["rounds"] if x["round"] == pr["round"]), None)
                    if dr and pr[key] is not None and dr[key] is not None:
                        diffs.append(pr[key] - dr[key])
                spread[key] = [round(min(diffs), 4), round(max(diffs), 4)] if diffs else None
            added["per_round_range"] = spread
            p["added"] = added
        return {"concurrency": conc, "requests_planned": planned,
                "requests_per_path": paths["direct"]["requests"] if d else None,
                "paths": paths}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- report


def fmt(v: float | None, digits: int = 2, signed: bool = False) -> str:
    if v is None:
        return "n/a"
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def markdown(result: dict) -> str:
    cfg = result["config"]
    lim = cfg["client_cpu_limit"]
    lines = [f"# Proxy overhead on streamed chat completions ({result['started']})", "",
             f"Upstream: `{cfg['direct']}` ({cfg['upstream_desc']}). Client: closed loop"
             + (f" staggered (start 0..{cfg['stagger_ms']:g} ms, think 0..{cfg['stagger_ms'] / 10:g} ms)"
                if cfg.get("stagger_ms") else " (lock-step)") + ", "
             + (f"{cfg['client_processes']} client processes, " if cfg.get("client_processes")
                else "")
             + f"{cfg['rounds']} interleaved rounds per level (palindromic order), "
             f"loop={result['env']['loop']}, {result['env']['ncpu']} CPUs, "
             f"wall {result['wall_s']:.0f} s.", "",
             "## Added latency (proxy minus direct, ms) and proxy CPU", "",
             "| proxy | C | R | +TTFT p50 | +TTFT p99 | +ITL p50 | +TPOT p50 | +E2E p50 | "
             "CPU s / 1k chunks | chunks / CPU-s | proxy cores | errors | client CPU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in result["levels"]:
        d_foreign = lv["paths"].get("direct", {}).get("foreign_cores_max_block", 0.0)
        for name, p in lv["paths"].items():
            if name == "direct":
                continue
            a, cpu = p.get("added", {}), p.get("cpu", {})
            flag = " ⚠" if p["client_suspect"] else ""
            label = f"{name} (A/A noise)" if name == "direct-aa" else name
            if max(p["foreign_cores_max_block"], d_foreign) > 0.5:
                label += " ⚑"
            lines.append(
                f"| {label} | {lv['concurrency']} | {p['requests']} | "
                f"{fmt(a.get('ttft_p50_ms'), signed=True)} | "
                f"{fmt(a.get('ttft_p99_ms'), signed=True)} | "
                f"{fmt(a.get('itl_p50_ms'), 3, True)} | {fmt(a.get('tpot_p50_ms'), 3, True)} | "
                f"{fmt(a.get('e2e_p50_ms'), signed=True)} | "
                f"{fmt(cpu.get('cpu_s_per_1k_chunks'), 3)} | {cpu.get('chunks_per_cpu_s', 'n/a')}"
                f" | {fmt(cpu.get('cores_used'), 2)} | {p['errors']} | "
                f"{p['client_cpu_frac_max_block'] * 100:.0f}%{flag} |")
    lines += ["", "## Absolute latency per path (ms)", "",
              "| path | C | R ok | TTFT p50 | TTFT p95 | TTFT p99 | ITL p50 | ITL p95 | ITL p99 "
              "| E2E p50 | E2E p99 | busy cores | foreign cores | client CPU mean / max |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in result["levels"]:
        for name, p in lv["paths"].items():
            t, i, e = p["ttft_ms"], p["itl_ms"], p["e2e_ms"]
            lines.append(
                f"| {name} | {lv['concurrency']} | {p['ok']} | {fmt(t['p50'])} | {fmt(t['p95'])}"
                f" | {fmt(t['p99'])} | {fmt(i['p50'], 3)} | {fmt(i['p95'], 3)} | "
                f"{fmt(i['p99'], 3)} | {fmt(e['p50'])} | {fmt(e['p99'])} | "
                f"{fmt(p['machine_busy_cores'])} | {fmt(p['foreign_cores'])} | "
                f"{p['client_cpu_frac'] * 100:.0f}% / "
                f"{p['client_cpu_frac_max_block'] * 100:.0f}% |")
    lines += ["", "## Noise and integrity", "",
              "| proxy | C | per-round +TTFT p50 range | per-round +ITL p50 range | "
              "content mismatches | usage chunk | spec metrics | upstream CPU s / 1k | "
              "proxy idle cores |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for lv in result["levels"]:
        for name, p in lv["paths"].items():
            rr = p.get("added", {}).get("per_round_range", {})
            rng = lambda r: "n/a" if not r else f"{r[0]:+.2f} .. {r[1]:+.2f}"  # noqa: E731
            lines.append(
                f"| {name} | {lv['concurrency']} | {rng(rr.get('ttft_p50_ms'))} | "
                f"{rng(rr.get('itl_p50_ms'))} | {p['content_mismatch']} | "
                f"{fmt(p['usage_chunk_frac'])} | {fmt(p['spec_metrics_frac'])} | "
                f"{fmt(p.get('upstream_cpu_s_per_1k_chunks'), 3)} | "
                f"{fmt(p.get('cpu', {}).get('idle_cores_used'), 3)} |")
    notes = ["", "## Notes", "",
             "- Chunks = non-empty content chunks received by the client; each request also "
             "carries a role, finish and usage chunk and `[DONE]`, and proxy CPU includes "
             "per-request work (accept, routing, headers). CPU comes from /proc/PID/stat "
             f"(utime+stime, {CLK_TCK} ticks/s) summed over the proxy's process tree.",
             "- ITL = every gap between content chunks as received; a proxy that falls behind "
             "delivers chunks in bursts, which lowers the ITL median while TPOT ((last - first "
             "content chunk) / (n - 1) per request) and E2E rise. Read +ITL p50 together with "
             "+TPOT p50.",
             "- direct-aa (when present) is the direct path measured again as if it were a "
             "proxy: its 'added' values show the noise floor of the method on this machine.",
             (f"- Client CPU is the harness's own process over each block; ⚠ marks a level where "
              f"a block exceeded {lim:.0%} of a core, and its latencies are suspect."
              if not cfg.get("client_processes") else
              f"- Client CPU is the harness's {cfg['client_processes']} client processes (and their "
              f"parent) over each block, summed (100% = one core); ⚠ marks a level where one "
              f"process exceeded {lim:.0%} of a core in a block, and its latencies are suspect."),
             "- busy cores = whole-machine CPU use during the path's blocks (of "
             f"{result['env']['ncpu']}); stub, proxy and client share these cores. foreign "
             "cores = the part used by none of them (other workloads on the machine); "
             "blocks with foreign load have noisier latencies. ⚑ marks a row where a block of "
             "the proxy or of direct saw more than 0.5 foreign cores."]
    for lv in result["levels"]:
        if lv["requests_per_path"] is not None and lv["requests_per_path"] < lv["requests_planned"]:
            notes.append(f"- C={lv['concurrency']}: R reduced from {lv['requests_planned']} to "
                         f"{lv['requests_per_path']} to fit the time budget.")
        for name, p in lv["paths"].items():
            if p["client_suspect"] and "client_cpu_frac_max_proc" in p:
                notes.append(f"- C={lv['concurrency']} {name}: a client process used "
                             f"{p['client_cpu_frac_max_proc']:.0%} of a core in a block "
                             f"(> {lim:.0%}); numbers at this level are suspect.")
            elif p["client_suspect"]:
                notes.append(f"- C={lv['concurrency']} {name}: client used "
                             f"{p['client_cpu_frac_max_block']:.0%} of a core in a block "
                             f"(> {lim:.0%}); numbers at this level are suspect.")
            if p["foreign_cores_max_block"] > 0.5:
                notes.append(f"- C={lv['concurrency']} {name}: other workloads used up to "
                             f"{p['foreign_cores_max_block']:.2f} cores during a block.")
            if p["errors"]:
                notes.append(f"- C={lv['concurrency']} {name}: {p['errors']} failed requests, "
                             f"e.g. {p['error_examples'][0]}")
    if result.get("quiet_waited_s"):
        notes.append(f"- The run waited {result['quiet_waited_s']:.0f} s in total for other "
                     f"workloads to drop below {cfg['quiet_below_cores']} cores before rounds.")
    if result["cut_short"]:
        notes.append("- The run hit --max-seconds and was cut short.")
    return "\n".join(lines + notes) + "\n"


# ----------------------------------------------------------------------------- main


def parse_requests(spec: str, levels: list[int]) -> dict[int, int]:
    if ":" not in spec:
        return {c: int(spec) for c in levels}
    out = {}
    for part in spec.split(","):
        c, _, r = part.partition(":")
        out[int(c)] = int(r)
    missing = [c for c in levels if c not in out]
    if missing:
        raise ValueError(f"--requests has no count for concurrency {missing}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("proxies", nargs="*", metavar="name=URL[@PID]", help="proxies to measure")
    p.add_argument("--proxy", action="append", default=[], metavar="name=URL[@PID]")
    p.add_argument("--direct", required=True, metavar="URL[@PID]", help="the upstream itself")
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument("--requests", default="1:100,16:480,64:960",
                   help="R per path per level: N or C:N,C:N,...")
    p.add_argument("--rounds", type=int, default=4, help="interleaved rounds per level")
    p.add_argument("--warmup", type=int, default=1,
                   help="unrecorded requests per connection per path before each level")
    p.add_argument("--timeout-s", type=float, default=60.0, help="per request")
    p.add_argument("--level-budget-s", type=float, default=300.0,
                   help="R is reduced when a level is projected to take longer")
    p.add_argument("--max-seconds", type=float, default=840.0, help="hard bound on the run")
    p.add_argument("--client-cpu-limit", type=float, default=0.70,
                   help="fraction of a core above which the client is flagged")
    p.add_argument("--model", default="stub-model")
    p.add_argument("--prompt", default=PROMPT)
    p.add_argument("--max-tokens", type=int, default=0, help="sent as max_tokens when > 0")
    p.add_argument("--no-include-usage", action="store_true")
    p.add_argument("--api-key", default=os.environ.get("PROXY_BENCH_API_KEY", ""),
                   help="sent as a Bearer token to every path (default $PROXY_BENCH_API_KEY)")
    p.add_argument("--upstream-desc", default="", help="free text for the report header")
    p.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE",
                   help="recorded in the JSON (e.g. versions)")
    p.add_argument("--out-json", default="")
    p.add_argument("--out-md", default="")
    p.add_argument("--quiet-below", type=float, default=0.0, metavar="CORES",
                   help="before each round, wait while other processes use more than CORES "
                        "(0 = never wait)")
    p.add_argument("--quiet-wait-s", type=float, default=180.0,
                   help="total seconds the run may spend waiting for --quiet-below")
    p.add_argument("--no-prime", action="store_true",
                   help="skip the unrecorded max_tokens=1 request on each new connection")
    p.add_argument("--aa", action="store_true",
                   help="also measure the direct URL as if it were a proxy ('direct-aa'): "
                        "its 'added' numbers are the noise floor of the method")
    p.add_argument("--no-uvloop", action="store_true")
    p.add_argument("--stagger-ms", type=float, default=0.0, metavar="MS",
                   help="desynchronise the closed loop: each connection starts after a random 0..MS ms "
                        "and waits a random 0..MS/10 ms before each later request (0: lock-step, the default)")
    p.add_argument("--client-processes", type=int, default=1, metavar="P",
                   help="split each block's connections over P forked client processes "
                        "(default 1: all in this process)")
    args = p.parse_args(argv)
    try:
        args.levels = [int(c) for c in args.concurrency.split(",")]
        args.per_level = parse_requests(args.requests, args.levels)
        direct = parse_target(args.direct, "direct")
        args.targets = [direct] + [parse_target(s) for s in args.proxy + args.proxies]
        if args.aa:
            args.targets.insert(1, Target("direct-aa", direct.url, direct.host, direct.port,
                                          direct.path, None))
    except ValueError as exc:
        p.error(str(exc))
    names = [t.name for t in args.targets]
    if len(set(names)) != len(names):
        p.error(f"path names must be unique, got {names}")
    if args.rounds < 1 or min(args.levels) < 1 or args.warmup < 1 or args.client_processes < 1:
        p.error("--rounds, --warmup, --client-processes and every concurrency must be >= 1")
    return args


async def run(args: argparse.Namespace, loop_name: str, pool: ClientPool | None = None) -> dict:
    bench = Bench(args, args.targets, pool)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.monotonic()
    result: dict = {
        "started": started, "levels": [], "cut_short": False,
        "config": {"direct": args.targets[0].url, "proxies": {t.name: t.url for t in
                                                               args.targets[1:]},
                   "pids": {t.name: t.pid for t in args.targets},
                   "concurrency": args.levels, "requests": args.per_level,
                   "rounds": args.rounds, "warmup": args.warmup,
                   "include_usage": not args.no_include_usage, "max_tokens": args.max_tokens,
                   "primed_connections": not args.no_prime,
                   "quiet_below_cores": args.quiet_below,
                   "client_cpu_limit": args.client_cpu_limit,
                   "upstream_desc": args.upstream_desc or "stub", "stagger_ms": args.stagger_ms},
        "env": {"python": platform.python_version(), "loop": loop_name, "ncpu": NCPU,
                "kernel": platform.release(), "clk_tck": CLK_TCK},
        "meta": dict(m.split("=", 1) for m in args.meta if "=" in m),
    }
    if pool is not None:
        result["config"]["client_processes"] = len(pool.pipes)
    for conc in args.levels:
        if bench.time_left() < 10:
            log(f"skipping C={conc}: out of time")
            bench.cut_short = True
            continue
        result["levels"].append(await bench.level(conc, args.per_level[conc]))
        result["cut_short"] = bench.cut_short
        result["wall_s"] = round(time.monotonic() - t0, 1)
        result["quiet_waited_s"] = round(bench.quiet_waited, 1)
        write_outputs(args, result)  # after every level, so a crash loses little
    result["wall_s"] = round(time.monotonic() - t0, 1)
    result["cut_short"] = bench.cut_short
    result["quiet_waited_s"] = round(bench.quiet_waited, 1)
    write_outputs(args, result)
    return result


def write_outputs(args: argparse.Namespace, result: dict) -> None:
    if args.out_json:
        tmp = args.out_json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, args.out_json)
    if args.out_md and result["levels"]:
        with open(args.out_md, "w") as f:
            f.write(markdown(result))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loop_name = "asyncio"
    if not args.no_uvloop:
        try:
            import uvloop
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
            loop_name = f"uvloop {uvloop.__version__}"
        except ImportError:
            pass
    pool = ClientPool(args, args.client_processes) if args.client_processes > 1 else None
    try:
        result = asyncio.run(run(args, loop_name, pool))
    finally:
        if pool is not None:
            pool.close()
    if result["levels"]:
        print(markdown(result))
    failed = any(p["errors"] for lv in result["levels"] for p in lv["paths"].values())
    return 1 if failed or result["cut_short"] else 0


if __name__ == "__main__":
    sys.exit(main())
