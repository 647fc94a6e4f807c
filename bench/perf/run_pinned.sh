#!/usr/bin/env bash
# The run_peers.sh bench on a quiet many-core machine with no network (a many-core benchmark host),
# every process pinned to its own core(s): the stub upstream, nginx (1 worker), vllm-router and
# the specwatch exporter, then proxy_bench.py (direct, direct-aa, nginx, router, specwatch).
# LiteLLM is left out. Everything it needs travels in .devperf/ (ignored by git):
#   .devperf/whl/        wheels for the stub, the client and the exporter (aiohttp 3.14.5 and its
#                        needs, prometheus_client 0.26.0, uvloop 0.23.0, pyyaml 6.0.4)
#   .devperf/whl-router/ vllm-router 0.1.17 and the needs of its launcher (fastapi, uvicorn, ...)
#   .devperf/deb/        Debian's nginx + nginx-common (.deb), unpacked with dpkg -x into /tmp/nginx;
#   .devperf/deb/fallback/ libraries nginx links against, used only where ldd reports one missing
#   .devperf/src/        the project's `specwatch` package (and COMMIT, the commit it came from)
#   .devperf/src-ref/    optional: a second `specwatch` package (another commit), measured as `specwatch-ref`
#                        on its own core in the same rounds (before / after under the same conditions)
# bench/perf/assemble_devperf.sh builds that folder. Origin: ../shared/perf/run_pinned.sh (the issue 18
# reference run, results-pinned-16core-2026-12-01.md), brought into the repo with the src-ref addition.
#
# Usage: run_pinned.sh [--probe] [--concurrency 1,16,64,256] [--requests 1:64,16:512,64:1024,256:2048]
#                      [--rounds 4] [--chunks 64] [--interval-ms 10] [--ttft-ms 20]
#                      [--max-seconds 480] [--level-budget-s 230] [--out-prefix PATH]
#                      [--cpus 'stub=0,1 client=2,3 nginx=4 router=5 specwatch=6 specwatchref=7 sampler=15']
#                      [--quiet-below 0.3] [--quiet-wait-s 30]
#                      [--specwatch-workers N] [--stagger-ms MS --stagger-concurrency 64,256
#                       --stagger-requests 64:512,256:1024 --stagger-max-seconds 120]
#                      [--stub-processes N] [--client-processes P] [--skip nginx,router,specwatch,specwatch-ref]
#                      [--fronts] [--variant NAME=FLAGS ...]
# --specwatch-workers N: also measure `specwatch exporter --workers N` (this checkout's build) as
#   `specwatch-wN`, its process tree pinned to the cpu plan's `specwatchw` set (default 8-11).
# --stagger-ms MS: after the lock-step pass, a second pass of the same paths with a desynchronised
#   loop (proxy_bench.py --stagger-ms: random starts within MS, random think 0..MS/10), results in
#   <out-prefix>-stagger.{json,md}: shows how much of the added latency is burst queueing.
# --stub-processes N: the stub as N processes on one port (stub_upstream.py --processes N, SO_REUSEPORT);
# --client-processes P: the client's connections split over P processes (proxy_bench.py
#   --client-processes P). Both default to 1 (as before). For C = 1024: --stub-processes 4
#   --client-processes 4, so neither saturates (1024 streams are ~100k SSE chunks/s to write and parse).
# --skip LIST: leave these paths out (started neither nor measured), e.g. --skip specwatch,specwatch-ref
#   to measure only direct, direct-aa, nginx and specwatch-wN (with --specwatch-workers N).
# --fronts: also measure the two bare fronts of raw_front.py over the tap's own upstream client, each on a
#   core of its own: `bare` (an asyncio.Protocol front: no aiohttp server, no accounting, every chunk
#   relayed in Python) and `aiohttp-bare` (the same work behind an aiohttp handler). They are the floor a
#   Python front of this design starts from: where `bare` itself adds more than a target allows at a
#   level, no Python front on one core meets it there. Their cores are the plan's `bare` and `aiobare`
#   (by default the router's and specwatchref's, which must then be unused: no vllm-router, no src-ref).
# --variant NAME=FLAGS (repeatable): also measure this checkout's exporter started with FLAGS added (e.g.
#   'specwatch-py=--no-fast-relay'), as path NAME, each on a core of its own: the plan's variant1,
#   variant2, ... (by default the cores 12, 13, 14, free in the 16-core plan without --stub-processes).
# --probe: start everything, send one streamed request through each path, print the machine's
# topology, versions and affinities, run a tiny bench (C=1 and C=256, one round), and stop.
# Without --cpus the cores are chosen from the topology: one logical CPU per physical core, in
# order (stub 2, client 2, nginx 1, router 1, specwatch 1, RSS sampler the last core), so no two
# roles share a physical core when the machine shows SMT siblings; without SMT this is
# stub 0,1 / client 2,3 / nginx 4 / router 5 / specwatch 6 / sampler 15.
# With --stub-processes or --client-processes above 2 the plan gives the stub max(2, N) and the client
# max(2, P) cores, then nginx 1, specwatch 1, then what still fits before the sampler's last core, in
# this order and only where used: specwatchw 4 (--specwatch-workers), specwatchref 1 (.devperf/src-ref),
# router 1 (installed); on 16 cores with 4 and 4: stub 0-3 / client 4-7 / nginx 8 / specwatch 9 /
# specwatchw 10-13 / specwatchref 14 / sampler 15 (the router, left without a core, is left out and
# noted; --specwatch-workers or .devperf/src-ref without one stop the run: pass --cpus or --skip).
# Results: <out-prefix>.{json,md} (default $RESULTS_DIR/results-pinned-<date>), plus bench.log, rss.tsv,
# env.txt and logs.tgz beside them. Every process it started is stopped by PID on exit.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DEV=$(cd "${DEVPERF:-$ROOT/.devperf}" && pwd)
WORK=${PERF_WORK:-/tmp/perfdev}
DATE=$(date +%Y-%m-%d)
RESDIR=${RESULTS_DIR:-$WORK/out}

