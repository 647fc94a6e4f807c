"""What the canary compares: per-request samples from the exporter's event log, figures from Prometheus.

The event log (`specwatch exporter --event-log`, and its rotated `<file>.1`) has one JSON line
per request with `ts`, `variant`, `task`, `outcome`, `ttft_s`, `tpot_s`, `e2e_s`,
`completion_tokens`, `C`, `D`. From it, per task and variant, over the window: TPOT, TTFT,
e2e, output tokens per second (completion tokens / e2e) and the acceptance rate C / D (D > 0)
of every ok request, and the count of requests and of errors (`upstream_error`,
`bad_response`, as the `specwatch_error` rule). The log carries no inter-token latencies,
so ITL p95 comes from Prometheus only.

From Prometheus (the exporter's raw families, so any variant names and any window work):
figures that are ratios of windowed counter increases (TPOT, TTFT and e2e as means, rate of
`_sum` over rate of `_count`, exact where bucket quantiles are not; output tokens per second
of request time; acceptance rate; error ratio; in mirror mode with greedy requests the share
of candidate outputs identical to the primary's) and, for ITL, the `histogram_quantile` p95.
Each comes with the number of requests behind it: the counter's rise within the window
(max - min, without `increase()`'s extrapolation, which inflates counts on series younger
than the window; a restart inside the window undercounts, never overcounts).

Whatever goes wrong reading either source (no such log, an unreadable one, Prometheus refusing the
connection, answering an error, an HTML page or no JSON, or not within the evaluation's deadline) is a
`SourceError` with one line saying which source and why. Each Prometheus query waits at most what is left
of the deadline (and tells Prometheus the same through the API's `timeout`), so an evaluation of its 34
queries ends within the deadline, not 34 query timeouts later.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import requests

from specwatch.exporter.labels import ERROR_OUTCOMES
from specwatch.monitoring import MONITORING

Scale = Literal["ratio", "difference", "proportion", "share"]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    title: str
    unit: str
    scale: Scale  # ratio: candidate / baseline (log scale); difference: candidate - baseline; proportion:
    # a per-request 0/1 rate (Newcombe); share: a candidate-only ratio against a floor
    per_request: bool  # the event log carries it


METRICS: dict[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("tpot", "TPOT", "s", "ratio", True),
    MetricSpec("ttft", "TTFT", "s", "ratio", True),
    MetricSpec("itl_p95", "ITL p95", "s", "ratio", False),
    MetricSpec("e2e", "e2e latency", "s", "ratio", True),
    MetricSpec("output_tps", "output tokens/s per request", "tok/s", "ratio", True),
    MetricSpec("error_ratio", "error ratio", "", "proportion", True),
    MetricSpec("acceptance_rate", "acceptance rate", "", "difference", True),
    MetricSpec("output_identical", "identical greedy outputs (mirror)", "", "share", False),
)}


@dataclass
class Side:
    """One task and variant in the window."""

    samples: dict[str, list[float]] = field(default_factory=dict)  # per-request values by metric
    requests: int = 0  # every outcome (event log)
    errors: int = 0
    figures: dict[str, float] = field(default_factory=dict)  # Prometheus: the metric's figure
    counts: dict[str, float] = field(default_factory=dict)  # Prometheus: requests behind each figure


Data = dict[tuple[str, str], Side]  # (task, variant) -> Side
QUERY_TIMEOUT = 30.0  # seconds, at most, for one Prometheus query (less when the deadline is nearer)


class SourceError(Exception):
    """The event log or Prometheus could not give the window's data; the message names the source and why."""


def reason(exc: BaseException) -> str:
    """One line for a failed evaluation: a source's own message, otherwise the exception's type and text."""
    text = " ".join(str(exc).split()) or "(no message)"
    return text if isinstance(exc, SourceError) else f"{type(exc).__name__}: {text}"


def _events(path: Path) -> Iterator[dict[str, Any]]:
    for file in (path.with_name(path.name + ".1"), path):  # the rotated half first: older lines
        try:
            lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise SourceError(f"event log {file}: cannot read it: {exc.strerror or exc}") from None
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut by a crash
            if isinstance(event, dict):
                yield event


