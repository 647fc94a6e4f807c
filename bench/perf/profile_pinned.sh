#!/usr/bin/env bash
# Where the exporter's per-request CPU goes, on the many-core benchmark host: py-spy samples the running
# exporter (attached once it serves, from another core; no instrumentation in the process; with --native the
# C frames too, pausing the process per sample), per_request.py sends N
# one-chunk streams one at a time and in bursts of 64 (stub: one content chunk, no delays), and the
# stacks are folded to self / inclusive shares per function (stack_shares.py).
#
# Usage: DEVPERF=$PWD/.devperf RESULTS_DIR=DIR bash .devperf/perf/profile_pinned.sh [-n 8000] [--rate 997]
#        [--src src|src-ref] [--cpus 'stub=0 exporter=2 spy=4 client=6'] [--native] [--no-install]
# py-spy comes from DEVPERF/bin/py-spy (a static binary; assemble_devperf.sh copies it) or PATH.
# Writes DIR/profile-<src>.stacks (py-spy raw), DIR/profile-<src>.txt (the shares) and the CPU per request.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
DEV="${DEVPERF:?DEVPERF must name the .devperf folder}"
OUT="${RESULTS_DIR:?RESULTS_DIR must name a folder for the results}"
N=8000; RATE=997; SRC=src; INSTALL=1; MODE=--nonblocking; CPUS="stub=0 exporter=2 spy=4 client=6"
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) N="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --src) SRC="$2"; shift 2 ;;
    --cpus) CPUS="$2"; shift 2 ;;
    --native) MODE=--native; shift ;;
    --no-install) INSTALL=0; shift ;;
    *) echo "profile_pinned.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
declare -A CPU
for kv in $CPUS; do CPU[${kv%%=*}]=${kv#*=}; done
SPY="$DEV/bin/py-spy"
[[ -x "$SPY" ]] || SPY=$(command -v py-spy) || { echo "profile_pinned.sh: no py-spy in $DEV/bin or PATH" >&2; exit 1; }
WORK_PREFIX=profile source "$HERE/pinned_common.sh"

UP=$(free_port); XP=$(free_port)
taskset -c "${CPU[stub]}" env PYTHONPATH="$SITE" python3 "$HERE/stub_upstream.py" --port "$UP" --chunks 1 \
  --interval-ms 0 --ttft-ms 0 >"$WORK/stub.log" 2>&1 & PIDS+=($!); STUB=$!
taskset -c "${CPU[exporter]}" env PYTHONPATH="$DEV/$SRC:$SITE" python3 -P -m specwatch.cli exporter \
  --upstream "baseline=http://127.0.0.1:$UP" --web.listen-address "127.0.0.1:$XP" >"$WORK/exporter.log" 2>&1 &
PIDS+=($!); EXP=$!
for p in "$UP" "$XP"; do wait_port "$p" || { echo "port $p did not open" >&2; tail "$WORK"/*.log >&2; exit 1; }; done
taskset -c "${CPU[spy]}" "$SPY" record --pid "$EXP" --rate "$RATE" --format raw "$MODE" \
  -o "$OUT/profile-$SRC.stacks" >"$WORK/spy.log" 2>&1 &
SPYPID=$!
sleep 1
echo "# profile_pinned.sh: $SRC ($(cat "$DEV/$SRC/COMMIT")), per_request.py -n $N --burst 64, py-spy --rate $RATE" \
  | tee "$OUT/profile-$SRC.txt"
taskset -c "${CPU[client]}" env PYTHONPATH="$SITE" python3 "$HERE/per_request.py" -n "$N" --burst 64 \
  "specwatch=http://127.0.0.1:$XP@$EXP,$STUB" | tee -a "$OUT/profile-$SRC.txt"
kill -INT "$SPYPID"
wait "$SPYPID" || true
tail -2 "$WORK/spy.log"
python3 "$HERE/stack_shares.py" "$OUT/profile-$SRC.stacks" --top 45 | tee -a "$OUT/profile-$SRC.txt"