PROBE=0
CONC="1,16,64,256"
REQS="1:64,16:512,64:1024,256:2048"
ROUNDS=4
CHUNKS=64
INTERVAL=10
TTFT=20
MAXSEC=480
LEVEL_BUDGET=230
PREFIX=""
CPUS=""
QUIET_BELOW=0.3
QUIET_WAIT=30
SW_WORKERS=0
STAGGER=0
STAGGER_CONC="64,256"
STAGGER_REQS="64:512,256:1024"
STAGGER_MAXSEC=120
STUB_PROCS=1
CLIENT_PROCS=1
SKIP=""
FRONTS=0
VARIANTS=()

die() { echo "run_pinned.sh: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --probe) PROBE=1; shift ;;
    --concurrency) CONC="$2"; shift 2 ;;
    --requests) REQS="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --chunks) CHUNKS="$2"; shift 2 ;;
    --interval-ms) INTERVAL="$2"; shift 2 ;;
    --ttft-ms) TTFT="$2"; shift 2 ;;
    --max-seconds) MAXSEC="$2"; shift 2 ;;
    --level-budget-s) LEVEL_BUDGET="$2"; shift 2 ;;
    --out-prefix) PREFIX="$2"; shift 2 ;;
    --cpus) CPUS="$2"; shift 2 ;;
    --quiet-below) QUIET_BELOW="$2"; shift 2 ;;
    --quiet-wait-s) QUIET_WAIT="$2"; shift 2 ;;
    --specwatch-workers) SW_WORKERS="$2"; shift 2 ;;
    --stagger-ms) STAGGER="$2"; shift 2 ;;
    --stagger-concurrency) STAGGER_CONC="$2"; shift 2 ;;
    --stagger-requests) STAGGER_REQS="$2"; shift 2 ;;
    --stagger-max-seconds) STAGGER_MAXSEC="$2"; shift 2 ;;
    --stub-processes) STUB_PROCS="$2"; shift 2 ;;
    --client-processes) CLIENT_PROCS="$2"; shift 2 ;;
    --skip) SKIP="$2"; shift 2 ;;
    --fronts) FRONTS=1; shift ;;
    --variant) [[ "$2" == *=* ]] || die "--variant takes NAME=FLAGS"; VARIANTS+=("$2"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
[[ "$STUB_PROCS" =~ ^[1-9][0-9]*$ && "$CLIENT_PROCS" =~ ^[1-9][0-9]*$ ]] \
  || die "--stub-processes and --client-processes take a count >= 1"
for s in ${SKIP//,/ }; do
  case "$s" in nginx|router|specwatch|specwatch-ref) ;; *) die "--skip: unknown path $s" ;; esac
done
skipped() { [[ ",$SKIP," == *",$1,"* ]]; }
PREFIX=${PREFIX:-$RESDIR/results-pinned-$DATE}
mkdir -p "$WORK" "$(dirname "$PREFIX")"
RUN="$WORK/run-$(date +%Y%m%d-%H%M%S)"
mkdir -p "$RUN"
ENVTXT="$(dirname "$PREFIX")/env.txt"
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }
note() { echo "$*" | tee -a "$ENVTXT" >&2; }
: >"$ENVTXT"

