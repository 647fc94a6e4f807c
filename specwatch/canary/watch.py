"""`specwatch canary --watch`: re-evaluate every interval; push each verdict; on fail, stop the split.

The exporter's admin endpoint does the acting: `POST /admin/verdict` (the verdict as
`specwatch_canary_verdict{task,verdict}` for the canary dashboard) and `POST /admin/weights`
with `{"<candidate>": 0}` (every new request then goes to the other routes). Both carry
`Authorization: Bearer <token>`; the token comes from the environment and is never printed.

An evaluation that fails (a source unreadable, Prometheus erroring or past the deadline, the report not
written) is one line on stderr and the watch goes on: nothing is pushed for that round and the split is
never stopped on an error, only on a judged fail. A push or a stop the exporter refuses ends the watch
(`AdminError`): acting blind is worse than stopping.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import requests

from specwatch.canary.samples import reason
from specwatch.canary.scoring import CanaryVerdict


class AdminError(RuntimeError):
    """The exporter refused or could not be reached; the message never contains the token."""


def _post(exporter: str, path: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
    url = exporter.rstrip("/") + path
    try:
        resp = requests.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    except requests.RequestException as exc:
        raise AdminError(f"{url}: {type(exc).__name__}") from None
    if resp.status_code != 200:
        hint = {401: "wrong token", 404: "admin disabled (no --admin-token-env on the exporter?)"}.get(
            resp.status_code, resp.text[:200])
        raise AdminError(f"{url}: HTTP {resp.status_code}: {hint}")
    result: dict[str, Any] = resp.json()
    return result


def push_verdict(exporter: str, token: str, verdict: CanaryVerdict) -> None:
    """Publish the verdict per task on the exporter's /metrics."""
    _post(exporter, "/admin/verdict", token,
          {"tasks": {t.task: {"verdict": t.verdict, "score": t.score} for t in verdict.tasks}})


def stop_split(exporter: str, token: str, candidate: str) -> dict[str, float]:
    """Set the candidate's weight to 0; returns the exporter's weights afterwards."""
    weights: dict[str, float] = _post(exporter, "/admin/weights", token, {candidate: 0})["weights"]
    return weights


def _failed(what: str, exc: Exception) -> None:
    print(f"specwatch canary: {what} failed: {reason(exc)}", file=sys.stderr, flush=True)


def watch(evaluate: Callable[[], CanaryVerdict], interval: float, report: Callable[[CanaryVerdict], None],
          exporter: str | None, token: str | None, stop_on_fail: bool, rounds: int | None = None,
          sleep: Callable[[float], None] = time.sleep) -> CanaryVerdict | None:
    """Evaluate every `interval` seconds until a verdict fails (or `rounds` evaluations); returns the last
    verdict, None where the last evaluation failed (or its report could not be written).

    On a failed verdict with `stop_on_fail`, the split is stopped before returning (even when the report
    could not be written: the report is for people, the stop is the point).
    """
    n = 0
    while True:
        started = time.monotonic()
        outcome: CanaryVerdict | None = None
        try:
            verdict = evaluate()
        except Exception as exc:  # any failure is this round's, said in a line; the watch goes on
            _failed("evaluation", exc)
        else:
            outcome = verdict
            try:
                report(verdict)
            except Exception as exc:  # as above
                _failed("report", exc)
                outcome = None
            if exporter and token:
                push_verdict(exporter, token, verdict)
            if verdict.verdict == "fail":
                if stop_on_fail and exporter and token:
                    stop_split(exporter, token, verdict.candidate)
                return verdict
        n += 1
        if rounds is not None and n >= rounds:
            return outcome
        sleep(max(0.0, interval - (time.monotonic() - started)))