def _positive(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def from_event_log(path: Path, window_seconds: float, variants: Iterable[str], tasks: Iterable[str] | None = None,
                   now: float | None = None, data: Data | None = None) -> Data:
    """Per-request samples of the requests logged in the last `window_seconds`."""
    if not path.exists() and not path.with_name(path.name + ".1").exists():
        raise SourceError(f"event log {path}: no such file")
    data = {} if data is None else data
    since = (time.time() if now is None else now) - window_seconds
    wanted_variants, wanted_tasks = set(variants), None if tasks is None else set(tasks)
    for e in _events(path):
        variant, task, ts = e.get("variant"), e.get("task"), e.get("ts")
        if variant not in wanted_variants or not isinstance(ts, int | float) or ts < since:
            continue
        if not isinstance(task, str) or (wanted_tasks is not None and task not in wanted_tasks):
            continue
        side = data.setdefault((task, str(variant)), Side())
        side.requests += 1
        if e.get("outcome") in ERROR_OUTCOMES:
            side.errors += 1
        if e.get("outcome") != "ok":
            continue
        values = {"tpot": _positive(e.get("tpot_s")), "ttft": _positive(e.get("ttft_s")),
                  "e2e": _positive(e.get("e2e_s"))}
        tokens, e2e, c, d = (_positive(e.get(k)) for k in ("completion_tokens", "e2e_s", "C", "D"))
        values["output_tps"] = tokens / e2e if tokens and e2e else None
        values["acceptance_rate"] = (c or 0.0) / d if d else None
        for name, value in values.items():
            if value is not None:
                side.samples.setdefault(name, []).append(value)
    return data


# -- Prometheus -----------------------------------------------------------------------------------
def _hq(family: str, v: str, w: str) -> str:
    return f'histogram_quantile(0.95, sum by (task, le) (rate({family}_bucket{{variant="{v}"}}[{w}])))'


def _inc(family: str, v: str, w: str, extra: str = "") -> str:
    return f'sum by (task) (increase({family}{{variant="{v}"{extra}}}[{w}]))'


def _rise(family: str, v: str, w: str) -> str:
    """How much a counter rose in the window, without increase()'s extrapolation (a restart undercounts)."""
    series = f'{family}{{variant="{v}"}}[{w}]'
    return f"sum by (task) (max_over_time({series}) - min_over_time({series}))"


def _ratio(numerator: str, denominator: str) -> str:
    return f"{numerator} / ({denominator} > 0)"


def _mean(histogram: str, v: str, w: str) -> str:
    """The window's mean from a histogram's counters: rate of _sum over rate of _count (exact, no buckets)."""
    return _ratio(_inc(f"{histogram}_sum", v, w), _inc(f"{histogram}_count", v, w))


def prom_queries(v: str, w: str) -> dict[str, tuple[str, str]]:
    """metric -> (the figure's PromQL, the PromQL of the requests behind it) for variant `v`, window `w`."""
    f = MONITORING.exporter
    requests_ = _rise(f"{f.e2e}_count", v, w)
    errors = f',outcome=~"{MONITORING.error_outcome_regex()}"'
    return {
        "tpot": (_mean(f.tpot, v, w), _rise(f"{f.tpot}_count", v, w)),
        "ttft": (_mean(f.ttft, v, w), _rise(f"{f.ttft}_count", v, w)),
        "itl_p95": (_hq(f.itl, v, w), requests_),
        "e2e": (_mean(f.e2e, v, w), requests_),
        "output_tps": (_ratio(_inc(f.completion_tokens, v, w), _inc(f"{f.e2e}_sum", v, w)), requests_),
        "error_ratio": (_ratio(_inc(f.requests, v, w, errors), _inc(f.requests, v, w)), _rise(f.requests, v, w)),
        "acceptance_rate": (_ratio(_inc(f.accepted, v, w), _inc(f.draft_tokens, v, w)),
                            _rise(f"{f.request_acceptance_rate}_count", v, w)),
        "output_identical": (_ratio(_inc(f.mirror_outputs, v, w, ',result="identical"'), _inc(f.mirror_outputs, v, w)),
                             _rise(f.mirror_outputs, v, w)),
    }


def _snippet(text: str) -> str:
    """The start of an answer that is not Prometheus's JSON (a proxy's HTML error page), tags and spaces dropped."""
    flat = " ".join(re.sub(r"<[^>]*>", " ", text).split())
    return repr(flat[:120] + ("..." if len(flat) > 120 else "")) if flat else "an empty body"


def _query(session: requests.Session, url: str, expr: str, deadline: float | None = None) -> dict[str, float]:
    """An instant query: {task: value}; NaN results (empty histograms) are left out. `deadline`: a
    `time.monotonic()` by which it must be answered."""
    timeout = QUERY_TIMEOUT if deadline is None else min(QUERY_TIMEOUT, deadline - time.monotonic())
    if timeout <= 0:
        raise SourceError(f"Prometheus {url}: the evaluation's deadline passed before its queries were done")
    params = {"query": expr, "timeout": f"{timeout:.3f}"}  # seconds: the API reads a bare float as such
    try:
        resp = session.get(url.rstrip("/") + "/api/v1/query", params=params, timeout=timeout)
    except requests.Timeout:
        raise SourceError(f"Prometheus {url}: no answer within {timeout:.1f} s (the evaluation's deadline)") from None
    except requests.RequestException as exc:
        raise SourceError(f"Prometheus {url}: unreachable: {_cause(exc)}") from None
    try:
        body = resp.json()
    except ValueError:
        raise SourceError(f"Prometheus {url}: HTTP {resp.status_code}, not a JSON answer: "
                          f"{_snippet(resp.text)}") from None
    if not isinstance(body, dict):
        raise SourceError(f"Prometheus {url}: HTTP {resp.status_code}, not a Prometheus API answer")
    if resp.status_code != 200 or body.get("status") != "success":
        why = ": ".join(str(body[k]) for k in ("errorType", "error") if body.get(k)) or _snippet(resp.text)
        raise SourceError(f"Prometheus {url}: HTTP {resp.status_code}, query failed: {why}")
    out: dict[str, float] = {}
    try:
        for s in body["data"]["result"]:
            value = float(s["value"][1])
            if value == value and "task" in s["metric"]:  # not NaN
                out[s["metric"]["task"]] = value
    except (KeyError, TypeError, ValueError, IndexError):
        raise SourceError(f"Prometheus {url}: an answer not shaped as an instant vector") from None
    return out


def _cause(exc: requests.RequestException) -> str:
    """The innermost reason of a requests error (`[Errno 111] Connection refused`), not urllib3's pool repr."""
    found = re.findall(r"\[Errno -?\d+\] [^'\")]+", str(exc))
    return found[-1].strip() if found else type(exc).__name__


def from_prometheus(url: str, window: str, variants: Iterable[str], tasks: Iterable[str] | None = None,
                    data: Data | None = None, deadline: float | None = None) -> Data:
    """Windowed figures per task for each variant, from the exporter's families in Prometheus; every query
    answered by `deadline` (a `time.monotonic()`; None: each within QUERY_TIMEOUT)."""
    data = {} if data is None else data
    wanted_tasks = None if tasks is None else set(tasks)
    with requests.Session() as session:
        for variant in variants:
            for metric, (figure, count) in prom_queries(variant, window).items():
                counts = _query(session, url, count, deadline)
                for task, value in _query(session, url, figure, deadline).items():
                    if wanted_tasks is not None and task not in wanted_tasks:
                        continue
                    side = data.setdefault((task, variant), Side())
                    side.figures[metric] = value
                    side.counts[metric] = counts.get(task, 0.0)
            for task, value in _query(session, url, _rise(MONITORING.exporter.requests, variant, window),
                                      deadline).items():
                if wanted_tasks is None or task in wanted_tasks:
                    data.setdefault((task, variant), Side()).counts["requests"] = value
    return data


def parse_window(text: str) -> float:
    """`10m`, `90s`, `1h`, `1d` -> seconds (Prometheus duration units, one unit)."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if len(text) < 2 or text[-1] not in units or not text[:-1].isdigit() or int(text[:-1]) <= 0:
        raise ValueError(f"window {text!r}: expected a number and a unit s, m, h or d (e.g. 10m)")
    return int(text[:-1]) * units[text[-1]]
