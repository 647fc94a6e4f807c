"""Runs the proxy bench on a quiet many-core host with no network, every process pinned to its own core(s).

The stub upstream (stub_upstream.py), nginx (1 worker), vllm-router, the specwatch exporter and, where
present, a second build of it start pinned (sched_setaffinity, inherited by every thread and child), then
proxy_bench.py measures direct, direct-aa and each of them in interleaved palindromic rounds. LiteLLM is
left out. Everything it needs travels in .devperf/ (ignored by git; bench/perf/assemble_devperf.sh builds it):
  whl/         wheels for the stub, the client and the exporter (aiohttp and its needs, prometheus_client,
               uvloop, pyyaml), installed into a folder of their own (--no-install: this python's packages)
  whl-router/  optional: vllm-router and the needs of its launcher
  deb/         Debian's nginx + nginx-common, unpacked with dpkg -x (deb/fallback/: libraries nginx links
               against, used only where ldd reports one missing); without it, an nginx on PATH
  src/         the project's `specwatch` package (and COMMIT)
  src-ref/     optional: a second `specwatch` package, measured as `specwatch-ref` in the same rounds
  perf/        this harness (run it from there: `python3 .devperf/perf/run_pinned.py`)

Cores: without --cpus, one logical CPU per physical core in order: stub 2, client 2, nginx 1, router 1,
specwatch 1, specwatchref 1 (then specwatchw 4 where they fit), the RSS sampler on the last core. With
--stub-processes or --client-processes above 2: stub max(2, N), client max(2, P), nginx 1, specwatch 1,
then only the roles used (specwatchw 4, specwatchref 1, router 1), the sampler last.
--specwatch-workers N also measures `specwatch exporter --workers N` as specwatch-wN; --stagger-ms MS adds
a pass with a desynchronised loop (<out-prefix>-stagger.*); --fronts adds raw_front.py's two bare fronts
(bare, aiohttp-bare); --variant NAME=FLAGS the exporter started with FLAGS; --skip leaves paths out;
--probe starts everything, streams through each path and runs a tiny bench (C 1 and 256, one round).

Other modes, on the same pinned processes: --per-request (per_request.py against the exporter, raw_front.py's
fronts and src-ref: DIR/per-request-fronts.txt) and --profile (py-spy, from DEVPERF/bin or PATH, samples the
exporter of --src while per_request.py runs: DIR/profile-<src>.{stacks,txt}; with --stream the stub streams the
bench's 64 chunks 10 ms apart, in bursts of 64, and each exporter thread's CPU is added: profile-stream-<src>.*).

Results: <out-prefix>.{json,md} (default $RESULTS_DIR/results-pinned-<date>) with the RSS per level and the
environment appended, plus bench.log, rss.tsv, env.txt and logs.tgz beside them. Every process it started
is stopped by PID on exit. Origin: run_pinned.sh (the issue 18 reference run), in Python since issue 34.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import glob
import json
import os
import platform
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

from sse_client import stream_chat

HERE = Path(__file__).resolve().parent
ROLES = ("nginx", "router", "specwatch", "specwatch-ref")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children() -> dict[int, list[int]]:
    """ppid -> pids, from /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                raw = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            kids.setdefault(int(raw[raw.rfind(b")") + 2:].split()[1]), []).append(int(entry))
    return kids


def tree(root: int) -> list[int]:
    kids, pids, stack = children(), [], [root]
    while stack:
        pid = stack.pop()
        pids.append(pid)
        stack.extend(kids.get(pid, ()))
    return pids


