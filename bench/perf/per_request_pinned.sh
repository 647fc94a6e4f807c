#!/usr/bin/env bash
# Per-request CPU of the exporter against bare fronts over the same upstream client (raw_front.py), each
# process on its own core, on the many-core benchmark host (no network: everything from .devperf/, which
# bench/perf/assemble_devperf.sh builds). Stub with one content chunk and no delays; per_request.py sends
# N requests one at a time and N in bursts of 64, ROUNDS times, and reads each front's CPU from /proc.
#
# Usage: DEVPERF=$PWD/.devperf RESULTS_DIR=DIR bash .devperf/perf/per_request_pinned.sh [-n 4000] [--rounds 3]
#        [--cpus 'stub=0 exporter=2 bare=3 aiohttp=4 ref=5 client=6'] [--no-install]
# --no-install: use the running python's own packages (a local try; the host needs the wheels).
# Where DEVPERF has src-ref (assemble_devperf.sh --ref REV), its exporter runs beside as specwatch-ref (cpu ref).
# Writes DIR/per-request-fronts.txt (one JSON line per front and round, as per_request.py prints them).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEV="${DEVPERF:?DEVPERF must name the .devperf folder}"
OUT="${RESULTS_DIR:?RESULTS_DIR must name a folder for the results}"
N=4000; ROUNDS=3; CPUS="stub=0 exporter=2 bare=3 aiohttp=4 ref=5 client=6"; INSTALL=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    --rounds) ROUNDS="$2"; shift 2 ;;
    --cpus) CPUS="$2"; shift 2 ;;
    --no-install) INSTALL=0; shift ;;
    *) echo "per_request_pinned.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
declare -A CPU
for kv in $CPUS; do CPU[${kv%%=*}]=${kv#*=}; done
WORK_PREFIX=per-request source "$HERE/pinned_common.sh"

UP=$(free_port); XP=$(free_port); BP=$(free_port); AP=$(free_port)
taskset -c "${CPU[stub]}" env PYTHONPATH="$SITE" python3 "$HERE/stub_upstream.py" --port "$UP" --chunks 1 \
  --interval-ms 0 --ttft-ms 0 >"$WORK/stub.log" 2>&1 & PIDS+=($!); STUB=$!
taskset -c "${CPU[exporter]}" env PYTHONPATH="$DEV/src:$SITE" python3 -P -m specwatch.cli exporter \
  --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$XP" >"$WORK/exporter.log" 2>&1 &
PIDS+=($!); EXP=$!
taskset -c "${CPU[bare]}" env PYTHONPATH="$DEV/src:$SITE" python3 -P "$HERE/raw_front.py" \
  --upstream "http://127.0.0.1:$UP" --port "$BP" >"$WORK/bare.log" 2>&1 & PIDS+=($!); BARE=$!
taskset -c "${CPU[aiohttp]}" env PYTHONPATH="$DEV/src:$SITE" python3 -P "$HERE/raw_front.py" --aiohttp \
  --handler-cancellation --upstream "http://127.0.0.1:$UP" --port "$AP" >"$WORK/aiohttp.log" 2>&1 & PIDS+=($!); AIO=$!
FRONTS=("$UP" "$XP" "$BP" "$AP")
REF=()
if [[ -d "$DEV/src-ref" ]]; then
  RP=$(free_port)
  taskset -c "${CPU[ref]}" env PYTHONPATH="$DEV/src-ref:$SITE" python3 -P -m specwatch.cli exporter \
    --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$RP" >"$WORK/ref.log" 2>&1 &
  PIDS+=($!); FRONTS+=("$RP"); REF=("specwatch-ref=http://127.0.0.1:$RP@$!,$STUB")
fi
for p in "${FRONTS[@]}"; do wait_port "$p" || { echo "port $p did not open" >&2; tail "$WORK"/*.log >&2; exit 1; }; done
echo "# per_request.py -n $N --burst 64, $ROUNDS rounds; cpus: $CPUS; exporter commit $(cat "$DEV/src/COMMIT")$([[ ${#REF[@]} -gt 0 ]] && echo ", specwatch-ref $(cat "$DEV/src-ref/COMMIT")")" \
  | tee "$OUT/per-request-fronts.txt"
for r in $(seq "$ROUNDS"); do
  taskset -c "${CPU[client]}" env PYTHONPATH="$SITE" python3 "$HERE/per_request.py" -n "$N" --burst 64 \
    "direct=http://127.0.0.1:$UP@$STUB" "specwatch=http://127.0.0.1:$XP@$EXP,$STUB" \
    "bare=http://127.0.0.1:$BP@$BARE,$STUB" "aiohttp-bare=http://127.0.0.1:$AP@$AIO,$STUB" "${REF[@]}" \
    | sed "s/^/round $r /" | tee -a "$OUT/per-request-fronts.txt"
done
