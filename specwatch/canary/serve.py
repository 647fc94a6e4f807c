"""`specwatch canary --serve ADDRESS`: judge every interval and answer `/verdict` for progressive delivery.

`GET /verdict` (or `POST`, as Flagger's webhooks send) answers the latest verdict as JSON: the overall
one and per task the verdict, the score, the reasons and every metric with its state, effect, interval
and n on each side, with the window, the sources, when it was evaluated and how old it is. `?task=NAME`
narrows it to one task (404 for a task the verdict has not seen). The HTTP status carries the verdict for
callers that read only the status, Flagger's webhooks among them (any status above 202 fails its check):

    200 pass   412 fail   425 inconclusive (marginal or insufficient data: more data may decide it)
    503 `"verdict": "none"`: no evaluation yet, the last one failed (the body's `error` says why: Prometheus
        or the event log unreadable, an error or HTML page for an answer, a query past the deadline, the
        report not written), or one is running past its deadline
    503 `"verdict": "stale"`: the last verdict is older than 2 x --interval + --deadline; it is kept under
        `last_verdict` for diagnosis, never served as the verdict

`?always_200=true` answers 200 whatever the state, for Argo Rollouts' web provider, which marks a non-2xx
answer as a measurement error rather than reading it: its conditions read `verdict` ("pass" success, "fail"
failure), so "none" and "stale" count as inconclusive, never a pass. Only a fresh pass is ever 2xx without it.

Each evaluation runs in a worker thread with a deadline (`--deadline`, Prometheus queries time out within
what is left of it), so the HTTP answers never wait on it; one that runs past its deadline (a hung file
system) is not joined by another: the board answers 503 until it returns, and its late verdict is dropped.
Any failure is one line on stderr and the loop goes on. A stop (SIGTERM) returns at once, mid-evaluation
too. A POST's malformed Content-Length is 400. The address binds to loopback unless told otherwise, IPv6
in brackets (`[::1]:9410`); nothing here changes the exporter (see `--push-to` for that).
"""

from __future__ import annotations

import json
import re
import socket
import socketserver
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from specwatch.canary.report import as_dict
from specwatch.canary.samples import reason
from specwatch.canary.scoring import CanaryVerdict

STATUS = {"pass": 200, "fail": 412, "marginal": 425, "insufficient": 425}
NO_VERDICT = 503
INCONCLUSIVE = frozenset({"marginal", "insufficient"})
MAX_BODY = 1 << 20  # a webhook's payload is read (and ignored) up to this; a longer Content-Length is a 400


@dataclass(frozen=True)
class Latest:
    """What the board knows: the last verdict judged (kept after failures, for diagnosis) and the rest."""

    verdict: CanaryVerdict | None = None
    doc: dict[str, Any] | None = None  # the verdict as JSON, made once by the worker
    evaluated_at: float = 0.0  # wall clock, for people
    judged_at: float = 0.0  # time.monotonic(), for the age
    error: str = ""  # why the last evaluation failed; "" when it gave the verdict
    evaluations: int = 0  # finished: judged or failed
    running_until: float | None = None  # the deadline (monotonic) of the evaluation in flight


class VerdictBoard:
    """The latest verdict, shared between the evaluations (`begin`, `judged`, `failed`) and the HTTP handlers."""

    def __init__(self, interval: float, deadline: float) -> None:
        self.interval, self.deadline = interval, deadline
        self.stale_after = 2 * interval + deadline
        self._lock = threading.Lock()
        self._latest = Latest()

    def begin(self, due: float) -> None:
        with self._lock:
            self._latest = replace(self._latest, running_until=due)

    def judged(self, verdict: CanaryVerdict, doc: dict[str, Any]) -> None:
        with self._lock:
            self._latest = Latest(verdict, doc, time.time(), time.monotonic(), "", self._latest.evaluations + 1)

    def failed(self, error: str) -> None:
        with self._lock:
            self._latest = replace(self._latest, error=error, evaluations=self._latest.evaluations + 1,
                                   running_until=None)

    def answer(self, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """The HTTP status and the JSON body for a request with this query string."""
        with self._lock:
            latest = self._latest
        now = time.monotonic()
        always_ok = query.get("always_200", ["false"])[-1].lower() in ("1", "true", "yes")
        age = now - latest.judged_at if latest.doc is not None else None
        meta: dict[str, Any] = {
            "evaluated_at": latest.evaluated_at or None, "age_seconds": None if age is None else round(age, 3),
            "evaluations": latest.evaluations, "interval_seconds": self.interval, "deadline_seconds": self.deadline,
            "stale_after_seconds": self.stale_after}
        problem = latest.error
        if latest.running_until is not None and now > latest.running_until:
            over = now - latest.running_until
            problem = f"evaluation running past its deadline ({self.deadline:g} s) for {over:.0f} s"
        stale = age is not None and age > self.stale_after
        if latest.doc is None or problem or stale:
            if stale:
                old = f"the last verdict is {age:.0f} s old (stale after {self.stale_after:g} s: 2 x interval + " \
                      "deadline)"
                problem = f"{old}; {problem}" if problem else old
            elif not problem:
                problem = "no evaluation yet" + ("; the first is running" if latest.running_until else "")
            body: dict[str, Any] = {"verdict": "stale" if stale else "none", "inconclusive": True, "error": problem,
                                    **meta}
            if latest.doc is not None:
                body["last_verdict"] = latest.doc  # for diagnosis: not the verdict
            return (200 if always_ok else NO_VERDICT), body
        doc = {**latest.doc, **meta}
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
        timeout = 10  # a client that stops sending mid-request frees its thread

        def _send(self, status: int, body: dict[str, Any]) -> None:
            payload = json.dumps(body, indent=1).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _answer(self) -> None:
            parts = urlsplit(self.path)
            body: dict[str, Any]
            try:
                if parts.path == "/healthz":
                    status, body = 200, {"ok": True}
                elif parts.path == "/verdict":
                    status, body = board.answer(parse_qs(parts.query))
                else:
                    status, body = 404, {"error": f"{parts.path}: no such path; try /verdict or /healthz"}
            except Exception as exc:  # never a traceback per poll: a 500 that says why
                status, body = 500, {"verdict": "none", "inconclusive": True, "error": f"answering: {reason(exc)}"}
            self._send(status, body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._answer()

        def do_POST(self) -> None:  # noqa: N802 - Flagger's webhooks POST a JSON payload; it is read and ignored
            raw = self.headers.get("Content-Length")
            if raw is not None and not re.fullmatch(r"[0-9]+", raw.strip()):
                return self._refuse(f"Content-Length {raw!r}: expected a number of bytes")
            length = int(raw) if raw is not None else 0
            if length > MAX_BODY:
                return self._refuse(f"Content-Length {length}: over the {MAX_BODY} bytes this endpoint reads")
            if length:
                self.rfile.read(length)
            elif self.headers.get("Transfer-Encoding"):
                self.close_connection = True  # a chunked body is left unread: this connection ends here
            self._answer()

        def _refuse(self, error: str) -> None:
            self.close_connection = True
            self._send(400, {"error": error})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: a poller every few seconds
            return

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def server_bind(self) -> None:  # no reverse lookup of the host, as HTTPServer's getfqdn() would do
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])


