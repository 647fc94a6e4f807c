"""`specwatch canary --serve ADDRESS`: judge every interval and answer `/verdict` for progressive delivery.

`GET /verdict` (or `POST`, as Flagger's webhooks send) answers the latest verdict as JSON: the overall
one and per task the verdict, the score, the reasons and every metric with its state, effect, interval
and n on each side, with the window, the sources, when it was evaluated and how old it is. `?task=NAME`
narrows it to one task (404 for a task the verdict has not seen). The HTTP status carries the verdict for
callers that read only the status, Flagger's webhooks among them:

    200 pass   412 fail   425 inconclusive (marginal or insufficient data: more data may decide it)
    503 no verdict (the last evaluation failed: Prometheus or the event log unreadable)

`?always_200=true` answers 200 whatever the verdict, for Argo Rollouts' web provider, which marks a
non-2xx answer as a measurement error rather than reading it: its success, failure and inconclusive
conditions read `result.verdict` instead. `/healthz` says the server runs. The address binds to
loopback unless told otherwise; nothing here changes the exporter (see `--push-to` for that).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from specwatch.canary.report import as_dict
from specwatch.canary.scoring import CanaryVerdict

STATUS = {"pass": 200, "fail": 412, "marginal": 425, "insufficient": 425}
NO_VERDICT = 503
INCONCLUSIVE = frozenset({"marginal", "insufficient"})


@dataclass
class Latest:
    """The last evaluation: its verdict (None before the first or after a failure) and when."""

    verdict: CanaryVerdict | None = None
    evaluated_at: float = 0.0
    error: str = ""
    evaluations: int = 0
    interval: float = 0.0


class VerdictBoard:
    """The latest verdict, shared between the judging loop (`update`) and the HTTP handlers (`answer`)."""

    def __init__(self, interval: float) -> None:
        self._lock = threading.Lock()
        self._latest = Latest(interval=interval)

    def update(self, verdict: CanaryVerdict | None, error: str = "") -> None:
        with self._lock:
            self._latest = Latest(verdict, time.time(), error, self._latest.evaluations + 1, self._latest.interval)

    def answer(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """The HTTP status and the JSON body for a request with this query string."""
        with self._lock:
            latest = self._latest
        always_ok = query.get("always_200", ["false"])[-1].lower() in ("1", "true", "yes")
        age = round(time.time() - latest.evaluated_at, 3) if latest.evaluated_at else None
        meta = {"evaluated_at": latest.evaluated_at or None, "age_seconds": age, "evaluations": latest.evaluations,
                "interval_seconds": latest.interval}
        if latest.verdict is None:
            body = {"verdict": "none", "inconclusive": True, "error": latest.error or "no evaluation yet", **meta}
            return (200 if always_ok else NO_VERDICT), body
        doc = as_dict(latest.verdict)
        doc.update(meta)
        tasks = query.get("task")
        if tasks:
            wanted = tasks[-1]
            chosen = [t for t in doc["tasks"] if t["task"] == wanted]
            if not chosen:
                seen = [t["task"] for t in doc["tasks"]]
                return 404, {"error": f"task {wanted!r} is not in the verdict; its tasks: {seen}", **meta}
            doc["tasks"] = chosen
            doc["verdict"] = chosen[0]["verdict"]
        doc["inconclusive"] = doc["verdict"] in INCONCLUSIVE
        return (200 if always_ok else STATUS[doc["verdict"]]), doc


def _handler(board: VerdictBoard) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "specwatch-canary"

        def _answer(self) -> None:
            parts = urlsplit(self.path)
            body: dict[str, Any]
            if parts.path == "/healthz":
                status, body = 200, {"ok": True}
            elif parts.path == "/verdict":
                status, body = board.answer(parse_qs(parts.query))
            else:
                status, body = 404, {"error": f"{parts.path}: no such path; try /verdict or /healthz"}
            payload = json.dumps(body, indent=1).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._answer()

        def do_POST(self) -> None:  # noqa: N802 - Flagger's webhooks POST a JSON payload; it is read and ignored
            length = int(self.headers.get("Content-Length") or 0)
            if 0 < length <= 1 << 20:
                self.rfile.read(length)
            self._answer()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: a poller every few seconds
            return

    return Handler


def parse_address(value: str) -> tuple[str, int]:
    """HOST:PORT (HOST defaults to 127.0.0.1); ValueError naming the input otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--serve {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9410")
    return host or "127.0.0.1", int(port)


def serve(address: tuple[str, int], evaluate: Callable[[], CanaryVerdict], interval: float,
          report: Callable[[CanaryVerdict], None], stop: threading.Event, rounds: int | None = None) -> int:
    """Judge every `interval` seconds and answer /verdict on `address` until `stop` is set (or `rounds`
    evaluations); returns the number of evaluations."""
    board = VerdictBoard(interval)
    server = ThreadingHTTPServer(address, _handler(board))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="canary-verdict", daemon=True)
    thread.start()
    print(f"verdict endpoint: http://{address[0]}:{server.server_address[1]}/verdict", flush=True)
    n = 0
    try:
        while not stop.is_set():
            started = time.monotonic()
            try:
                verdict = evaluate()
            except (OSError, ValueError) as exc:  # Prometheus or the log unreadable this time: no verdict, say why
                board.update(None, f"{type(exc).__name__}: {exc}")
                print(f"specwatch canary: evaluation failed: {exc}", flush=True)
            else:
                board.update(verdict)
                report(verdict)
            n += 1
            if rounds is not None and n >= rounds:
                break
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
    finally:
        server.shutdown()
        server.server_close()
    return n
