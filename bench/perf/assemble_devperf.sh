#!/usr/bin/env bash
# Assembles the folder that travels to the many-core benchmark host (no network there) for run_pinned.py:
#   DEST/whl/     wheels for CPython 3.12 manylinux x86-64: aiohttp and its needs, prometheus_client, uvloop,
#                 pyyaml, at the versions pyproject.toml pins (the needs at this venv's versions)
#   DEST/deb/     Debian's nginx + nginx-common (apt-get download, this host's Debian release)
#   DEST/src/     this checkout's `specwatch` package and COMMIT (the commit, "+dirty" with local changes),
#                 with the compiled relay as `make setup` built it
#   DEST/perf/    this checkout's bench/perf/*.py (the harness travels with the code: run
#                 `python3 DEST/perf/run_pinned.py` there, whichever checkout the device call sends)
#   DEST/bin/     py-spy (a static binary), where the python's bin folder or PATH has one: run_pinned.py --profile
#   DEST/src-ref/ with --ref REV: the `specwatch` package at REV (git archive) with its own relay compiled
#                 here (gcc, -O2, abi3, as setuptools builds it), measured beside it as `specwatch-ref` in the
#                 same rounds (before / after under the same conditions)
# vllm-router (DEST/whl-router/) is left out: run_pinned.py then reports it as not installed.
# Usage: bench/perf/assemble_devperf.sh [--dest DIR] [--ref REV] [--python PY]   (default DIR: ./.devperf)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=$ROOT/.devperf
REF=""
PY=${PYTHON:-python3}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dest) DEST="$2"; shift 2 ;;
    --ref) REF="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    *) echo "assemble_devperf.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
pin() { grep -oE "\"$1==[^\"]+\"" "$ROOT/pyproject.toml" | tr -d '"'; }
have() { "$PY" -c "from importlib.metadata import version; print('$1==' + version('$1'))"; }
rm -rf "$DEST/whl" "$DEST/deb" "$DEST/src" "$DEST/src-ref" "$DEST/perf" "$DEST/bin"
mkdir -p "$DEST/whl" "$DEST/deb" "$DEST/src" "$DEST/perf"
WANT=("$(pin aiohttp)" "$(pin prometheus_client)" "$(pin uvloop)" "$(pin pyyaml)")
for dep in multidict yarl frozenlist aiosignal attrs propcache aiohappyeyeballs idna; do WANT+=("$(have "$dep")"); done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$DEST/whl" "${WANT[@]}"
(cd "$DEST/deb" && apt-get download nginx nginx-common >/dev/null)
cp -r "$ROOT/specwatch" "$DEST/src/"
# the compiled relay travels as built here by `make setup` (abi3; needs glibc >= 2.34 there); without it the
# exporter there relays in Python, so say which one goes
if ls "$DEST"/src/specwatch/exporter/_fastrelay*.so >/dev/null 2>&1; then
  echo "assemble_devperf: src carries the compiled relay ($(basename "$DEST"/src/specwatch/exporter/_fastrelay*.so))"
else
  echo "assemble_devperf: src has no compiled relay (run make setup first): the exporter there relays in Python" >&2
fi
cp "$ROOT"/bench/perf/*.py "$DEST/perf/"
find "$DEST/src" -name __pycache__ -prune -exec rm -rf {} +
commit=$(git -C "$ROOT" rev-parse HEAD)
git -C "$ROOT" diff --quiet HEAD -- specwatch || commit="$commit+dirty"
echo "$commit" >"$DEST/src/COMMIT"
SPY="$(dirname "$(command -v "$PY")")/py-spy"
[[ -x "$SPY" ]] || SPY=$(command -v py-spy || true)
if [[ -n "$SPY" ]]; then mkdir -p "$DEST/bin" && cp "$SPY" "$DEST/bin/py-spy"; fi
if [[ -n "$REF" ]]; then
  mkdir -p "$DEST/src-ref"
  git -C "$ROOT" archive "$REF" specwatch | tar -x -C "$DEST/src-ref"
  git -C "$ROOT" rev-parse "$REF" >"$DEST/src-ref/COMMIT"
  ref_c="$DEST/src-ref/specwatch/exporter/_fastrelay.c"
  if [[ -f "$ref_c" ]]; then  # REV's own C relay, not this checkout's: a before / after compares the two
    gcc -shared -fPIC -O2 -Wall -I"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
      -o "${ref_c%.c}.abi3.so" "$ref_c" -lpthread
    echo "assemble_devperf: src-ref carries its own compiled relay (built from $REF's _fastrelay.c)"
  fi
fi
du -sh "$DEST"
ls "$DEST"/whl "$DEST"/deb