# ---------------------------------------------------------------- process bookkeeping
PIDS=()
NAMES=()
children() {  # direct children of PID $1, from /proc (no ps needed)
  local f line rest fields
  for f in /proc/[0-9]*/stat; do
    { read -r line <"$f"; } 2>/dev/null || continue
    rest=${line##*) }
    read -r -a fields <<<"$rest"
    [[ "${fields[1]}" == "$1" ]] && { f=${f#/proc/}; echo "${f%/stat}"; }
  done
  return 0
}
descendants() { local k; for k in $(children "$1"); do echo "$k"; descendants "$k"; done; }
stop_pid() {  # TERM a started PID and its descendants, KILL whatever is left after 10 s
  local pid=$1 name=$2 all p i alive
  kill -0 "$pid" 2>/dev/null || return 0
  all="$pid $(descendants "$pid" | tr '\n' ' ')"
  for p in $all; do kill -TERM "$p" 2>/dev/null || true; done
  for i in $(seq 100); do
    alive=0
    for p in $all; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.1
  done
  for p in $all; do
    if kill -0 "$p" 2>/dev/null; then log "killing $name PID $p"; kill -KILL "$p" 2>/dev/null || true; fi
  done
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local i
  for (( i=${#PIDS[@]}-1; i>=0; i-- )); do stop_pid "${PIDS[$i]}" "${NAMES[$i]}"; done
  log "stopped: ${NAMES[*]:-nothing}"
  if [[ -d "$RUN" ]]; then tar -czf "$(dirname "$PREFIX")/logs.tgz" -C "$WORK" "$(basename "$RUN")" 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# pinning: taskset where it exists, else a Python exec wrapper (same PID either way)
cat >"$WORK/pin.py" <<'EOF'
import os, sys
os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(",")})
os.execvp(sys.argv[2], sys.argv[2:])
EOF
if command -v taskset >/dev/null; then PIN=(taskset -c); else PIN=(python3 "$WORK/pin.py"); fi

# Every process starts in $RUN with PYTHONSAFEPATH: run from the checkout's root, `python3 -m specwatch.cli`
# would import the checkout's own specwatch/ (the working directory comes first on sys.path), not
# .devperf/src or src-ref, and both builds would be the same code (the 2026-12-02 runs were).
export PYTHONSAFEPATH=1
start() {  # start NAME CPUS CMD...: pinned, in the background, its PID remembered
  local name=$1 cpus=$2; shift 2
  ( cd "$RUN" && exec "${PIN[@]}" "$cpus" "$@" ) >"$RUN/$name.log" 2>&1 &
  PIDS+=("$!"); NAMES+=("$name")
  log "started $name PID $! on CPU(s) $cpus"
}
pid_of() { local i; for i in "${!NAMES[@]}"; do [[ "${NAMES[$i]}" == "$1" ]] && echo "${PIDS[$i]}"; done; return 0; }

HTTP_OK='import sys, urllib.request as u
o = u.build_opener(u.ProxyHandler({}))
o.open(sys.argv[1], timeout=2).read()'
wait_http() {  # wait_http NAME URL SECONDS: until URL answers 2xx
  local name=$1 url=$2 secs=$3 pid
  pid=$(pid_of "$name")
  for _ in $(seq $((secs * 4))); do
    if python3 -c "$HTTP_OK" "$url" >/dev/null 2>&1; then return 0; fi
    kill -0 "$pid" 2>/dev/null || { tail -30 "$RUN/$name.log" >&2; log "$name exited during start-up"; return 1; }
    sleep 0.25
  done
  tail -30 "$RUN/$name.log" >&2
  log "$name did not answer $url within $secs s"
  return 1
}
wait_port() {  # wait_port NAME PORT SECONDS
  local name=$1 port=$2 secs=$3 pid
  pid=$(pid_of "$name")
  for _ in $(seq $((secs * 4))); do
    if python3 -c "import socket; socket.create_connection(('127.0.0.1',$port),1)" 2>/dev/null; then return 0; fi
    kill -0 "$pid" 2>/dev/null || { tail -30 "$RUN/$name.log" >&2; die "$name exited during start-up"; }
    sleep 0.25
  done
  tail -30 "$RUN/$name.log" >&2
  die "$name did not listen on 127.0.0.1:$port within $secs s"
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# streamed requests through each NAME=URL (2 each); prints a one-line summary per path, fails without [DONE]
cat >"$WORK/sse_check.py" <<'EOF2'
import http.client, json, sys, time
from urllib.parse import urlsplit
key, specs = sys.argv[1], sys.argv[2:]
body = json.dumps({"model": "stub-model", "stream": True, "messages": [{"role": "user", "content": "warm-up"}],
                   "stream_options": {"include_usage": True}})
bad = 0
for spec in specs:
    name, url = spec.split("=", 1)
    u = urlsplit(url.rsplit("@", 1)[0] if "@" in url.split("//", 1)[1] else url)
    for i in range(2):
        try:
            c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
            t0 = time.perf_counter()
            c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json",
                      "Authorization": "Bearer " + key})
            r = c.getresponse()
            data = r.read().decode()
            dt = time.perf_counter() - t0
            c.close()
        except OSError as exc:
            print(f"smoke {name}: FAILED {exc!r}"); bad += 1; break
        n = data.count('"content":') - 1
        ok = r.status == 200 and "data: [DONE]" in data
        usage = '"usage"' in data
        if i == 1 or not ok:
            print(f"smoke {name}: HTTP {r.status}, {len(data)} bytes, {n} content chunks, usage={usage}, "
                  f"[DONE]={ok}, {dt*1000:.0f} ms, server={r.getheader('Server')}, "
                  f"content-type={r.getheader('Content-Type')}, te={r.getheader('Transfer-Encoding')}")
        if not ok:
            print(data[:500]); bad += 1; break
sys.exit(1 if bad else 0)
EOF2

# ---------------------------------------------------------------- environment + installs
note "# run_pinned.sh $(date -Is) on $(uname -n): $(nproc) CPUs online, kernel $(uname -r)"
note "python3: $(command -v python3) $(python3 -V 2>&1)"
note "pinning via: ${PIN[*]}"
if command -v lscpu >/dev/null; then lscpu | grep -E '^(Model name|Thread|Core|Socket|CPU\(s\)|NUMA node)' | tee -a "$ENVTXT" >&2 || true; fi
note "thread siblings: $(for c in /sys/devices/system/cpu/cpu[0-9]*; do printf '%s:%s ' "${c##*cpu}" "$(cat "$c/topology/thread_siblings_list" 2>/dev/null)"; done)"
note "load before start: $(cat /proc/loadavg)"

SITE="$WORK/site"; SITE_ROUTER="$WORK/site-router"
rm -rf "$SITE" "$SITE_ROUTER"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$DEV"/whl/*.whl \
  >"$RUN/pip-site.log" 2>&1 || { cat "$RUN/pip-site.log" >&2; die "installing .devperf/whl failed"; }
ROUTER_OK=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE_ROUTER" "$DEV"/whl-router/*.whl \
  >"$RUN/pip-router.log" 2>&1 || { cat "$RUN/pip-router.log" >&2; ROUTER_OK=0; note "vllm-router: install FAILED, left out"; }
SRC="$DEV/src"
PYENV=(env PYTHONPATH="$SITE" PYTHONUNBUFFERED=1)
note "versions (exporter env): $("${PYENV[@]}" python3 - <<'EOF2' 2>&1
import aiohttp, multidict, yarl, uvloop, yaml
from importlib.metadata import version
print(f"aiohttp {aiohttp.__version__}, multidict {multidict.__version__}, yarl {yarl.__version__}, "
      f"uvloop {uvloop.__version__}, pyyaml {yaml.__version__}, prometheus_client {version('prometheus_client')}")
EOF2
)"
note "versions the host had before (no PYTHONPATH): $(python3 - <<'EOF2' 2>&1
from importlib.metadata import version
out = []
for n in ("aiohttp", "multidict", "yarl", "uvloop", "PyYAML", "prometheus_client"):
    try:
        out.append(f"{n} {version(n)}")
    except Exception as exc:
        out.append(f"{n} -")
print(", ".join(out))
EOF2
)"
build_of() {  # build_of DIR: the specwatch a process started as `start` starts it imports, or die
  local dir=$1 file
  file=$(cd "$RUN" && env PYTHONPATH="$dir:$SITE" python3 -c 'import specwatch; print(specwatch.__file__)' 2>&1)
  [[ "$file" == "$dir/specwatch/__init__.py" ]] || die "specwatch from $dir imports $file instead"
  echo "$(cd "$RUN" && env PYTHONPATH="$dir:$SITE" python3 -c 'import specwatch; print(specwatch.__version__)') at $file, commit $(cat "$dir/COMMIT" 2>/dev/null || echo unknown)"
}
note "specwatch: $(build_of "$SRC")"

# nginx: Debian's package, unpacked (never into /)
NGX_ROOT=/tmp/nginx
NGINX=""
NGX_ENV=(env)
rm -rf "$NGX_ROOT"; mkdir -p "$NGX_ROOT"
if ls "$DEV"/deb/*.deb >/dev/null 2>&1; then
  for f in "$DEV"/deb/*.deb; do dpkg -x "$f" "$NGX_ROOT"; done
  NGINX="$NGX_ROOT/usr/sbin/nginx"
  if ldd "$NGINX" 2>&1 | grep 'not found' >/dev/null; then
    note "nginx: missing libraries on this machine: $(ldd "$NGINX" 2>&1 | grep 'not found' | awk '{print $1}' | tr '\n' ' ')"
    mkdir -p "$WORK/ngxlibs"
    for f in "$DEV"/deb/fallback/*.deb; do dpkg -x "$f" "$WORK/ngxlibs"; done
    NGX_ENV=(env LD_LIBRARY_PATH="$WORK/ngxlibs/usr/lib/x86_64-linux-gnu:$WORK/ngxlibs/lib/x86_64-linux-gnu")
    note "nginx: using Debian bookworm's libraries from .devperf/deb/fallback for those"
  fi
  if ! "${NGX_ENV[@]}" "$NGINX" -v >"$RUN/nginx-v.log" 2>&1; then
    note "nginx: does not run here: $(cat "$RUN/nginx-v.log")"; NGINX=""
  else
    note "nginx: $(sed 's/.*version: //' "$RUN/nginx-v.log") (Debian $(ls "$DEV"/deb/nginx_*.deb | sed 's/.*nginx_//; s/_amd64.deb//'))"
    note "nginx ldd: $("${NGX_ENV[@]}" ldd "$NGINX" 2>&1 | awk '{print $1"=>"$3}' | tr '\n' ' ')"
  fi
else
  note "nginx: no .deb in .devperf/deb, left out"
fi

# ---------------------------------------------------------------- CPU plan
if skipped nginx && [[ -n "$NGINX" ]]; then NGINX=""; note "nginx: skipped (--skip)"; fi
if skipped router && [[ $ROUTER_OK == 1 ]]; then ROUTER_OK=0; note "vllm-router: skipped (--skip)"; fi
HAVE_REF=0
if [[ -d "$DEV/src-ref/specwatch" ]]; then
  if skipped specwatch-ref; then note "specwatch-ref: skipped (--skip)"; else HAVE_REF=1; fi
fi
if [[ -z "$CPUS" ]]; then
  CPUS=$(python3 - "$STUB_PROCS" "$CLIENT_PROCS" "$SW_WORKERS" "$HAVE_REF" "$ROUTER_OK" <<'EOF'
import os, sys
stub_n, client_n, sw_workers, have_ref, router_ok = (int(a) for a in sys.argv[1:6])
cpus = sorted(os.sched_getaffinity(0))
groups = {}
for c in cpus:
    try:
        sib = open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list").read().strip()
    except OSError:
        sib = str(c)
    groups.setdefault(sib, []).append(c)
first = [min(g) for g in sorted(groups.values(), key=min)]
if len(first) < 8:          # too few physical cores: fall back to logical CPUs
    first = cpus
if stub_n <= 2 and client_n <= 2:  # the plan of the issue 18 runs, unchanged
    need = [("stub", 2), ("client", 2), ("nginx", 1), ("router", 1), ("specwatch", 1), ("specwatchref", 1)]
    plan, i = [], 0
    for name, n in need:
        plan.append((name, first[i:i + n])); i += n
    if len(first) >= i + 5:  # a --workers exporter: four cores after the others, the sampler stays last
        plan.append(("specwatchw", first[i:i + 4]))
else:  # more stub / client processes: those first, then only the roles this run uses
    need = [("stub", max(2, stub_n)), ("client", max(2, client_n)), ("nginx", 1), ("specwatch", 1)]
    plan, i = [], 0
    for name, n in need:
        plan.append((name, first[i:i + n])); i += n
    for name, n, used in (("specwatchw", 4, sw_workers > 0), ("specwatchref", 1, have_ref),
                          ("router", 1, router_ok)):
        if used and len(first) >= i + n + 1:
            plan.append((name, first[i:i + n])); i += n
plan.append(("sampler", first[-1:] if len(first) > i else first[i - 1:i]))
print(" ".join(f"{k}={','.join(map(str, v))}" for k, v in plan))
EOF
)
fi
declare -A CPU
for kv in $CPUS; do CPU[${kv%%=*}]=${kv#*=}; done
if [[ $FRONTS == 1 && -z "${CPU[bare]:-}" ]]; then  # the router's and the reference's cores, where unused
  [[ $ROUTER_OK == 0 && $HAVE_REF == 0 && -n "${CPU[router]:-}" && -n "${CPU[specwatchref]:-}" ]] \
    || die "--fronts needs cores: pass --cpus with bare=N aiobare=M, or leave vllm-router and src-ref out"
  CPU[bare]=${CPU[router]}; CPU[aiobare]=${CPU[specwatchref]}
  CPUS="$CPUS bare=${CPU[bare]} aiobare=${CPU[aiobare]}"
fi
for r in stub client nginx specwatch sampler; do [[ -n "${CPU[$r]:-}" ]] || die "--cpus has no $r"; done
if [[ $ROUTER_OK == 1 && -z "${CPU[router]:-}" ]]; then ROUTER_OK=0; note "vllm-router: no core in the cpu plan, left out"; fi
note "cpu plan: $CPUS"
STUB_ARGS=(); CLIENT_ARGS=()
[[ $STUB_PROCS -gt 1 ]] && STUB_ARGS=(--processes "$STUB_PROCS")
[[ $CLIENT_PROCS -gt 1 ]] && CLIENT_ARGS=(--client-processes "$CLIENT_PROCS")
if [[ $STUB_PROCS -gt 1 || $CLIENT_PROCS -gt 1 ]]; then
  note "stub processes: $STUB_PROCS on CPU(s) ${CPU[stub]}; client processes: $CLIENT_PROCS on CPU(s) ${CPU[client]}"
fi

# ---------------------------------------------------------------- upstream
UP=$(free_port)
start stub "${CPU[stub]}" "${PYENV[@]}" python3 "$HERE/stub_upstream.py" --port "$UP" --chunks "$CHUNKS" \
  --interval-ms "$INTERVAL" --ttft-ms "$TTFT" "${STUB_ARGS[@]}"
wait_http stub "http://127.0.0.1:$UP/health" 30 || die "the stub did not start"
TARGETS=()
META=(--meta "host=$(uname -n) $(nproc) CPUs (many-core benchmark host)"
      --meta "stub=chunks $CHUNKS, interval $INTERVAL ms, ttft $TTFT ms"
      --meta "pinning=$CPUS (taskset -c; every thread of a process inherits its set)")
[[ $STUB_PROCS -gt 1 ]] && META+=(--meta "stub_processes=$STUB_PROCS (SO_REUSEPORT, one event loop each, on CPUs ${CPU[stub]})")
[[ $CLIENT_PROCS -gt 1 ]] && META+=(--meta "client_processes=$CLIENT_PROCS (forked, one event loop each, on CPUs ${CPU[client]})")

# ---------------------------------------------------------------- nginx
if [[ -n "$NGINX" ]]; then
  NG=$(free_port); d="$RUN/nginx"; mkdir -p "$d/tmp"
  cat >"$d/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $d/tmp/body;
  proxy_temp_path $d/tmp/proxy;
  fastcgi_temp_path $d/tmp/fcgi;
  uwsgi_temp_path $d/tmp/uwsgi;
  scgi_temp_path $d/tmp/scgi;
  upstream llm { server 127.0.0.1:$UP; keepalive 128; }
  server {
    listen 127.0.0.1:$NG;
    location / {
      proxy_pass http://llm;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_cache off;
      proxy_read_timeout 600s;
    }
  }
}
EOF
  start nginx "${CPU[nginx]}" "${NGX_ENV[@]}" "$NGINX" -p "$d" -c "$d/nginx.conf" -e "$d/error.log"
  if wait_http nginx "http://127.0.0.1:$NG/health" 20; then
    TARGETS+=("nginx=http://127.0.0.1:$NG@$(pid_of nginx)")
    META+=(--meta "nginx=$(sed 's/.*version: //' "$RUN/nginx-v.log") (Debian bookworm package), 1 worker, keepalive upstream, proxy_buffering off, access_log off")
  else
    note "nginx: FAILED to start, left out: $(tail -5 "$RUN/nginx.log" "$d/error.log" 2>/dev/null | tr '\n' ' ')"
    stop_pid "$(pid_of nginx)" nginx
  fi
fi

# ---------------------------------------------------------------- vllm-router
if [[ $ROUTER_OK == 1 ]]; then
  RP=$(free_port); RPM=$(free_port)
  RVER=$(env PYTHONPATH="$SITE_ROUTER:$SITE" python3 -c 'from vllm_router.version import __version__ as v; print(v)' 2>&1 || true)
  note "vllm-router: $RVER"
  RCMD=(python3 -m vllm_router.launch_router)
  [[ -x "$SITE_ROUTER/bin/vllm-router" ]] && RCMD=(python3 "$SITE_ROUTER/bin/vllm-router")
  start router "${CPU[router]}" env PYTHONPATH="$SITE_ROUTER:$SITE" PYTHONUNBUFFERED=1 "${RCMD[@]}" \
    --host 127.0.0.1 --port "$RP" --worker-urls "http://127.0.0.1:$UP" --policy round_robin \
    --prometheus-host 127.0.0.1 --prometheus-port "$RPM"
  if wait_http router "http://127.0.0.1:$RP/v1/models" 60; then
    TARGETS+=("router=http://127.0.0.1:$RP@$(pid_of router)")
    META+=(--meta "vllm-router=$RVER, round_robin, all threads pinned to CPU ${CPU[router]}")
  else
    note "vllm-router: FAILED to start, left out: $(tail -5 "$RUN/router.log" | tr '\n' ' ')"
    stop_pid "$(pid_of router)" router
  fi
fi

# ---------------------------------------------------------------- the specwatch exporter
XP=""
if skipped specwatch; then
  note "specwatch (one process): skipped (--skip)"
else
XP=$(free_port)
start specwatch "${CPU[specwatch]}" env PYTHONPATH="$SRC:$SITE" PYTHONUNBUFFERED=1 python3 -m specwatch.cli exporter \
  --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$XP"
wait_port specwatch "$XP" 60 || die "the exporter did not start"
wait_http specwatch "http://127.0.0.1:$XP/healthz" 20 || die "the exporter did not answer /healthz"
TARGETS+=("specwatch=http://127.0.0.1:$XP@$(pid_of specwatch)")
META+=(--meta "specwatch=python3 -m specwatch.cli exporter --upstream baseline=http://127.0.0.1:{UP} --web.listen-address 127.0.0.1:{PORT} (commit $(cut -c1-12 "$SRC/COMMIT" 2>/dev/null), uvloop.run)")
fi

if [[ $HAVE_REF == 1 ]]; then
  [[ -n "${CPU[specwatchref]:-}" ]] || die "--cpus has no specwatchref (needed for .devperf/src-ref)"
  note "specwatch-ref: $(build_of "$DEV/src-ref")"
  XR=$(free_port)
  start specwatch-ref "${CPU[specwatchref]}" env PYTHONPATH="$DEV/src-ref:$SITE" PYTHONUNBUFFERED=1 python3 -m specwatch.cli exporter \
    --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$XR"
  wait_port specwatch-ref "$XR" 60 || die "the reference exporter did not start"
  wait_http specwatch-ref "http://127.0.0.1:$XR/healthz" 20 || die "the reference exporter did not answer /healthz"
  TARGETS+=("specwatch-ref=http://127.0.0.1:$XR@$(pid_of specwatch-ref)")
  META+=(--meta "specwatch-ref=the same command from .devperf/src-ref (commit $(cut -c1-12 "$DEV/src-ref/COMMIT" 2>/dev/null)), pinned to CPU ${CPU[specwatchref]}")
fi

if [[ $SW_WORKERS -gt 0 ]]; then
  [[ -n "${CPU[specwatchw]:-}" ]] || die "--cpus has no specwatchw (needed for --specwatch-workers)"
  XW=$(free_port)
  start "specwatch-w$SW_WORKERS" "${CPU[specwatchw]}" env PYTHONPATH="$SRC:$SITE" PYTHONUNBUFFERED=1 python3 -m specwatch.cli exporter \
    --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$XW" --workers "$SW_WORKERS"
  wait_port "specwatch-w$SW_WORKERS" "$XW" 60 || die "the --workers exporter did not start"
  wait_http "specwatch-w$SW_WORKERS" "http://127.0.0.1:$XW/healthz" 20 || die "the --workers exporter did not answer /healthz"
  TARGETS+=("specwatch-w$SW_WORKERS=http://127.0.0.1:$XW@$(pid_of "specwatch-w$SW_WORKERS")")
  [[ -n "$XP" ]] || XP=$XW
  META+=(--meta "specwatch-w$SW_WORKERS=the specwatch command with --workers $SW_WORKERS, its process tree pinned to CPUs ${CPU[specwatchw]}")
fi

if [[ $FRONTS == 1 ]]; then
  for front in bare aiohttp-bare; do
    FP=$(free_port); core=${CPU[bare]}; extra=()
    [[ $front == aiohttp-bare ]] && { core=${CPU[aiobare]}; extra=(--aiohttp --handler-cancellation); }
    start "$front" "$core" env PYTHONPATH="$SRC:$SITE" PYTHONUNBUFFERED=1 python3 "$HERE/raw_front.py" \
      --upstream "http://127.0.0.1:$UP" --port "$FP" "${extra[@]}"
    wait_port "$front" "$FP" 30 || die "raw_front.py ($front) did not start"
    TARGETS+=("$front=http://127.0.0.1:$FP@$(pid_of "$front")")
    META+=(--meta "$front=bench/perf/raw_front.py ${extra[*]} (a bare front over the tap's upstream client, no accounting), pinned to CPU $core")
  done
fi

vi=0
for v in "${VARIANTS[@]}"; do
  vi=$((vi + 1)); name=${v%%=*}; read -r -a flags <<<"${v#*=}"
  core=${CPU[variant$vi]:-$((11 + vi))}
  [[ $core -lt $(nproc) ]] || die "--variant $name: no core $core here (pass --cpus with variant$vi=N)"
  VP=$(free_port)
  start "$name" "$core" env PYTHONPATH="$SRC:$SITE" PYTHONUNBUFFERED=1 python3 -m specwatch.cli exporter \
    --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$VP" "${flags[@]}"
  wait_port "$name" "$VP" 60 || die "the exporter variant $name did not start"
  wait_http "$name" "http://127.0.0.1:$VP/healthz" 20 || die "the exporter variant $name did not answer /healthz"
  TARGETS+=("$name=http://127.0.0.1:$VP@$(pid_of "$name")")
  META+=(--meta "$name=the specwatch command with ${flags[*]}, pinned to CPU $core")
done

# ---------------------------------------------------------------- smoke test + warm-up
KEY="sk-$(python3 -c 'import secrets; print(secrets.token_hex(24))')"
python3 "$WORK/sse_check.py" "$KEY" "direct=http://127.0.0.1:$UP" "${TARGETS[@]}" 2>&1 | tee -a "$ENVTXT" >&2 \
  || die "a warm-up stream failed"
if [[ $PROBE == 1 && -n "$XP" ]]; then
  note "exporter /metrics after the smoke test: $(python3 -c "$HTTP_OK"'
import re; print(" ".join(l for l in o.open(sys.argv[1], timeout=2).read().decode().splitlines() if l.startswith("specwatch_requests_total")))' "http://127.0.0.1:$XP/metrics" 2>&1 | head -c 1500)"
fi

# affinity and threads of every started process (and its children / threads)
affinity_report() {
  local i pid p t n
  for i in "${!NAMES[@]}"; do
    pid=${PIDS[$i]}
    for p in $pid $(descendants "$pid"); do
      n=$(ls "/proc/$p/task" 2>/dev/null | wc -l)
      note "affinity ${NAMES[$i]} PID $p ($(tr -d '\0' <"/proc/$p/comm" 2>/dev/null)): $n thread(s), allowed $(awk '/Cpus_allowed_list/{print $2}' "/proc/$p/status") [threads: $(for t in /proc/$p/task/*; do awk '/Cpus_allowed_list/{printf "%s ", $2}' "$t/status"; done)]"
    done
  done
}
affinity_report

# ---------------------------------------------------------------- RSS sampler
cat >"$WORK/rss_sampler.py" <<'EOF'
"""Every 0.5 s: RSS (VmRSS, kB) summed over each named process tree -> TSV; stops on SIGTERM."""
import os, signal, sys, time
out, roots = sys.argv[1], dict(a.split("=") for a in sys.argv[2:])
stop = False
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGTERM, on_term)
def tree(root):
    kids = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                raw = open(f"/proc/{e}/stat", "rb").read()
            except OSError:
                continue
            kids.setdefault(int(raw[raw.rfind(b")") + 2:].split()[1]), []).append(int(e))
    pids, stack = [], [root]
    while stack:
        p = stack.pop(); pids.append(p); stack.extend(kids.get(p, ()))
    return pids
def field(pid, key):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass
    return 0
with open(out, "w") as f:
    f.write("epoch\tclock\tname\trss_kb\thwm_kb\tthreads\n")
    while not stop:
        now = time.time(); clock = time.strftime("%H:%M:%S", time.localtime(now))
        for name, root in roots.items():
            pids = tree(int(root))
            f.write(f"{now:.2f}\t{clock}\t{name}\t{sum(field(p, 'VmRSS') for p in pids)}\t"
                    f"{sum(field(p, 'VmHWM') for p in pids)}\t{sum(field(p, 'Threads') for p in pids)}\n")
        f.flush()
        time.sleep(0.5)
EOF
ROOTS=()
for t in "${TARGETS[@]}"; do name=${t%%=*}; ROOTS+=("$name=${t##*@}"); done
ROOTS+=("stub=$(pid_of stub)")
start sampler "${CPU[sampler]}" python3 "$WORK/rss_sampler.py" "$RUN/rss.tsv" "${ROOTS[@]}"

# ---------------------------------------------------------------- the benchmark
if [[ $PROBE == 1 ]]; then
  CONC="1,256"; REQS="1:4,256:256"; ROUNDS=1; MAXSEC=120; LEVEL_BUDGET=60
fi
log "benchmark: ${#TARGETS[@]} proxies + direct + direct-aa, concurrency $CONC, requests $REQS, rounds $ROUNDS"
note "bench: concurrency $CONC, requests $REQS, rounds $ROUNDS, max-seconds $MAXSEC, level budget $LEVEL_BUDGET s"
rc=0
PROXY_BENCH_API_KEY="$KEY" timeout --signal=TERM $((MAXSEC + 40)) "${PIN[@]}" "${CPU[client]}" "${PYENV[@]}" \
  python3 "$HERE/proxy_bench.py" \
  --direct "http://127.0.0.1:$UP@$(pid_of stub)" "${TARGETS[@]}" \
  --concurrency "$CONC" --requests "$REQS" --rounds "$ROUNDS" --max-seconds "$MAXSEC" \
  --level-budget-s "$LEVEL_BUDGET" --quiet-below "$QUIET_BELOW" --quiet-wait-s "$QUIET_WAIT" \
  --upstream-desc "stub_upstream.py: $CHUNKS chunks, $INTERVAL ms apart, TTFT $TTFT ms" \
  "${META[@]}" "${CLIENT_ARGS[@]}" --out-json "$PREFIX.json" --out-md "$PREFIX.md" --aa \
  2> >(tee "$RUN/bench.log" >&2) >"$RUN/bench.stdout" || rc=$?
if [[ $STAGGER != 0 && $PROBE == 0 ]]; then
  log "benchmark, staggered: --stagger-ms $STAGGER, concurrency $STAGGER_CONC, requests $STAGGER_REQS"
  note "bench (staggered): --stagger-ms $STAGGER, concurrency $STAGGER_CONC, requests $STAGGER_REQS, rounds $ROUNDS, max-seconds $STAGGER_MAXSEC"
  PROXY_BENCH_API_KEY="$KEY" timeout --signal=TERM $((STAGGER_MAXSEC + 40)) "${PIN[@]}" "${CPU[client]}" "${PYENV[@]}" \
    python3 "$HERE/proxy_bench.py" \
    --direct "http://127.0.0.1:$UP@$(pid_of stub)" "${TARGETS[@]}" --stagger-ms "$STAGGER" \
    --concurrency "$STAGGER_CONC" --requests "$STAGGER_REQS" --rounds "$ROUNDS" --max-seconds "$STAGGER_MAXSEC" \
    --level-budget-s "$LEVEL_BUDGET" --quiet-below "$QUIET_BELOW" --quiet-wait-s "$QUIET_WAIT" \
    --upstream-desc "stub_upstream.py: $CHUNKS chunks, $INTERVAL ms apart, TTFT $TTFT ms" \
    "${META[@]}" "${CLIENT_ARGS[@]}" --out-json "$PREFIX-stagger.json" --out-md "$PREFIX-stagger.md" --aa \
    2> >(tee "$RUN/bench-stagger.log" >&2) >"$RUN/bench-stagger.stdout" || rc=$?
fi
# which exporters relayed over the compiled relay thread (0 chunks: the Python relay)
relay_counters() {
  python3 -c "$HTTP_OK"'
print(" ".join(l for l in o.open(sys.argv[1], timeout=2).read().decode().splitlines()
               if l.startswith(("specwatch_fast_relay_chunks_total", "specwatch_fast_relay_handovers_total"))
               or (l.startswith("specwatch_requests_total") and not l.endswith(" 0.0"))))' "$1/metrics" 2>&1 | head -c 1500
}
skipped specwatch || note "specwatch /metrics after the bench: $(relay_counters "http://127.0.0.1:$XP")"
[[ $HAVE_REF == 1 ]] && note "specwatch-ref /metrics after the bench: $(relay_counters "http://127.0.0.1:$XR")"
[[ $SW_WORKERS -gt 0 ]] && note "specwatch-w$SW_WORKERS /metrics after the bench: $(relay_counters "http://127.0.0.1:$XW")"
sleep 0.6   # one more RSS sample after the last block
affinity_report
stop_pid "$(pid_of sampler)" sampler
cp "$RUN/rss.tsv" "$RUN/bench.log" "$(dirname "$PREFIX")/" 2>/dev/null || true

# ---------------------------------------------------------------- RSS per level into the JSON and the Markdown
python3 - "$PREFIX" "$RUN/rss.tsv" "$RUN/bench.log" "$ENVTXT" <<'EOF' || log "post-processing failed"
import csv, json, re, sys
prefix, rss_path, bench_log, env_txt = sys.argv[1:5]
levels = []  # (clock, C) from proxy_bench's log lines
for line in open(bench_log):
    m = re.match(r"\[(\d\d:\d\d:\d\d)\] level C=(\d+):", line)
    if m:
        levels.append((m.group(1), int(m.group(2))))
rows = list(csv.DictReader(open(rss_path), delimiter="\t"))
def level_of(clock):
    cur = None
    for start, c in levels:
        if clock >= start:
            cur = c
    return cur
peak, first, hwm, threads = {}, {}, {}, {}
for r in rows:
    name, rss = r["name"], int(r["rss_kb"])
    first.setdefault(name, rss)
    hwm[name] = max(hwm.get(name, 0), int(r["hwm_kb"]))
    threads[name] = max(threads.get(name, 0), int(r["threads"]))
    c = level_of(r["clock"])
    key = (name, c)
    peak[key] = max(peak.get(key, 0), rss)
names = list(dict.fromkeys(r["name"] for r in rows))
concs = [c for _, c in levels]
rss = {n: {"start_kb": first.get(n), "vmhwm_kb_at_end": hwm.get(n), "max_threads": threads.get(n),
           "peak_rss_kb_by_level": {str(c): peak.get((n, c)) for c in concs}} for n in names}
try:
    res = json.load(open(prefix + ".json"))
except (OSError, ValueError):
    res = None
env = open(env_txt).read()
if res is not None:
    res["host"] = {"rss": rss, "env": env.splitlines(), "rss_note":
                     "peak VmRSS (kB) summed over the process tree, sampled every 0.5 s during each "
                     "level (warm-up included); vmhwm = kernel's peak RSS over the process lifetime"}
    json.dump(res, open(prefix + ".json", "w"), indent=1)
lines = ["", "## Pinned run: pinning, memory, environment", "",
         "| process | RSS at start (MiB) | " + " | ".join(f"peak RSS C={c} (MiB)" for c in concs)
         + " | VmHWM at end (MiB) | threads (max) |",
         "|---|---:|" + "---:|" * len(concs) + "---:|---:|"]
mib = lambda kb: "n/a" if not kb else f"{kb / 1024:.1f}"
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
EOF
log "results: $PREFIX.md and $PREFIX.json (bench exit $rc; logs in $RUN)"
exit $rc
