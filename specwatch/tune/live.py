"""The acceptance and the task mix from a Prometheus window of live traffic (the exporter's counters).

P_i per task = increase of `specwatch_accepted_tokens_per_pos_total{position = i - 1}` over the
increase of `specwatch_decode_steps_total` (summed over variants matched, then divided); the mix is
each task's share of `specwatch_requests_total{outcome="ok"}`. Live traffic measures positions up to
the k it is served with; beyond that the sweep's conditional rates P_i / P_(i-1) carry the live
curve on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import requests


class LiveError(RuntimeError):
    """Prometheus did not answer, or the window holds no traffic."""


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    try:
        resp = requests.get(url.rstrip("/") + "/api/v1/query", params={"query": expr}, timeout=30)
        body = resp.json()
    except (requests.RequestException, ValueError) as exc:
        raise LiveError(f"{url}: {exc}") from None
    if body.get("status") != "success":
        raise LiveError(f"{url}: {expr}: {body.get('error', body)}")
    return list(body["data"]["result"])


def queries(window: str, variant: str) -> dict[str, str]:
    sel = f'variant=~"{variant}"'
    return {
        "per_position":
            f"sum by (task, position) (increase(specwatch_accepted_tokens_per_pos_total{{{sel}}}[{window}]))",
        "decode_steps": f"sum by (task) (increase(specwatch_decode_steps_total{{{sel}}}[{window}]))",
        "requests": f'sum by (task) (increase(specwatch_requests_total{{{sel}, outcome="ok"}}[{window}]))',
    }


def extend(live: Sequence[float], sweep: Sequence[float], k: int) -> tuple[float, ...]:
    """Live P_1..P_m carried to k positions with the sweep's conditional rates."""
    out = list(live[:k])
    while len(out) < k:
        i = len(out)
        prev_sweep = 1.0 if i == 0 else (sweep[i - 1] if i - 1 < len(sweep) else 0.0)
        rate = sweep[i] / prev_sweep if i < len(sweep) and prev_sweep > 0 else 0.0
        out.append((out[-1] if out else 1.0) * rate)
    return tuple(out)


def acceptance(url: str, window: str, variant: str, sweep_acceptance: Mapping[str, Sequence[float]],
               k: int) -> tuple[dict[str, tuple[float, ...]], dict[str, float]]:
    """(P per task, mix) from the window; tasks without decode steps are left out."""
    q = queries(window, variant)
    steps = {r["metric"].get("task", ""): float(r["value"][1]) for r in _query(url, q["decode_steps"])}
    counts: dict[str, dict[int, float]] = {}
    for r in _query(url, q["per_position"]):
        counts.setdefault(r["metric"].get("task", ""), {})[int(r["metric"]["position"])] = float(r["value"][1])
    mix = {r["metric"].get("task", ""): float(r["value"][1]) for r in _query(url, q["requests"])}
    out: dict[str, tuple[float, ...]] = {}
    for task, n in steps.items():
        if n <= 0 or task not in counts:
            continue
        measured = counts[task]
        live = [measured.get(p, 0.0) / n for p in range(max(measured) + 1)]
        out[task] = extend(live, sweep_acceptance.get(task, ()), k)
    if not out:
        raise LiveError(f"{url}: no decode steps with drafts in the last {window} (variant=~\"{variant}\")")
    return out, {t: w for t, w in mix.items() if t in out and w > 0}
