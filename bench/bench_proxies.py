"""Benchmark: the latency a proxy in the request path adds over going direct to the same simulator upstream.

One `specwatch sim` upstream (time scale 1) and, in front of it on 127.0.0.1, each proxy of the table
PROXIES: specwatch's exporter, nginx (Debian package), vllm-router (PyPI) and LiteLLM's proxy (PyPI).
For each concurrency level a closed loop of streaming chat requests (max_tokens 64, ignore_eos,
temperature 0, stream_options.include_usage) runs against every target, direct included, in rounds
whose order rotates so that drift hits all targets alike. Each round opens new client connections and,
when done, waits until every process is idle again; a second direct target is an A/A control that shows
how much "added latency" is noise. Per request the client (aiohttp) measures TTFT (first chunk with
non-empty content) and TPOT ((last content chunk - first content chunk) / (completion_tokens - 1));
per proxy the CPU seconds of its process tree (/proc/PID/stat) give streamed chunks per CPU second.
Writes bench/results/<out-stem>.json and .md (default proxies) and prints the Markdown.

    .venv/bin/python bench/bench_proxies.py [--proxies exporter,nginx,vllm-router,litellm]
        [--concurrency 1,16,64] [--requests-per-level N] [--rounds 6] [--no-control] [--no-install] [--keep-logs]
        [--client-cpu N] [--exporter-ref DIR] [--out-stem proxies]

--client-cpu pins the client (this process) to CPU N and every process it starts to the other CPUs
(`taskset`), so that the client's own CPU use does not land on the servers' cores. --exporter-ref adds
a target `exporter-ref`: the exporter from another source tree (e.g. `git archive HEAD`), measured in
the same rounds as the working tree's, for a before/after under the same conditions.

vllm-router and LiteLLM are installed (pinned) into their own venvs under ~/.cache/specwatch/bench-envs/,
nginx with apt-get when /usr/sbin/nginx is absent (as root); --no-install reports a missing one as
unavailable instead. Every process started runs in its own process group and is stopped at the end,
also on errors, Ctrl+C and SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import importlib.metadata
import json
import os
import platform
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import aiohttp
import requests

from specwatch.net import free_port
from specwatch.workloads import article_rows

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
TEMPLATES = BENCH / "proxies"
ENVS = Path.home() / ".cache" / "specwatch" / "bench-envs"

# Pinned third-party proxies. LiteLLM 1.108.0 is the newest release whose `[proxy]` extra resolves from the
# registry this project reaches: 1.109.x pins litellm-proxy-extras 0.4.113 and 1.108.1+ pin 0.4.110.post1,
# neither served there, and 1.110.x moved the proxy into a `litellm-proxy` package that is not served either.
VLLM_ROUTER_REQ = "vllm-router==0.1.17"
LITELLM_REQ = "litellm[proxy]==1.108.0"
NGINX_PACKAGE = "nginx-light"

MODEL = "spec-demo"
MAX_TOKENS = 64
SIM_ARGS = ["Qwen/Qwen3-8B", "--served-model-name", MODEL, "--max-model-len", "4096", "--max-num-seqs", "64",
            "--sim-time-scale", "1"]
REQUESTS_PER_CONCURRENCY = 6  # default requests per target and level: 6 x concurrency (6 waves when rounds = 6) ...
MIN_REQUESTS = 48  # ... but at least this many, so that concurrency 1 has more than a handful of samples
IDLE_SECONDS = 5.0
SETTLE_WINDOW_S = 0.3  # after each round: wait for a window this long in which all trees together use ...
SETTLE_QUIET_PCT = 5.0  # ... less than their idle CPU plus this many % of a core,
SETTLE_MAX_S = 30.0  # but no longer than this
REQUEST_TIMEOUT_S = 120.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


class Unavailable(Exception):
    """A proxy that cannot be installed, started or used here; the message says why."""


# ---------------------------------------------------------------- processes


class Processes:
    """Every process the benchmark starts, each in a new session (its own process group), logs in workdir."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=cwd, start_new_session=True)
        self.started.append((name, proc))
        return proc

    def log_tail(self, name: str, lines: int = 8) -> str:
        path = self.workdir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        with contextlib.suppress(ProcessLookupError):  # members left behind by a leader that exited
            os.killpg(proc.pid, signal.SIGKILL)

    def stop_all(self) -> None:
        while self.started:
            _, proc = self.started.pop()
            self.stop(proc)