def alive(pid: int) -> bool:
    """Whether pid runs (a zombie waiting for its reaper does not), from /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def http_get(url: str, timeout: float = 2.0) -> str:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return str(r.read().decode())


class Run:
    """The started processes (pinned, in the run folder, by name), their logs, env.txt and clean-up."""

    def __init__(self, work: Path, env_txt: Path) -> None:
        self.work = work
        self.dir = work / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env_txt = env_txt
        env_txt.write_text("")
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def note(self, msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)
        with self.env_txt.open("a") as f:
            f.write(msg + "\n")

    def start(self, name: str, cpus: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        """argv pinned to cpus, in the run folder with PYTHONSAFEPATH (run from a checkout's root, `python -m
        specwatch.cli` would import that checkout's specwatch/, not the build on PYTHONPATH); its PID."""
        cores = {int(c) for c in cpus.split(",")}
        full_env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
        with (self.dir / f"{name}.log").open("wb") as out:
            proc = subprocess.Popen(argv, cwd=self.dir, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=lambda: os.sched_setaffinity(0, cores))
        self.procs[name] = proc
        log(f"started {name} PID {proc.pid} on CPU(s) {cpus}")
        return proc.pid

    def pid(self, name: str) -> int:
        return self.procs[name].pid

    def tail(self, name: str, lines: int = 30) -> str:
        text = (self.dir / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def wait_up(self, name: str, port: int, seconds: float, path: str | None = None) -> bool:
        """Until 127.0.0.1:port accepts (and, with path, answers 2xx there); False with the log's tail when not."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                if path is None:
                    socket.create_connection(("127.0.0.1", port), 1).close()
                else:
                    http_get(f"http://127.0.0.1:{port}{path}")
                return True
            except OSError:
                pass
            if self.procs[name].poll() is not None:
                print(self.tail(name), file=sys.stderr)
                log(f"{name} exited during start-up")
                return False
            time.sleep(0.25)
        print(self.tail(name), file=sys.stderr)
        log(f"{name} did not answer on port {port} within {seconds:g} s")
        return False

    def stop(self, name: str) -> None:
        """TERM a started process and its descendants, KILL whatever is left after 10 s."""
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        pids = tree(proc.pid)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (proc.poll() is None or any(alive(p) for p in pids[1:])):
            time.sleep(0.1)
        for pid in pids:
            if alive(pid):
                log(f"killing {name} PID {pid}")
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.wait()

    def close(self, logs_to: Path | None) -> None:
        names = list(self.procs)
        for name in reversed(names):
            self.stop(name)
        log(f"stopped: {' '.join(names) or 'nothing'}")
        if logs_to is not None:
            with tarfile.open(logs_to / "logs.tgz", "w:gz") as tar:
                tar.add(self.dir, arcname=self.dir.name)

    def affinity_report(self) -> None:
        for name, proc in self.procs.items():
            for pid in tree(proc.pid):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    comm = Path(f"/proc/{pid}/comm").read_text().strip()
                    tasks = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                allowed = re.search(r"Cpus_allowed_list:\s*(\S+)", status)
                per_thread = []
                for t in tasks:
                    try:
                        m = re.search(r"Cpus_allowed_list:\s*(\S+)", Path(f"/proc/{pid}/task/{t}/status").read_text())
                    except OSError:
                        continue
                    per_thread.append(m.group(1) if m else "?")
                self.note(f"affinity {name} PID {pid} ({comm}): {len(tasks)} thread(s), allowed "
                          f"{allowed.group(1) if allowed else '?'} [threads: {' '.join(per_thread)}]")


# ---------------------------------------------------------------- what travels: packages, builds, nginx


def pip_target(target: Path, wheels: list[str], log_file: Path) -> bool:
    shutil.rmtree(target, ignore_errors=True)
    if not wheels:
        return False
    with log_file.open("wb") as out:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--no-cache-dir", "--upgrade", "--target", str(target), *wheels],
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    return done.returncode == 0


def py_env(*paths: Path | None) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(str(p) for p in paths if p is not None)}


def build_dir(dev: Path, name: str) -> Path:
    return dev / name if (dev / name).is_dir() else Path(name).resolve()


def build_of(run: Run, src: Path, site: Path | None) -> str:
    """The specwatch a process started by `run.start` imports from src (checked), its version and commit."""
    argv = [sys.executable, "-c", "import specwatch; print(specwatch.__file__, specwatch.__version__)"]
    done = subprocess.run(argv, cwd=run.dir, env={**os.environ, "PYTHONSAFEPATH": "1", **py_env(src, site)},
                          capture_output=True, text=True, check=False)
    file, _, version = done.stdout.strip().partition(" ")
    if file != str(src / "specwatch" / "__init__.py"):
        sys.exit(f"run_pinned.py: specwatch from {src} imports {file or done.stderr.strip()} instead")
    commit = (src / "COMMIT").read_text().strip() if (src / "COMMIT").exists() else "unknown"
    return f"{version} at {file}, commit {commit}"


def nginx_binary(run: Run, dev: Path, work: Path) -> tuple[str, dict[str, str]]:
    """Debian's nginx from dev/deb, unpacked under /tmp/nginx (never into /), or one on PATH; ('', {}) if none."""
    debs = sorted(glob.glob(str(dev / "deb" / "*.deb")))
    if not debs:
        found = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else "")
        run.note(f"nginx: no .deb in .devperf/deb, {'using ' + found if found else 'left out'}")
        return found, {}
    root = Path("/tmp/nginx")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for deb in debs:
        subprocess.run(["dpkg", "-x", deb, str(root)], check=True)
    binary, env = str(root / "usr/sbin/nginx"), {}
    missing = [ln.split()[0] for ln in subprocess.run(["ldd", binary], capture_output=True, text=True,
                                                      check=False).stdout.splitlines() if "not found" in ln]
    if missing:
        run.note(f"nginx: missing libraries on this machine: {' '.join(missing)}")
        libs = work / "ngxlibs"
        for deb in glob.glob(str(dev / "deb" / "fallback" / "*.deb")):
            subprocess.run(["dpkg", "-x", deb, str(libs)], check=True)
        env = {"LD_LIBRARY_PATH": f"{libs}/usr/lib/x86_64-linux-gnu:{libs}/lib/x86_64-linux-gnu"}
        run.note("nginx: using Debian bookworm's libraries from .devperf/deb/fallback for those")
    done = subprocess.run([binary, "-v"], capture_output=True, text=True, env={**os.environ, **env}, check=False)
    if done.returncode != 0:
        run.note(f"nginx: does not run here: {done.stderr.strip()}")
        return "", {}
    deb = Path(next(d for d in debs if Path(d).name.startswith("nginx_"))).name
    run.note(f"nginx: {done.stderr.strip().split('version: ')[-1]} (Debian {deb[6:].removesuffix('_amd64.deb')})")
    return binary, env


NGINX_CONF = """worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/tmp/body;
  proxy_temp_path {d}/tmp/proxy;
  fastcgi_temp_path {d}/tmp/fcgi;
  uwsgi_temp_path {d}/tmp/uwsgi;
  scgi_temp_path {d}/tmp/scgi;
  upstream llm {{ server 127.0.0.1:{up}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_cache off;
      proxy_read_timeout 600s;
    }}
  }}
}}
"""


def cpu_plan(stub_n: int, client_n: int, sw_workers: int, have_ref: bool, router_ok: bool) -> dict[str, str]:
    """Role -> cores: one logical CPU per physical core (logical CPUs below 8 physical cores), in order."""
    cpus = sorted(os.sched_getaffinity(0))
    groups: dict[str, list[int]] = {}
    for c in cpus:
        try:
            sib = Path(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            sib = str(c)
        groups.setdefault(sib, []).append(c)
    first = [min(g) for g in sorted(groups.values(), key=min)]
    if len(first) < 8:
        first = cpus
    plan: list[tuple[str, list[int]]] = []
    i = 0
    if stub_n <= 2 and client_n <= 2:  # the plan of the issue 18 runs, unchanged
        for name, n in (("stub", 2), ("client", 2), ("nginx", 1), ("router", 1), ("specwatch", 1), ("specwatchref", 1)):
            plan.append((name, first[i:i + n]))
            i += n
        if len(first) >= i + 5:  # a --workers exporter: four cores after the others, the sampler stays last
            plan.append(("specwatchw", first[i:i + 4]))
    else:  # more stub / client processes: those first, then only the roles this run uses
        for name, n in (("stub", max(2, stub_n)), ("client", max(2, client_n)), ("nginx", 1), ("specwatch", 1)):
            plan.append((name, first[i:i + n]))
            i += n
        for name, n, used in (("specwatchw", 4, sw_workers > 0), ("specwatchref", 1, have_ref),
                              ("router", 1, router_ok)):
            if used and len(first) >= i + n + 1:
                plan.append((name, first[i:i + n]))
                i += n
    plan.append(("sampler", first[-1:] if len(first) > i else first[i - 1:i]))
    return {name: ",".join(map(str, cores)) for name, cores in plan if cores}


def parse_cpus(text: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in text.split())


async def smoke(specs: list[tuple[str, str]], key: str) -> list[str]:
    """Two streamed requests through each (name, url); a line for each path's second (or failed) one."""
    lines = []
    for name, url in specs:
        for i in range(2):
            t0 = time.perf_counter()
            ex = await stream_chat(url, 30.0, prompt="warm-up", api_key=key)
            ok = ex.status == 200 and bool(ex.t_done) and not ex.error
            if i == 1 or not ok:
                h = ex.headers
                lines.append(f"smoke {name}: HTTP {ex.status}, {len(ex.times)} content chunks, usage={bool(ex.usage)}, "
                             f"[DONE]={bool(ex.t_done)}, {(time.perf_counter() - t0) * 1000:.0f} ms, "
                             f"server={h.get('server')}, content-type={h.get('content-type')}, "
                             f"te={h.get('transfer-encoding')}" + (f", FAILED: {ex.error}" if not ok else ""))
            if not ok:
                break
    return lines


def exporter_metrics(port: int, prefixes: tuple[str, ...]) -> str:
    try:
        text = http_get(f"http://127.0.0.1:{port}/metrics")
    except OSError as exc:
        return repr(exc)
    return " ".join(ln for ln in text.splitlines() if ln.startswith(prefixes) and not ln.endswith(" 0.0"))[:1500]


# ---------------------------------------------------------------- RSS: the sampler and the report


def sample_rss(out: str, roots: list[str]) -> None:
    """Every 0.5 s: VmRSS, VmHWM (kB) and threads summed over each named process tree -> TSV; stops on SIGTERM."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    named = {k: int(v) for k, v in (r.split("=") for r in roots)}

    def field(pid: int, key: str) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    with open(out, "w") as f:
        f.write("epoch\tclock\tname\trss_kb\thwm_kb\tthreads\n")
        while not stop:
            now = time.time()
            clock = time.strftime("%H:%M:%S", time.localtime(now))
            for name, root in named.items():
                pids = tree(root)
                f.write(f"{now:.2f}\t{clock}\t{name}\t{sum(field(p, 'VmRSS') for p in pids)}\t"
                        f"{sum(field(p, 'VmHWM') for p in pids)}\t{sum(field(p, 'Threads') for p in pids)}\n")
            f.flush()
            time.sleep(0.5)


def rss_report(prefix: str, rss_path: Path, bench_log: Path, env_txt: Path) -> None:
    """Peak RSS per process tree and level (levels from proxy_bench's log lines) into the JSON and the Markdown."""
    levels = [(m.group(1), int(m.group(2))) for m in
              (re.match(r"\[(\d\d:\d\d:\d\d)\] level C=(\d+):", ln) for ln in bench_log.read_text().splitlines()) if m]
    rows = list(csv.DictReader(rss_path.open(), delimiter="\t"))

    def level_of(clock: str) -> int | None:
        cur = None
        for start, c in levels:
            if clock >= start:
                cur = c
        return cur

    peak: dict[tuple[str, int | None], int] = {}
    first: dict[str, int] = {}
    hwm: dict[str, int] = {}
    threads: dict[str, int] = {}
    for r in rows:
        name, rss = r["name"], int(r["rss_kb"])
        first.setdefault(name, rss)
        hwm[name] = max(hwm.get(name, 0), int(r["hwm_kb"]))
        threads[name] = max(threads.get(name, 0), int(r["threads"]))
        key = (name, level_of(r["clock"]))
        peak[key] = max(peak.get(key, 0), rss)
    names = list(dict.fromkeys(r["name"] for r in rows))
    concs = [c for _, c in levels]
    env = env_txt.read_text()
    try:
        res = json.loads(Path(prefix + ".json").read_text())
    except (OSError, ValueError):
        res = None
    if res is not None:
        res["host"] = {"rss": {n: {"start_kb": first.get(n), "vmhwm_kb_at_end": hwm.get(n),
                                   "max_threads": threads.get(n),
                                   "peak_rss_kb_by_level": {str(c): peak.get((n, c)) for c in concs}} for n in names},
                       "env": env.splitlines(),
                       "rss_note": "peak VmRSS (kB) summed over the process tree, sampled every 0.5 s during each "
                                   "level (warm-up included); vmhwm = kernel's peak RSS over the process lifetime"}
        Path(prefix + ".json").write_text(json.dumps(res, indent=1))

    def mib(kb: int | None) -> str:
        return "n/a" if not kb else f"{kb / 1024:.1f}"

    lines = ["", "## Pinned run: pinning, memory, environment", "",
             "| process | RSS at start (MiB) | " + " | ".join(f"peak RSS C={c} (MiB)" for c in concs)
             + " | VmHWM at end (MiB) | threads (max) |", "|---|---:|" + "---:|" * len(concs) + "---:|---:|"]
    for n in names:
        lines.append(f"| {n} | {mib(first.get(n))} | " + " | ".join(mib(peak.get((n, c))) for c in concs)
                     + f" | {mib(hwm.get(n))} | {threads.get(n)} |")
    lines += ["", "RSS: VmRSS summed over the process tree (nginx: master + worker), sampled every 0.5 s "
              "from /proc by a sampler on its own core; a level's column covers its warm-up and all "
              "its blocks (direct and the other proxies included, when this process idles).", "",
              "```", env.rstrip(), "```", ""]
    if res is not None:
        with open(prefix + ".md", "a") as f:
            f.write("\n".join(lines))
    print("\n".join(lines))


# ---------------------------------------------------------------- the runs


def run_bench(run: Run, cpus: str, env: dict[str, str], argv: list[str], limit_s: float, log_name: str) -> int:
    """proxy_bench.py pinned to the client's cores; its log to stderr and log_name, stopped after limit_s."""
    cores = {int(c) for c in cpus.split(",")}
    with (run.dir / f"{log_name}.stdout").open("wb") as out, (run.dir / f"{log_name}.log").open("w") as err:
        proc = subprocess.Popen([sys.executable, str(HERE / "proxy_bench.py"), *argv], cwd=run.dir,
                                env={**os.environ, **env}, stdout=out, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, cores))
        deadline = time.monotonic() + limit_s
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            err.write(line)
            if time.monotonic() > deadline:
                proc.terminate()
        return proc.wait()


def pinned_bench(a: argparse.Namespace, dev: Path, res_dir: Path) -> int:
    prefix = a.out_prefix or str(res_dir / f"results-pinned-{time.strftime('%Y-%m-%d')}")
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    run = Run(Path(os.environ.get("PERF_WORK", "/tmp/perfdev")), Path(prefix).parent / "env.txt")
    try:
        return _pinned_bench(a, dev, prefix, run)
    finally:
        run.close(Path(prefix).parent)


def _pinned_bench(a: argparse.Namespace, dev: Path, prefix: str, run: Run) -> int:
    skip = set(filter(None, a.skip.split(",")))
    note = run.note
    note(f"# run_pinned.py {time.strftime('%Y-%m-%dT%H:%M:%S%z')} on {platform.node()}: {os.cpu_count()} CPUs online, "
         f"kernel {platform.release()}")
    note(f"python: {sys.executable} {platform.python_version()}")
    note("pinning via: sched_setaffinity before exec (taskset -c's call)")
    if shutil.which("lscpu"):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout.splitlines():
            if re.match(r"(Model name|Thread|Core|Socket|CPU\(s\)|NUMA node)", line):
                note(line)
    sibs = " ".join(f"{c.name[3:]}:{(c / 'topology/thread_siblings_list').read_text().strip()}"
                    for c in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*"))
                    if (c / "topology/thread_siblings_list").exists())
    note(f"thread siblings: {sibs}")
    note(f"load before start: {Path('/proc/loadavg').read_text().strip()}")

    site: Path | None = None
    if not a.no_install:
        site = run.work / "site"
        if not pip_target(site, sorted(glob.glob(str(dev / "whl" / "*.whl"))), run.dir / "pip-site.log"):
            print((run.dir / "pip-site.log").read_text(), file=sys.stderr)
            sys.exit("run_pinned.py: installing .devperf/whl failed")
    site_router = run.work / "site-router"
    router_ok = "router" not in skip and pip_target(site_router, sorted(glob.glob(str(dev / "whl-router" / "*.whl"))),
                                                    run.dir / "pip-router.log")
    if not router_ok:
        note("vllm-router: skipped (--skip)" if "router" in skip else "vllm-router: not installed, left out")
    pyenv = py_env(site)
    versions = subprocess.run([sys.executable, "-c", "import aiohttp, multidict, yarl, uvloop, yaml\n"
                               "from importlib.metadata import version\n"
                               "print(f'aiohttp {aiohttp.__version__}, multidict {multidict.__version__}, yarl "
                               "{yarl.__version__}, uvloop {uvloop.__version__}, pyyaml {yaml.__version__}, "
                               "prometheus_client {version(\"prometheus_client\")}')"],
                              env={**os.environ, **pyenv}, capture_output=True, text=True, check=False)
    note(f"versions (exporter env): {(versions.stdout or versions.stderr).strip()}")
    src = build_dir(dev, a.src)
    note(f"specwatch: {build_of(run, src, site)}")
    nginx, nginx_env = ("", {}) if "nginx" in skip else nginx_binary(run, dev, run.work)
    if "nginx" in skip:
        note("nginx: skipped (--skip)")
    have_ref = (dev / "src-ref" / "specwatch").is_dir() and "specwatch-ref" not in skip
    if (dev / "src-ref" / "specwatch").is_dir() and not have_ref:
        note("specwatch-ref: skipped (--skip)")

    cpu = parse_cpus(a.cpus) if a.cpus else cpu_plan(a.stub_processes, a.client_processes, a.specwatch_workers,
                                                      have_ref, router_ok)
    if a.fronts and "bare" not in cpu:  # the router's and the reference's cores, where unused
        if router_ok or have_ref or "router" not in cpu or "specwatchref" not in cpu:
            sys.exit("run_pinned.py: --fronts needs cores: pass --cpus with bare=N aiobare=M, "
                     "or leave vllm-router and src-ref out")
        cpu["bare"], cpu["aiobare"] = cpu["router"], cpu["specwatchref"]
    for role in ("stub", "client", "nginx", "specwatch", "sampler"):
        if role not in cpu:
            sys.exit(f"run_pinned.py: --cpus has no {role}")
    if router_ok and "router" not in cpu:
        router_ok = False
        note("vllm-router: no core in the cpu plan, left out")
    plan = " ".join(f"{k}={v}" for k, v in cpu.items())
    note(f"cpu plan: {plan}")
    if a.stub_processes > 1 or a.client_processes > 1:
        note(f"stub processes: {a.stub_processes} on CPU(s) {cpu['stub']}; client processes: {a.client_processes} "
             f"on CPU(s) {cpu['client']}")

    up = free_port()
    run.start("stub", cpu["stub"], [sys.executable, str(HERE / "stub_upstream.py"), "--port", str(up), "--chunks",
                                    str(a.chunks), "--interval-ms", str(a.interval_ms), "--ttft-ms", str(a.ttft_ms),
                                    *(["--processes", str(a.stub_processes)] if a.stub_processes > 1 else [])], pyenv)
    if not run.wait_up("stub", up, 30, "/health"):
        sys.exit("run_pinned.py: the stub did not start")
    targets: list[str] = []
    meta = [f"host={platform.node()} {os.cpu_count()} CPUs (many-core benchmark host)",
            f"stub=chunks {a.chunks}, interval {a.interval_ms} ms, ttft {a.ttft_ms} ms",
            f"pinning={plan} (sched_setaffinity, as taskset -c; every thread of a process inherits its set)"]
    if a.stub_processes > 1:
        meta.append(f"stub_processes={a.stub_processes} (SO_REUSEPORT, one event loop each, on CPUs {cpu['stub']})")
    if a.client_processes > 1:
        meta.append(f"client_processes={a.client_processes} (forked, one event loop each, on CPUs {cpu['client']})")

    def proxy(name: str, cpus: str, argv: list[str], port: int, health: str | None, env: dict[str, str],
              desc: str, required: bool = True) -> bool:
        run.start(name, cpus, argv, env)
        if not run.wait_up(name, port, 60, health):
            if required:
                sys.exit(f"run_pinned.py: {name} did not start")
            note(f"{name}: FAILED to start, left out: {' '.join(run.tail(name, 5).splitlines())}")
            run.stop(name)
            return False
        targets.append(f"{name}=http://127.0.0.1:{port}@{run.pid(name)}")
        meta.append(f"{name}={desc}")
        return True

    if nginx:
        port, d = free_port(), run.dir / "nginx"
        (d / "tmp").mkdir(parents=True)
        (d / "nginx.conf").write_text(NGINX_CONF.format(d=d, up=up, port=port))
        version = subprocess.run([nginx, "-v"], capture_output=True, text=True, env={**os.environ, **nginx_env},
                                 check=False).stderr.strip().split("version: ")[-1]
        proxy("nginx", cpu["nginx"], [nginx, "-p", str(d), "-c", str(d / "nginx.conf"), "-e", str(d / "error.log")],
              port, "/health", nginx_env, f"{version} (Debian bookworm package), 1 worker, keepalive upstream, "
              "proxy_buffering off, access_log off", required=False)
    if router_ok:
        port, metrics_port = free_port(), free_port()
        renv = py_env(site_router, site)
        rver = subprocess.run([sys.executable, "-c", "from vllm_router.version import __version__ as v; print(v)"],
                              env={**os.environ, **renv}, capture_output=True, text=True, check=False)
        note(f"vllm-router: {(rver.stdout or rver.stderr).strip()}")
        launcher = site_router / "bin" / "vllm-router"
        cmd = [sys.executable, *([str(launcher)] if launcher.exists() else ["-m", "vllm_router.launch_router"])]
        proxy("router", cpu["router"], [*cmd, "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                                        f"http://127.0.0.1:{up}", "--policy", "round_robin", "--prometheus-host",
                                        "127.0.0.1", "--prometheus-port", str(metrics_port)],
              port, "/v1/models", renv,
              f"{rver.stdout.strip()}, round_robin, all threads pinned to CPU {cpu['router']}",
              required=False)

    def exporter(name: str, cpus: str, build: Path, extra: list[str], desc: str) -> int:
        port = free_port()
        proxy(name, cpus, [sys.executable, "-m", "specwatch.cli", "exporter", "--upstream",
                           f"baseline=http://127.0.0.1:{up}", "--web.listen-address", f"127.0.0.1:{port}", *extra],
              port, "/healthz", py_env(build, site), desc)
        return port

    commit = (src / "COMMIT").read_text().strip()[:12] if (src / "COMMIT").exists() else "?"
    metrics_ports: dict[str, int] = {}
    if "specwatch" in skip:
        note("specwatch (one process): skipped (--skip)")
    else:
        metrics_ports["specwatch"] = exporter(
            "specwatch", cpu["specwatch"], src, [], "python3 -m specwatch.cli exporter --upstream "
            f"baseline=http://127.0.0.1:{{UP}} --web.listen-address 127.0.0.1:{{PORT}} (commit {commit}, uvloop.run)")
    if have_ref:
        if "specwatchref" not in cpu:
            sys.exit("run_pinned.py: --cpus has no specwatchref (needed for .devperf/src-ref)")
        ref = dev / "src-ref"
        note(f"specwatch-ref: {build_of(run, ref, site)}")
        ref_commit = (ref / "COMMIT").read_text().strip()[:12] if (ref / "COMMIT").exists() else "?"
        metrics_ports["specwatch-ref"] = exporter(
            "specwatch-ref", cpu["specwatchref"], ref, [],
            f"the same command from .devperf/src-ref (commit {ref_commit}), pinned to CPU {cpu['specwatchref']}")
    if a.specwatch_workers > 0:
        if "specwatchw" not in cpu:
            sys.exit("run_pinned.py: --cpus has no specwatchw (needed for --specwatch-workers)")
        name = f"specwatch-w{a.specwatch_workers}"
        metrics_ports[name] = exporter(name, cpu["specwatchw"], src, ["--workers", str(a.specwatch_workers)],
                                       f"the specwatch command with --workers {a.specwatch_workers}, its process "
                                       f"tree pinned to CPUs {cpu['specwatchw']}")
    if a.fronts:
        for front, core, extra in (("bare", cpu["bare"], []),
                                   ("aiohttp-bare", cpu["aiobare"], ["--aiohttp", "--handler-cancellation"])):
            port = free_port()
            proxy(front, core, [sys.executable, str(HERE / "raw_front.py"), "--upstream", f"http://127.0.0.1:{up}",
                                "--port", str(port), *extra], port, None, py_env(src, site),
                  f"bench/perf/raw_front.py {' '.join(extra)} (a bare front over the tap's upstream client, "
                  f"no accounting), pinned to CPU {core}")
    for vi, variant in enumerate(a.variant, 1):
        name, _, flags = variant.partition("=")
        core = cpu.get(f"variant{vi}", str(11 + vi))
        if int(core.split(",")[0]) >= (os.cpu_count() or 1):
            sys.exit(f"run_pinned.py: --variant {name}: no core {core} here (pass --cpus with variant{vi}=N)")
        exporter(name, core, src, flags.split(), f"the specwatch command with {flags}, pinned to CPU {core}")

    key = "sk-" + secrets.token_hex(24)
    specs = [(t.split("=", 1)[0], t.split("=", 1)[1].rsplit("@", 1)[0]) for t in targets]
    lines = asyncio.run(smoke([("direct", f"http://127.0.0.1:{up}"), *specs], key))
    for line in lines:
        note(line)
    if any("FAILED" in line for line in lines):
        sys.exit("run_pinned.py: a warm-up stream failed")
    if a.probe and metrics_ports:
        port = next(iter(metrics_ports.values()))
        note(f"exporter /metrics after the smoke test: {exporter_metrics(port, ('specwatch_requests_total',))}")
    run.affinity_report()
    roots = [f"{t.split('=', 1)[0]}={t.rsplit('@', 1)[1]}" for t in targets] + [f"stub={run.pid('stub')}"]
    run.start("sampler", cpu["sampler"], [sys.executable, str(HERE / "run_pinned.py"), "--sample-rss",
                                          str(run.dir / "rss.tsv"), *roots], {"PYTHONSAFEPATH": ""})

    conc, reqs, rounds, max_s, budget = a.concurrency, a.requests, a.rounds, a.max_seconds, a.level_budget_s
    if a.probe:
        conc, reqs, rounds, max_s, budget = "1,256", "1:4,256:256", 1, 120.0, 60.0
    log(f"benchmark: {len(targets)} proxies + direct + direct-aa, concurrency {conc}, requests {reqs}, rounds {rounds}")
    note(f"bench: concurrency {conc}, requests {reqs}, rounds {rounds}, max-seconds {max_s:g}, "
         f"level budget {budget:g} s")
    client = ["--client-processes", str(a.client_processes)] if a.client_processes > 1 else []
    common = [f"--direct=http://127.0.0.1:{up}@{run.pid('stub')}", *targets, "--rounds", str(rounds),
              "--level-budget-s", str(budget), "--quiet-below", str(a.quiet_below), "--quiet-wait-s",
              str(a.quiet_wait_s), "--upstream-desc",
              f"stub_upstream.py: {a.chunks} chunks, {a.interval_ms} ms apart, TTFT {a.ttft_ms} ms",
              *(f"--meta={m}" for m in meta), *client, "--aa"]
    env = {**pyenv, "PROXY_BENCH_API_KEY": key}
    rc = run_bench(run, cpu["client"], env, [*common, "--concurrency", conc, "--requests", reqs, "--max-seconds",
                                             str(max_s), "--out-json", prefix + ".json", "--out-md", prefix + ".md"],
                   max_s + 40, "bench")
    if a.stagger_ms and not a.probe:
        log(f"benchmark, staggered: --stagger-ms {a.stagger_ms:g}, concurrency {a.stagger_concurrency}, "
            f"requests {a.stagger_requests}")
        note(f"bench (staggered): --stagger-ms {a.stagger_ms:g}, concurrency {a.stagger_concurrency}, requests "
             f"{a.stagger_requests}, rounds {rounds}, max-seconds {a.stagger_max_seconds:g}")
        rc = run_bench(run, cpu["client"], env, [*common, "--stagger-ms", str(a.stagger_ms), "--concurrency",
                                                 a.stagger_concurrency, "--requests", a.stagger_requests,
                                                 "--max-seconds", str(a.stagger_max_seconds), "--out-json",
                                                 prefix + "-stagger.json", "--out-md", prefix + "-stagger.md"],
                       a.stagger_max_seconds + 40, "bench-stagger") or rc
    for name, port in metrics_ports.items():  # which exporters relayed over the compiled relay thread
        note(f"{name} /metrics after the bench: " + exporter_metrics(port, (
            "specwatch_fast_relay_chunks_total", "specwatch_fast_relay_handovers_total", "specwatch_requests_total")))
    time.sleep(0.6)  # one more RSS sample after the last block
    run.affinity_report()
    run.stop("sampler")
    out_dir = Path(prefix).parent
    for f in ("rss.tsv", "bench.log"):
        if (run.dir / f).exists():
            shutil.copy(run.dir / f, out_dir / f)
    try:
        rss_report(prefix, run.dir / "rss.tsv", run.dir / "bench.log", run.env_txt)
    except (OSError, ValueError, KeyError) as exc:
        log(f"post-processing failed: {exc!r}")
    log(f"results: {prefix}.md and {prefix}.json (bench exit {rc}; logs in {run.dir})")
    return rc


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of `pid`: its name and CPU seconds (utime + stime) so far (the event loop, the relay thread)."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, fields = task.joinpath("stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        f = fields.split()
        out[int(task.name)] = (name.split("(", 1)[1], (int(f[11]) + int(f[12])) / tick)
    return out


def per_request_or_profile(a: argparse.Namespace, dev: Path, out: Path) -> int:
    """--per-request: the exporter, the bare fronts and src-ref priced by per_request.py, --rounds times;
    --profile: py-spy samples the exporter of --src while per_request.py runs, stacks folded by stack_shares.py."""
    profile = a.profile
    cpu = parse_cpus(a.cpus or ("stub=0 exporter=2 spy=4 client=6" if profile else
                                "stub=0 exporter=2 bare=3 aiohttp=4 ref=5 client=6"))
    n = a.n or (8000 if profile else 4000)
    out.mkdir(parents=True, exist_ok=True)
    run = Run(Path(os.environ.get("PERF_WORK", "/tmp/perfdev")), out / "env.txt")
    try:
        site: Path | None = None
        if not a.no_install:
            site = run.work / "site"
            if not pip_target(site, sorted(glob.glob(str(dev / "whl" / "*.whl"))), run.dir / "pip-site.log"):
                sys.exit("run_pinned.py: installing .devperf/whl failed")
        up = free_port()
        shape = ([str(a.chunks), str(a.interval_ms), str(a.ttft_ms)] if a.stream else ["1", "0", "0"])
        stub = run.start("stub", cpu["stub"], [sys.executable, str(HERE / "stub_upstream.py"), "--port", str(up),
                                               "--chunks", shape[0], "--interval-ms", shape[1], "--ttft-ms", shape[2]],
                         py_env(site))
        ports = {"stub": up}

        def front(name: str, cpus: str, build: Path, argv: list[str]) -> int:
            port = free_port()
            ports[name] = port
            return run.start(name, cpus, [sys.executable, *argv, str(port)], py_env(build, site))

        exporter = ["-m", "specwatch.cli", "exporter", "--upstream", f"baseline=http://127.0.0.1:{up}",
                    "--web.listen-address"]
        src = build_dir(dev, a.src)
        port = free_port()
        ports["exporter"] = port
        exp = run.start("exporter", cpu["exporter"], [sys.executable, *exporter, f"127.0.0.1:{port}"],
                        py_env(src, site))
        targets = [f"direct=http://127.0.0.1:{up}@{stub}", f"specwatch=http://127.0.0.1:{port}@{exp},{stub}"]
        if not profile:
            for name, extra in (("bare", []), ("aiohttp", ["--aiohttp", "--handler-cancellation"])):
                pid = front(name, cpu["bare" if name == "bare" else "aiohttp"], src,
                            [str(HERE / "raw_front.py"), *extra, "--upstream", f"http://127.0.0.1:{up}", "--port"])
                targets.append(f"{'aiohttp-bare' if extra else 'bare'}=http://127.0.0.1:{ports[name]}@{pid},{stub}")
            if (dev / "src-ref").is_dir():
                rport = free_port()
                ports["ref"] = rport
                rpid = run.start("ref", cpu["ref"], [sys.executable, *exporter, f"127.0.0.1:{rport}"],
                                 py_env(dev / "src-ref", site))
                targets.append(f"specwatch-ref=http://127.0.0.1:{rport}@{rpid},{stub}")
        for name, port in ports.items():
            if not run.wait_up(name, port, 10):
                sys.exit(f"run_pinned.py: port {port} ({name}) did not open")
        client = ["taskset", "-c", cpu["client"], sys.executable, str(HERE / "per_request.py"), "-n", str(n),
                  "--burst", "64", *(["--burst-only"] if a.stream else [])]
        env = {**os.environ, **py_env(site)}
        commit = (src / "COMMIT").read_text().strip() if (src / "COMMIT").exists() else "unknown"
        if profile:
            spy = dev / "bin" / "py-spy"
            spy_bin = str(spy) if os.access(spy, os.X_OK) else shutil.which("py-spy")
            if not spy_bin:
                sys.exit(f"run_pinned.py: no py-spy in {dev / 'bin'} or PATH")
            tag = f"profile-stream-{src.name}" if a.stream else f"profile-{src.name}"
            stacks, text = out / f"{tag}.stacks", out / f"{tag}.txt"
            run.start("spy", cpu["spy"], [spy_bin, "record", "--pid", str(exp), "--rate", str(a.rate), "--format",
                                          "raw", "--native" if a.native else "--nonblocking", "-o", str(stacks)])
            time.sleep(1)
            stream = (f" --burst-only, stub --chunks {shape[0]} --interval-ms {shape[1]} --ttft-ms {shape[2]}"
                      if a.stream else "")
            head = (f"# run_pinned.py --profile: {src.name} ({commit}), per_request.py -n {n} --burst 64{stream}, "
                    f"py-spy --rate {a.rate}")
            before = thread_cpu(exp)
            body = subprocess.run([*client, targets[1]], env=env, capture_output=True, text=True, check=True).stdout
            after = thread_cpu(exp)
            body += "".join(f"# thread {tid} {name}: {after[tid][1] - before.get(tid, (name, 0.0))[1]:.2f} CPU s\n"
                            for tid, (name, _) in sorted(after.items()))
            os.kill(run.pid("spy"), signal.SIGINT)
            run.procs.pop("spy").wait()
            shares = subprocess.run([sys.executable, str(HERE / "stack_shares.py"), str(stacks), "--top", "45"],
                                    capture_output=True, text=True, check=False).stdout
            text.write_text(f"{head}\n{body}{shares}")
            print(text.read_text())
            return 0
        ref = f", specwatch-ref {(dev / 'src-ref' / 'COMMIT').read_text().strip()}" if "ref" in ports else ""
        plan = " ".join(f"{k}={v}" for k, v in cpu.items())
        lines = [f"# per_request.py -n {n} --burst 64, {a.rounds or 3} rounds; cpus: {plan}; "
                 f"exporter commit {commit}{ref}"]
        print(lines[0])
        for r in range(1, (a.rounds or 3) + 1):
            done = subprocess.run([*client, *targets], env=env, capture_output=True, text=True, check=True)
            for line in done.stdout.splitlines():
                lines.append(f"round {r} {line}")
                print(lines[-1], flush=True)
        (out / "per-request-fronts.txt").write_text("\n".join(lines) + "\n")
        return 0
    finally:
        run.close(None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probe", action="store_true", help="start everything, one stream per path, a tiny bench")
    p.add_argument("--concurrency", default="1,16,64,256")
    p.add_argument("--requests", default="1:64,16:512,64:1024,256:2048")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4; --per-request: 3)")
    p.add_argument("--chunks", type=int, default=64, help="the stub's content chunks per stream")
    p.add_argument("--interval-ms", type=float, default=10)
    p.add_argument("--ttft-ms", type=float, default=20)
    p.add_argument("--max-seconds", type=float, default=480)
    p.add_argument("--level-budget-s", type=float, default=230)
    p.add_argument("--out-prefix", default="")
    p.add_argument("--cpus", default="", help="'stub=0,1 client=2,3 nginx=4 router=5 specwatch=6 specwatchref=7 "
                   "sampler=15' (plus specwatchw, bare, aiobare, variantN; --per-request: stub exporter bare aiohttp "
                   "ref client; --profile: stub exporter spy client)")
    p.add_argument("--quiet-below", type=float, default=0.3)
    p.add_argument("--quiet-wait-s", type=float, default=30)
    p.add_argument("--specwatch-workers", type=int, default=0)
    p.add_argument("--stagger-ms", type=float, default=0)
    p.add_argument("--stagger-concurrency", default="64,256")
    p.add_argument("--stagger-requests", default="64:512,256:1024")
    p.add_argument("--stagger-max-seconds", type=float, default=120)
    p.add_argument("--stub-processes", type=int, default=1)
    p.add_argument("--client-processes", type=int, default=1)
    p.add_argument("--skip", default="", help=f"comma list of {', '.join(ROLES)}")
    p.add_argument("--fronts", action="store_true")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS")
    p.add_argument("--src", default="src", help="the specwatch build measured as specwatch: a folder of DEVPERF "
                   "(src, src-ref) or a path (default src)")
    p.add_argument("--no-install", action="store_true",
                   help="this python's own packages instead of DEVPERF/whl (a local try; the host needs the wheels)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--per-request", action="store_true", help="per_request.py against the exporter and the fronts")
    mode.add_argument("--profile", action="store_true", help="py-spy on the exporter of --src under per_request.py")
    p.add_argument("-n", type=int, default=0, help="--per-request / --profile: requests (default 4000 / 8000)")
    p.add_argument("--rate", type=int, default=997, help="--profile: py-spy samples per second")
    p.add_argument("--native", action="store_true", help="--profile: native frames too (pauses per sample)")
    p.add_argument("--stream", action="store_true",
                   help="--profile: the stub streams --chunks chunks --interval-ms apart (the bench's streams, so "
                        "the compiled relay and the stream ends are in it), bursts of 64 only; CPU per thread")
    a = p.parse_args(argv)
    bad = [s for s in a.skip.split(",") if s and s not in ROLES]
    if bad:
        p.error(f"--skip: unknown path {bad[0]}")
    if a.stub_processes < 1 or a.client_processes < 1:
        p.error("--stub-processes and --client-processes take a count >= 1")
    if any("=" not in v for v in a.variant):
        p.error("--variant takes NAME=FLAGS")
    return a


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--sample-rss"]:
        sample_rss(args[1], args[2:])
        return 0
    a = parse_args(args)
    dev = Path(os.environ.get("DEVPERF") or HERE.parent.parent / ".devperf").resolve()
    res_dir = Path(os.environ.get("RESULTS_DIR") or Path(os.environ.get("PERF_WORK", "/tmp/perfdev")) / "out")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    if a.per_request or a.profile:
        if not os.environ.get("RESULTS_DIR"):
            sys.exit("run_pinned.py: RESULTS_DIR must name a folder for the results")
        return per_request_or_profile(a, dev, res_dir)
    if a.rounds is None:
        a.rounds = 4
    return pinned_bench(a, dev, res_dir)


if __name__ == "__main__":
    sys.exit(main())
