#!/usr/bin/env bash
# The exporter at REF beside this checkout's, on this machine (no device host): one stub upstream, both
# exporters with their compiled relay built by the same gcc command, proxy_bench.py's interleaved rounds.
# A regression check where the 16-core host is not lent (shared cores: read CPU per 1,000 chunks first).
# Usage: bench/perf/local_side_by_side.sh REF [OUT_DIR]   (default OUT_DIR: bench/results/local-<date>)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
REF=${1:?usage: local_side_by_side.sh REF [OUT_DIR]}
OUT=${2:-$ROOT/bench/results/local-$(date +%Y-%m-%d)}
PY=$ROOT/.venv/bin/python
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$WORK"' EXIT
mkdir -p "$OUT" "$WORK/ref" "$WORK/new"
OUT=$(cd "$OUT" && pwd)
git -C "$ROOT" archive "$REF" specwatch | tar -x -C "$WORK/ref"
cp -r "$ROOT/specwatch" "$WORK/new/"
INC=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
for side in ref new; do
  rm -f "$WORK/$side"/specwatch/exporter/*.so
  gcc -shared -fPIC -O2 -g -I"$INC" "$WORK/$side/specwatch/exporter/_fastrelay.c" \
    -o "$WORK/$side/specwatch/exporter/_fastrelay.abi3.so" -lpthread
done
"$PY" "$ROOT/bench/perf/stub_upstream.py" --port 18301 >"$OUT/stub.log" 2>&1 & STUB=$!
for side in ref new; do
  port=$([[ $side == ref ]] && echo 18311 || echo 18312)
  (cd "$WORK/$side" && PYTHONSAFEPATH=1 PYTHONPATH="$WORK/$side" exec "$PY" -m specwatch.cli exporter \
     --upstream baseline=http://127.0.0.1:18301 --web.listen-address 127.0.0.1:$port >"$OUT/$side.log" 2>&1) &
  eval "PID_$side=\$!"
done
sleep 6
grep -h "relayed by the" "$OUT/ref.log" "$OUT/new.log"
"$PY" "$ROOT/bench/perf/proxy_bench.py" --direct "http://127.0.0.1:18301@$STUB" \
  "ref-$(git -C "$ROOT" rev-parse --short "$REF")=http://127.0.0.1:18311@$PID_ref" "new=http://127.0.0.1:18312@$PID_new" \
  --concurrency 1,16,64 --requests 1:48,16:384,64:1024 --rounds 4 --max-seconds 900 \
  --out-json "$OUT/side-by-side.json" --out-md "$OUT/side-by-side.md"
echo "results: $OUT/side-by-side.md"