def wait_ready(procs: Processes, name: str, proc: subprocess.Popen[bytes], url: str, timeout_s: float,
               headers: dict[str, str] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"exited with code {proc.returncode}: {procs.log_tail(name)}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(url, headers=headers, timeout=2).status_code == 200:
                return
        time.sleep(0.25)
    raise Unavailable(f"no 200 from {url} within {timeout_s:.0f} s: {procs.log_tail(name)}")


def tree_cpu_seconds(root: int) -> float:
    """utime+stime of `root` and all its live descendants, plus the reaped children each of them waited for."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                frontier.append(pid)
    return sum(ticks.get(pid, 0) for pid in tree) / CLK_TCK


# ---------------------------------------------------------------- the proxies


@dataclass
class Launch:
    argv: list[str]
    ready_path: str
    env_shown: dict[str, str] = field(default_factory=dict)  # what the command line needs besides os.environ
    env_secret: dict[str, str] = field(default_factory=dict)  # same, but not written into the results
    headers: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0
    cwd: Path | None = None


@dataclass(frozen=True)
class Proxy:
    name: str
    what: str
    install: Callable[[bool], str]  # (may_install) -> version text; raises Unavailable
    launch: Callable[[Path, int, int], Launch]  # (workdir, upstream port, port)


def run(argv: list[str], timeout_s: float = 60.0,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False)


def fill(template: str, out: Path, values: dict[str, str]) -> Path:
    text = (TEMPLATES / template).read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def specwatch_version() -> str:
    version = importlib.metadata.version("specwatch")
    head = run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"]).stdout.strip()
    dirty = run(["git", "-C", str(REPO), "status", "--porcelain", "--", "specwatch"]).stdout.strip()
    return f"specwatch {version} (git {head or '?'}{', specwatch/ modified' if dirty else ''})"


def install_exporter(may_install: bool) -> str:
    done = run([sys.executable, "-m", "specwatch.cli", "exporter", "--help"])
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"`specwatch exporter --help` exited {done.returncode}: {last[0]}")
    return specwatch_version()


def launch_exporter(workdir: Path, upstream: int, port: int) -> Launch:
    return Launch([sys.executable, "-m", "specwatch.cli", "exporter", "--upstream",
                   f"baseline=http://127.0.0.1:{upstream}", "--web.listen-address", f"127.0.0.1:{port}"], "/healthz")


def install_exporter_ref(tree: Path, may_install: bool) -> str:
    if not (tree / "specwatch" / "cli.py").is_file():
        raise Unavailable(f"{tree} is not a specwatch source tree")
    return f"specwatch source tree {tree}"


def launch_exporter_ref(tree: Path, workdir: Path, upstream: int, port: int) -> Launch:
    launch = launch_exporter(workdir, upstream, port)  # cwd and PYTHONPATH: `-m` imports from the tree
    return Launch(launch.argv, launch.ready_path, env_shown={"PYTHONPATH": str(tree)}, cwd=tree)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


def install_nginx(may_install: bool) -> str:
    if nginx_binary() is None:
        if not may_install:
            raise Unavailable("nginx is not installed (--no-install)")
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise Unavailable(f"nginx is not installed and apt-get as root is not possible here ({NGINX_PACKAGE})")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        argv = ["apt-get", "install", "-y", "--no-install-recommends", NGINX_PACKAGE]
        if run(argv, 600, env).returncode != 0:
            run(["apt-get", "update"], 600, env)
            done = run(argv, 600, env)
            if done.returncode != 0:
                raise Unavailable(f"apt-get install {NGINX_PACKAGE} failed: {done.stderr.strip()[-300:]}")
    binary = nginx_binary()
    if binary is None:
        raise Unavailable("nginx binary not found after installing")
    package = run(["dpkg-query", "-W", "-f", "${Package} ${Version}", NGINX_PACKAGE]).stdout.strip()
    return f"{run([binary, '-v']).stderr.strip()} (Debian {package or 'package unknown'})"


def launch_nginx(workdir: Path, upstream: int, port: int) -> Launch:
    home = workdir / "nginx"
    home.mkdir(parents=True, exist_ok=True)
    user = "user root;" if os.geteuid() == 0 else ""  # workers then may write the temp dirs under workdir
    conf = fill("nginx.conf.template", home / "nginx.conf",
                {"DIR": str(home), "UPSTREAM_PORT": str(upstream), "PORT": str(port), "USER_LINE": user})
    binary = nginx_binary() or "nginx"
    return Launch([binary, "-p", str(home), "-e", str(home / "error.log"), "-c", str(conf)], "/health")


def venv_install(name: str, requirement: str, dist: str, script: str, may_install: bool) -> tuple[Path, str]:
    """The console script `script` of `requirement` in its own venv under ENVS, installed when absent."""
    env = ENVS / name
    python, binary = env / "bin" / "python", env / "bin" / script
    wanted = requirement.split("==", 1)[1]

    def version() -> str | None:
        if not python.exists():
            return None
        done = run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"])
        return done.stdout.strip() if done.returncode == 0 else None

    if version() != wanted or not binary.exists():
        if not may_install:
            raise Unavailable(f"{requirement} is not installed in {env} (--no-install)")
        if not python.exists():
            done = run([sys.executable, "-m", "venv", str(env)], 300)
            if done.returncode != 0:
                raise Unavailable(f"could not create {env}: {done.stderr.strip()[-300:]}")
        done = run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", requirement], 1800)
        errors = [ln for ln in done.stderr.splitlines() if ln.startswith("ERROR")]
        if done.returncode != 0 or version() != wanted:
            raise Unavailable(f"pip install {requirement} failed: {' '.join(errors)[-400:] or done.returncode}")
    return binary, f"{dist} {wanted}"


def install_vllm_router(may_install: bool) -> str:
    return venv_install("vllm-router", VLLM_ROUTER_REQ, "vllm-router", "vllm-router", may_install)[1]


def launch_vllm_router(workdir: Path, upstream: int, port: int) -> Launch:
    binary = ENVS / "vllm-router" / "bin" / "vllm-router"
    return Launch([str(binary), "--worker-urls", f"http://127.0.0.1:{upstream}", "--host", "127.0.0.1",
                   "--port", str(port), "--policy", "round_robin", "--log-level", "warning",
                   "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())], "/health")


def install_litellm(may_install: bool) -> str:
    return venv_install("litellm", LITELLM_REQ, "litellm", "litellm", may_install)[1]


def launch_litellm(workdir: Path, upstream: int, port: int) -> Launch:
    home = workdir / "litellm"
    conf = fill("litellm.yaml.template", home / "config.yaml", {"UPSTREAM_PORT": str(upstream)})
    key = "sk-" + secrets.token_hex(24)  # the proxy refuses to start without a master key
    binary = ENVS / "litellm" / "bin" / "litellm"
    return Launch([str(binary), "--config", str(conf), "--host", "127.0.0.1", "--port", str(port)],
                  "/health/liveliness",
                  env_shown={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"},
                  env_secret={"LITELLM_MASTER_KEY": key}, headers={"Authorization": f"Bearer {key}"},
                  ready_timeout_s=180.0, cwd=home)


PROXIES: dict[str, Proxy] = {p.name: p for p in (
    Proxy("exporter", "specwatch exporter (python -m specwatch.cli exporter)", install_exporter, launch_exporter),
    Proxy("nginx", "nginx, 1 worker, upstream keepalive, proxy_buffering off", install_nginx, launch_nginx),
    Proxy("vllm-router", "vllm-router (Rust), policy round_robin, 1 worker", install_vllm_router, launch_vllm_router),
    Proxy("litellm", "LiteLLM proxy, hosted_vllm/spec-demo, no database", install_litellm, launch_litellm),
)}


# ---------------------------------------------------------------- the client


@dataclass
class Target:
    name: str
    url: str
    pid: int | None  # the process tree whose CPU is counted (None: not counted)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Sample:
    ttft_ms: float
    tpot_ms: float
    chunks: int


@dataclass
class Cell:
    """What one target did at one concurrency level, summed over its rounds."""

    samples: list[Sample] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cpu_s: float = 0.0
    upstream_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    settle_s: float = 0.0
    machine_busy_s: float = 0.0  # every process on the machine, ours included
    wall_s: float = 0.0


async def one_request(session: aiohttp.ClientSession, target: Target, prompt: str) -> Sample:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    first = last = 0.0
    completion = chunks = 0
    start = time.perf_counter()
    async with session.post(target.url + "/v1/chat/completions", json=body, headers=target.headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            chunks += 1
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            chunk = json.loads(payload)
            choices = chunk.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                last = time.perf_counter()
                first = first or last
            if chunk.get("usage"):
                completion = int(chunk["usage"]["completion_tokens"])
    if completion != MAX_TOKENS or not first:
        raise RuntimeError(f"completion_tokens {completion} (want {MAX_TOKENS}), content seen: {bool(first)}")
    return Sample((first - start) * 1000, (last - first) * 1000 / (completion - 1), chunks)


async def closed_loop(session: aiohttp.ClientSession, target: Target, prompts: list[str], offset: int,
                      concurrency: int, count: int) -> tuple[list[Sample], list[str]]:
    samples: list[Sample] = []
    errors: list[str] = []
    taken = 0

    async def worker() -> None:
        nonlocal taken
        while taken < count:
            i, taken = taken, taken + 1
            try:
                prompt = prompts[(offset + i) % len(prompts)]
                samples.append(await asyncio.wait_for(one_request(session, target, prompt), REQUEST_TIMEOUT_S))
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError, KeyError) as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])

    await asyncio.gather(*(worker() for _ in range(min(concurrency, count))))
    return samples, errors


def split(total: int, parts: int, concurrency: int) -> list[int]:
    """`total` requests in up to `parts` rounds, none smaller than `concurrency` (so that the loop reaches it)."""
    parts = max(1, min(parts, total // concurrency))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


async def smoke(targets: list[Target], prompt: str) -> dict[str, str]:
    """One request per target; returns target -> why it failed."""
    failed: dict[str, str] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:
        for target in targets:
            try:
                await one_request(session, target, prompt)
            except (aiohttp.ClientError, TimeoutError, RuntimeError, ValueError, KeyError) as exc:
                failed[target.name] = f"smoke request failed: {type(exc).__name__}: {exc}"[:400]
    return failed


async def settle(pids: list[int], quiet_pct: float) -> float:
    """Wait until the process trees together use less than `quiet_pct` % of a core (work a proxy does after the
    last chunk, e.g. logging callbacks, must not land on the next target's round); returns the seconds waited."""
    start = time.monotonic()
    last = sum(tree_cpu_seconds(pid) for pid in pids)
    while time.monotonic() - start < SETTLE_MAX_S:
        await asyncio.sleep(SETTLE_WINDOW_S)
        now = sum(tree_cpu_seconds(pid) for pid in pids)
        if 100 * (now - last) / SETTLE_WINDOW_S < quiet_pct:
            break
        last = now
    return time.monotonic() - start


def machine_busy_seconds() -> float:
    """CPU seconds all cores of the machine spent not idle, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks[:8]) - ticks[3] - ticks[4]) / CLK_TCK  # user..steal minus idle and iowait


async def round_of(target: Target, prompts: list[str], offset: int, concurrency: int,
                   count: int) -> tuple[list[Sample], list[str]]:
    """A closed loop on new client connections, closed at its end (no keep-alive races across rounds)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        return await closed_loop(session, target, prompts, offset, concurrency, count)


async def measure(targets: list[Target], upstream_pid: int, levels: list[int], requests_for: Callable[[int], int],
                  rounds: int, prompts: list[str], quiet_pct: float) -> dict[int, dict[str, Cell]]:
    cells: dict[int, dict[str, Cell]] = {}
    everyone = [upstream_pid, *(t.pid for t in targets if t.pid)]
    for concurrency in levels:
        total = requests_for(concurrency)
        cells[concurrency] = {t.name: Cell() for t in targets}
        for target in targets:  # warm-up wave (proxy-side upstream connections, lazy init), not counted
            await round_of(target, prompts, 0, concurrency, min(concurrency, total))
            await settle(everyone, quiet_pct)
        offset = concurrency
        for r, count in enumerate(split(total, rounds, concurrency)):
            order = targets[r % len(targets):] + targets[:r % len(targets)]
            for target in order:
                cell = cells[concurrency][target.name]
                cpu0 = tree_cpu_seconds(target.pid) if target.pid else 0.0
                up0, busy0 = tree_cpu_seconds(upstream_pid), machine_busy_seconds()
                t0, client0 = time.perf_counter(), time.process_time()
                samples, errors = await round_of(target, prompts, offset, concurrency, count)
                cell.wall_s += time.perf_counter() - t0
                cell.settle_s += await settle(everyone, quiet_pct)  # its CPU counts to this round's target
                cell.client_cpu_s += time.process_time() - client0
                cell.upstream_cpu_s += tree_cpu_seconds(upstream_pid) - up0
                cell.cpu_s += (tree_cpu_seconds(target.pid) - cpu0) if target.pid else 0.0
                cell.machine_busy_s += machine_busy_seconds() - busy0
                cell.samples += samples
                cell.errors += errors
            offset += count
            done = {t.name: len(cells[concurrency][t.name].samples) for t in targets}
            print(f"  concurrency {concurrency}: round {r + 1} done, samples {done}", flush=True)
    return cells


# ---------------------------------------------------------------- statistics and reports


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def summarize(cells: dict[int, dict[str, Cell]], proxy_names: set[str],
              idle: dict[str, float]) -> list[dict[str, Any]]:
    rows = []
    for concurrency, by_target in cells.items():
        stats: dict[str, dict[str, float | None]] = {}
        for name, cell in by_target.items():
            ttft, tpot = [s.ttft_ms for s in cell.samples], [s.tpot_ms for s in cell.samples]
            stats[name] = {"ttft_p50_ms": percentile(ttft, 0.5), "ttft_p99_ms": percentile(ttft, 0.99),
                           "tpot_p50_ms": percentile(tpot, 0.5), "tpot_p99_ms": percentile(tpot, 0.99)}
        for name, cell in by_target.items():
            chunks = sum(s.chunks for s in cell.samples)
            row: dict[str, Any] = {"target": name, "concurrency": concurrency, "requests": len(cell.samples),
                                   "errors": len(cell.errors), "error_examples": sorted(set(cell.errors))[:3],
                                   **stats[name]}
            for key in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"):
                row["added_" + key] = diff(stats[name][key], stats["direct"][key]) if name != "direct" else 0.0
            others = cell.machine_busy_s - cell.client_cpu_s - cell.upstream_cpu_s - cell.cpu_s
            row.update({"chunks": chunks, "wall_s": cell.wall_s, "settle_s": cell.settle_s,
                        "client_cpu_s": cell.client_cpu_s, "machine_busy_s": cell.machine_busy_s,
                        "other_processes_cpu_s": max(0.0, others),
                        "upstream_cpu_s": cell.upstream_cpu_s,
                        "upstream_chunks_per_cpu_s": chunks / cell.upstream_cpu_s if cell.upstream_cpu_s else None})
            if name in proxy_names:
                row.update({"proxy_cpu_s": cell.cpu_s, "proxy_idle_cpu_pct": idle.get(name),
                            "proxy_chunks_per_cpu_s": chunks / cell.cpu_s if cell.cpu_s > 0 else None})
            rows.append(row)
    return rows


def fmt(value: float | None, digits: int = 1, sign: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def markdown(report: dict[str, Any]) -> str:
    label = {"direct": "direct", "direct-aa": "direct again (A/A control)"}
    out = [f"# Proxy overhead: latency added in front of `specwatch sim` ({report['generated']})", "",
           f"Machine: {report['machine']['cpu']}, {report['machine']['cores']} cores, {report['machine']['os']}. "
           f"Upstream: `specwatch sim` at time scale 1; every request streams {MAX_TOKENS} tokens (ignore_eos). "
           "Rounds rotate the order of the targets.", "",
           "Load from other processes on the machine (not the benchmark's) during the measured rounds, in % of a "
           "core: " + ", ".join(f"concurrency {c}: {fmt(v, 0)}" for c, v in report["other_load_pct"].items())
           + f"; load average {report['machine']['loadavg_start']} at the start, "
           f"{report['machine']['loadavg_end']} at the end. Busiest other processes just before measuring: "
           + (", ".join(f"{n} {v:.0f} %" for n, v in report["other_processes_before"]) or "none above 1 %") + ".",
           "",
           (f"Client pinned to CPU {report['client_cpu']}, upstream and proxies to CPUs {report['server_cpus']} "
            "(taskset)." if report["client_cpu"] is not None else "No CPU pinning: client, upstream and proxies "
            "share all cores."), "",
           "## Latency (ms) at the client; added = proxy minus direct (difference of p50s, of p99s)", "",
           "| target | conc | ok/err | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | +TTFT p50 | +TTFT p99 "
           "| +TPOT p50 | +TPOT p99 |",
           "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    rows = report["results"]
    for row in sorted(rows, key=lambda r: (report["target_order"].index(r["target"]), r["concurrency"])):
        direct = row["target"] == "direct"
        added = ["" if direct else fmt(row[f"added_{k}"], 2 if "tpot" in k else 1, sign=True)
                 for k in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms")]
        out.append(f"| {label.get(row['target'], row['target'])} | {row['concurrency']} | "
                   f"{row['requests']}/{row['errors']} | {fmt(row['ttft_p50_ms'])} | {fmt(row['ttft_p99_ms'])} | "
                   f"{fmt(row['tpot_p50_ms'], 2)} | {fmt(row['tpot_p99_ms'], 2)} | " + " | ".join(added) + " |")
    top = max(r["concurrency"] for r in rows)
    out += ["", f"## CPU at concurrency {top}: streamed chunks per CPU second of each process tree", "",
            "CPU seconds from /proc/PID/stat (utime+stime of the process and its descendants) over the target's "
            "own measured rounds, each up to the moment all processes are quiet again (settle s after the last "
            "chunk); chunks = SSE `data:` events the client received through it.", "",
            "| target | chunks relayed | wall s | settle s | proxy CPU s | chunks / proxy CPU s | sim CPU s "
            "| chunks / sim CPU s | client CPU s | other processes CPU s |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for row in rows:
        if row["concurrency"] == top:
            out.append(f"| {label.get(row['target'], row['target'])} | {row['chunks']} | {fmt(row['wall_s'], 1)} | "
                       f"{fmt(row['settle_s'], 1)} | "
                       f"{fmt(row.get('proxy_cpu_s'), 2)} | {fmt(row.get('proxy_chunks_per_cpu_s'), 0)} | "
                       f"{fmt(row['upstream_cpu_s'], 2)} | {fmt(row['upstream_chunks_per_cpu_s'], 0)} | "
                       f"{fmt(row['client_cpu_s'], 2)} | {fmt(row['other_processes_cpu_s'], 2)} |")
    levels = sorted({r["concurrency"] for r in rows})
    proxies = [name for name in report["target_order"] if name not in label]
    if proxies:
        out += ["", "## Proxy chunks per CPU second at each level, and idle CPU", "",
                "| proxy | idle CPU (% of a core) | " + " | ".join(f"conc {c}" for c in levels) + " |",
                "|---|--:|" + "--:|" * len(levels)]
        by = {(r["target"], r["concurrency"]): r for r in rows}
        for name in proxies:
            out.append(f"| {name} | {fmt(report['idle_cpu_pct'].get(name), 1)} | " + " | ".join(
                fmt(by[name, c].get("proxy_chunks_per_cpu_s"), 0) for c in levels) + " |")
    out += ["", "## Versions", ""] + [f"- {k}: {v}" for k, v in report["versions"].items()]
    out += ["", "## Commands", "",
            "Ports are free ports picked per run; nginx's config is bench/proxies/nginx.conf.template and LiteLLM's "
            "bench/proxies/litellm.yaml.template, filled in under a temp dir.", "", "```"]
    out += [f"{k}: {v}" for k, v in report["commands"].items()] + ["```"]
    out += ["", "## How to read it", "",
            "- Each round is a closed loop on new client connections (TTFT includes a loopback connect, for every "
            "target alike); a warm-up wave per target and level is not counted.",
            "- With the client, the simulator and the proxy on 2 shared cores, the added TPOT at the highest "
            "concurrency is mostly CPU contention (the proxy's CPU is taken from the simulator's step loop and the "
            "client), not time on the wire; the A/A control row shows the noise at each level.",
            "- p99 of few samples is close to the maximum: one stall of another process on the machine moves it."]
    if report["unavailable"]:
        out += ["", "## Unavailable", ""] + [f"- {k}: {v}" for k, v in report["unavailable"].items()]
    errors = [r for r in rows if r["errors"]]
    if errors:
        out += ["", "## Errors", ""] + [f"- {r['target']} @ {r['concurrency']}: {r['errors']} failed, e.g. "
                                        f"{'; '.join(r['error_examples'])}" for r in errors]
    return "\n".join(out) + "\n"


def machine() -> dict[str, Any]:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(), "loadavg_start": loadavg()}


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def idle_cpu_pct(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """CPU use of each process tree while nothing is sent to any of them, in % of one core."""
    before = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(seconds)
    return {name: 100 * (tree_cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


# ---------------------------------------------------------------- main


def other_processes_cpu(exclude: set[int], seconds: float) -> list[tuple[str, float]]:
    """The busiest processes on the machine outside `exclude` (pids), in % of a core over `seconds`."""
    def ticks() -> dict[int, tuple[str, int]]:
        out = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and int(entry.name) not in exclude:
                try:
                    with open(f"/proc/{entry.name}/stat", "rb") as f:
                        head, rest = f.read().rsplit(b")", 1)
                except OSError:
                    continue
                fields = rest.split()
                out[int(entry.name)] = (head.split(b"(", 1)[1].decode(errors="replace"),
                                        int(fields[11]) + int(fields[12]))
        return out

    before = ticks()
    time.sleep(seconds)
    after = ticks()
    busy = [(f"{name} ({pid})", 100 * (t - before[pid][1]) / CLK_TCK / seconds)
            for pid, (name, t) in after.items() if pid in before]
    return sorted((b for b in busy if b[1] >= 1.0), key=lambda b: -b[1])[:5]


def pinned(argv: list[str], cpus: str | None) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--proxies", default=",".join(PROXIES), help=f"comma-separated, of: {', '.join(PROXIES)}")
    parser.add_argument("--concurrency", default="1,16,64", help="comma-separated concurrency levels")
    parser.add_argument("--requests-per-level", type=int, default=None,
                        help=f"requests per target and level (default: max({REQUESTS_PER_CONCURRENCY} x concurrency, "
                        f"{MIN_REQUESTS}))")
    parser.add_argument("--rounds", type=int, default=6,
                        help="rounds per level, each rotating the target order (fewer when a round would get fewer "
                        "requests than the concurrency)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp dir with the processes' logs")
    parser.add_argument("--no-control", action="store_true", help="skip the second (A/A) direct target")
    parser.add_argument("--no-install", action="store_true", help="report missing proxies instead of installing")
    parser.add_argument("--out-dir", type=Path, default=BENCH / "results")
    parser.add_argument("--out-stem", default="proxies", help="file name of the results, without .json / .md")
    parser.add_argument("--client-cpu", type=int, default=None,
                        help="pin the client to this CPU and every started process to the other CPUs")
    parser.add_argument("--exporter-ref", type=Path, default=None,
                        help="also measure the exporter from this source tree, as target exporter-ref")
    args = parser.parse_args(argv)
    args.proxy_list = [p.strip() for p in args.proxies.split(",") if p.strip()]
    if args.exporter_ref is not None:
        tree = args.exporter_ref.resolve()
        PROXIES["exporter-ref"] = Proxy("exporter-ref", f"specwatch exporter from {tree}",
                                        functools.partial(install_exporter_ref, tree),
                                        functools.partial(launch_exporter_ref, tree))
        args.proxy_list.append("exporter-ref")
    cpus = os.sched_getaffinity(0)
    if args.client_cpu is not None and (args.client_cpu not in cpus or len(cpus) < 2):
        parser.error(f"--client-cpu must be one of {sorted(cpus)}, and there must be another CPU for the servers")
    args.server_cpus = ",".join(str(c) for c in sorted(cpus - {args.client_cpu})) \
        if args.client_cpu is not None else None
    unknown = [p for p in args.proxy_list if p not in PROXIES]
    if unknown:
        parser.error(f"unknown proxies {unknown}; known: {', '.join(PROXIES)}")
    args.levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not args.levels or not all(1 <= c <= 256 for c in args.levels):
        parser.error("concurrency levels must be within 1..256")
    if args.requests_per_level is not None and not 1 <= args.requests_per_level <= 2000:
        parser.error("--requests-per-level must be within 1..2000")
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds must be within 1..20")
    return args


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rows = article_rows("chat") + article_rows("code")
    prompts = [rows[(i * 7) % len(rows)].prompt for i in range(len(rows))]  # chat and code interleaved
    machine_info = machine()
    versions = {"python": platform.python_version(), "aiohttp": aiohttp.__version__, "upstream": specwatch_version()}
    commands: dict[str, str] = {"benchmark": shlex.join([sys.executable, *sys.argv])}
    unavailable: dict[str, str] = {}
    workdir = Path(tempfile.mkdtemp(prefix="specwatch-bench-proxies-"))
    procs = Processes(workdir)
    failed = False
    try:
        with sigterm_as_interrupt():
            up_port = free_port()
            sim_argv = [sys.executable, "-m", "specwatch.cli", "sim", *SIM_ARGS, "--port", str(up_port)]
            commands["upstream"] = shlex.join(pinned(sim_argv, args.server_cpus))
            sim = procs.start("sim", pinned(sim_argv, args.server_cpus))
            wait_ready(procs, "sim", sim, f"http://127.0.0.1:{up_port}/health", 60)
            targets = [Target("direct", f"http://127.0.0.1:{up_port}", None)]
            if not args.no_control:
                targets.append(Target("direct-aa", f"http://127.0.0.1:{up_port}", None))
            for name in args.proxy_list:
                proxy = PROXIES[name]
                print(f"{name}: installing/checking ...", flush=True)
                try:
                    versions[name] = proxy.install(not args.no_install)
                    port = free_port()
                    launch = proxy.launch(workdir, up_port, port)
                    env = {**os.environ, **launch.env_shown, **launch.env_secret} if launch.env_shown or \
                        launch.env_secret else None
                    commands[name] = " ".join([*(f"{k}={shlex.quote(v)}" for k, v in launch.env_shown.items()),
                                               *(f"{k}=<random per run>" for k in launch.env_secret),
                                               shlex.join(pinned(launch.argv, args.server_cpus))])
                    proc = procs.start(name, pinned(launch.argv, args.server_cpus), env=env, cwd=launch.cwd)
                    wait_ready(procs, name, proc, f"http://127.0.0.1:{port}{launch.ready_path}",
                               launch.ready_timeout_s, launch.headers)
                    targets.append(Target(name, f"http://127.0.0.1:{port}", proc.pid, launch.headers))
                    print(f"{name}: ready on port {port} ({versions[name]})", flush=True)
                except (Unavailable, OSError, subprocess.SubprocessError) as exc:
                    unavailable[name] = str(exc)
                    print(f"{name}: UNAVAILABLE: {exc}", flush=True)
            for name, why in asyncio.run(smoke(targets, prompts[0])).items():
                if name in ("direct", "direct-aa"):
                    raise RuntimeError(f"the upstream itself fails: {why}")
                unavailable[name] = why
                print(f"{name}: UNAVAILABLE: {why}", flush=True)
            targets = [t for t in targets if t.name not in unavailable]
            ours = {os.getpid(), sim.pid, *(t.pid for t in targets if t.pid)}
            others_before = other_processes_cpu(ours, 2.0)
            print("other processes before measuring (% of a core): " + (", ".join(
                f"{n} {v:.0f}" for n, v in others_before) or "none above 1"), flush=True)
            if args.client_cpu is not None:
                os.sched_setaffinity(0, {args.client_cpu})
                commands["client"] = f"this process, pinned to CPU {args.client_cpu}; servers on CPUs " \
                    f"{args.server_cpus}"
            idle = idle_cpu_pct({"sim": sim.pid, **{t.name: t.pid for t in targets if t.pid}}, IDLE_SECONDS)
            print("idle CPU (% of a core): " + ", ".join(f"{k} {v:.1f}" for k, v in idle.items()), flush=True)

            def requests_for(concurrency: int) -> int:
                return args.requests_per_level or max(REQUESTS_PER_CONCURRENCY * concurrency, MIN_REQUESTS)

            print(f"measuring {[t.name for t in targets]} at concurrency {args.levels}, "
                  f"requests per level {[requests_for(c) for c in args.levels]}, {args.rounds} rounds", flush=True)
            started = time.monotonic()
            quiet = sum(idle.values()) + SETTLE_QUIET_PCT
            cells = asyncio.run(measure(targets, sim.pid, args.levels, requests_for, args.rounds, prompts, quiet))
            elapsed = time.monotonic() - started
    except BaseException:
        failed = True
        print(f"failed; process logs kept in {workdir}", file=sys.stderr)
        raise
    finally:
        procs.stop_all()
        if not failed and not args.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
        elif args.keep_logs:
            print(f"process logs kept in {workdir}")

    proxy_names = {t.name for t in targets if t.pid is not None}
    results = summarize(cells, proxy_names, idle)
    report: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {**machine_info, "loadavg_end": loadavg()}, "measure_seconds": round(elapsed, 1),
        "other_load_pct": {c: 100 * sum(r["other_processes_cpu_s"] for r in results if r["concurrency"] == c)
                           / max(1e-9, sum(r["wall_s"] + r["settle_s"] for r in results if r["concurrency"] == c))
                           for c in args.levels},
        "config": {"concurrency": args.levels, "requests_per_level": {c: requests_for(c) for c in args.levels},
                   "rounds": {c: len(split(requests_for(c), args.rounds, c)) for c in args.levels},
                   "max_tokens": MAX_TOKENS, "model": MODEL, "warmup": "one wave (concurrency requests) per level",
                   "idle_seconds": IDLE_SECONDS},
        "target_order": [t.name for t in targets], "versions": versions, "commands": commands,
        "unavailable": unavailable, "idle_cpu_pct": idle, "results": results,
        "other_processes_before": others_before, "client_cpu": args.client_cpu, "server_cpus": args.server_cpus,
        "samples": {c: {name: {"ttft_ms": [round(s.ttft_ms, 3) for s in cell.samples],
                               "tpot_ms": [round(s.tpot_ms, 3) for s in cell.samples]}
                        for name, cell in by_target.items()} for c, by_target in cells.items()},
    }
    text = markdown(report)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / args.out_stem
    stem.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    stem.with_suffix(".md").write_text(text)
    print(text)
    print(f"written to {stem}.json and {stem}.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