class _Server6(_Server):
    address_family = socket.AF_INET6


def parse_address(value: str) -> tuple[str, int]:
    """HOST:PORT or [IPV6]:PORT (HOST defaults to 127.0.0.1); ValueError naming the input otherwise."""
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]") and len(host) > 2:
        host = host[1:-1]
    elif ":" in host or "[" in host or "]" in host:
        raise ValueError(f"--serve {value!r}: an IPv6 address goes in brackets, e.g. [::1]:9410")
    if not sep or not re.fullmatch(r"[0-9]+", port) or not 0 < int(port) < 65536:
        raise ValueError(f"--serve {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9410 or [::1]:9410")
    return host or "127.0.0.1", int(port)


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr gone: the endpoint still says it
        pass


def _evaluate_once(board: VerdictBoard, evaluate: Callable[[float], CanaryVerdict],
                   report: Callable[[CanaryVerdict], None], due: float) -> None:
    """One evaluation in its worker thread: the verdict (reported, then on the board), or why not."""
    try:
        verdict = evaluate(due)
        late = time.monotonic() - due
        if late <= 0:
            doc = as_dict(verdict)
            report(verdict)
            board.judged(verdict, doc)
            return
        why = f"the evaluation returned {late:.1f} s past its deadline; its verdict is dropped"
    except Exception as exc:  # whatever it is: this evaluation's failure, said once; the loop goes on
        why = reason(exc)
    board.failed(why)
    _say(f"specwatch canary: evaluation failed: {why}")


def serve(address: tuple[str, int], evaluate: Callable[[float], CanaryVerdict], interval: float,
          report: Callable[[CanaryVerdict], None], stop: threading.Event, rounds: int | None = None,
          deadline: float = 30.0) -> int:
    """Judge every `interval` seconds and answer /verdict on `address` until `stop` is set (or `rounds`
    evaluations); returns the number of evaluations. `evaluate(due)` must be done by `due`, a
    `time.monotonic()` `deadline` seconds after it starts."""
    board = VerdictBoard(interval, deadline)
    server = (_Server6 if ":" in address[0] else _Server)(address, _handler(board))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="canary-verdict",
                              daemon=True)
    thread.start()
    print(f"verdict endpoint: {url_of(address[0], server.server_address[1])}/verdict", flush=True)
    n = 0
    worker: threading.Thread | None = None
    try:
        while not stop.is_set():
            started = time.monotonic()
            if worker is None or not worker.is_alive():  # never a second one beside a hung one
                due = started + deadline
                board.begin(due)
                worker = threading.Thread(target=_evaluate_once, args=(board, evaluate, report, due),
                                          name="canary-evaluation", daemon=True)
                worker.start()
                while worker.is_alive() and not stop.is_set() and time.monotonic() < due:
                    worker.join(min(0.05, max(0.0, due - time.monotonic())))
                if stop.is_set():
                    break
                if worker.is_alive():
                    _say(f"specwatch canary: evaluation running past its deadline ({deadline:g} s): /verdict "
                         "answers 503 and no new evaluation starts until it returns")
                n += 1
                if rounds is not None and n >= rounds:
                    break
            stop.wait(max(0.0, interval - (time.monotonic() - started)))
    finally:
        server.shutdown()
        server.server_close()
    return n
