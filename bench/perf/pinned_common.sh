# Shared by per_request_pinned.sh and profile_pinned.sh (sourced, after DEV, INSTALL and the cpu map are set):
# the host's wheels installed into $WORK/site (unless INSTALL=0), every started process killed on exit
# (append PIDs to PIDS), free_port and wait_port on loopback.
WORK=$(mktemp -d "/tmp/${WORK_PREFIX:-pinned}.XXXXXX")
SITE="$WORK/site"
if [[ $INSTALL == 1 ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$DEV"/whl/*.whl
fi
export PYTHONUNBUFFERED=1
PIDS=()
cleanup() { kill "${PIDS[@]}" 2>/dev/null || true; }
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 100); do (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.1; done; return 1; }
