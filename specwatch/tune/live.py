"""The acceptance and the task mix from a Prometheus window of live traffic (the exporter's counters).

P_i per task is the share of decode steps that accept at least i drafts. Where the servers run
vLLM's `detailed` per-request metrics it is read from the steps at **full depth** only (those
that drafted the configured k): P_i = full-depth steps accepting i / full-depth steps, times
the share of decode steps that drafted at all. A step drafted shorter (a suffix match ran out, a
per-batch-size table cut k) says nothing of the positions it never reached, so counting it would
make deep positions look worse exactly where the tuner reads them. Without per-step data
(`summary` mode) P_i falls back to every step: `specwatch_accepted_tokens_per_pos_total` over
`specwatch_decode_steps_total`, and the basis says so. The mix is each task's share of
`specwatch_requests_total{outcome="ok"}`. Live traffic measures positions up to the k it is
served with; beyond that the sweep's conditional rates P_i / P_(i-1) carry the live curve on.

`data_parallel_size` reads how many engines (vLLM's `engine` label: the data-parallel rank)
one variant's servers report: vLLM ignores `num_speculative_tokens_per_batch_size` when it is
above 1, which `specwatch tune` must say before recommending one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests

from specwatch.monitoring import MONITORING

E = MONITORING.exporter


class LiveError(RuntimeError):
    """Prometheus did not answer, or the window holds no traffic."""


@dataclass(frozen=True)
class LiveAcceptance:
    """P per task, the traffic mix, and per task what P rests on (in words, with the step counts)."""

    acceptance: dict[str, tuple[float, ...]]
    mix: dict[str, float]
    basis: dict[str, str]


def _query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, str | float] = {"query": expr}
    if at is not None:
        params["time"] = at
    try:
        resp = requests.get(url.rstrip("/") + "/api/v1/query", params=params, timeout=30)
        body = resp.json()
    except (requests.RequestException, ValueError) as exc:
        raise LiveError(f"{url}: {exc}") from None
    if body.get("status") != "success":
        raise LiveError(f"{url}: {expr}: {body.get('error', body)}")
    return list(body["data"]["result"])


def queries(window: str, variant: str) -> dict[str, str]:
    sel = f'variant=~"{variant}"'

    def by_task(family: str, extra: str = "", by: str = "task") -> str:
        return f"sum by ({by}) (increase({family}{{{sel}{extra}}}[{window}]))"

    return {
        "per_position": by_task(E.accepted_per_pos, by="task, position"),
        "decode_steps": by_task(E.decode_steps),
        "spec_steps": by_task(E.spec_steps),
        "full_depth_per_position": by_task(E.full_depth_per_pos, by="task, position"),
        "full_depth_steps": by_task(E.full_depth_steps),
        "without_per_step": by_task(E.steps_without_per_step),
        "requests": by_task(E.requests, ', outcome="ok"'),
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


def _by_task(url: str, expr: str, at: float | None = None) -> dict[str, float]:
    return {r["metric"].get("task", ""): float(r["value"][1]) for r in _query(url, expr, at)}


def _by_task_position(url: str, expr: str, at: float | None = None) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {}
    for r in _query(url, expr, at):
        out.setdefault(r["metric"].get("task", ""), {})[int(r["metric"]["position"])] = float(r["value"][1])
    return out


def acceptance(url: str, window: str, variant: str, sweep_acceptance: Mapping[str, Sequence[float]],
               k: int, at: float | None = None) -> LiveAcceptance:
    """P per task (full-depth steps where every step of the window came with per-step data), the mix, the basis;
    tasks without decode steps are left out. `at`: the window's end (Unix seconds; default now)."""
    q = queries(window, variant)
    decode, spec = _by_task(url, q["decode_steps"], at), _by_task(url, q["spec_steps"], at)
    full_steps = _by_task(url, q["full_depth_steps"], at)
    summary_only = _by_task(url, q["without_per_step"], at)
    per_pos = _by_task_position(url, q["per_position"], at)
    full_per_pos = _by_task_position(url, q["full_depth_per_position"], at)
    mix = _by_task(url, q["requests"], at)
    out: dict[str, tuple[float, ...]] = {}
    basis: dict[str, str] = {}
    for task, n in decode.items():
        if n <= 0 or task not in per_pos:
            continue
        steps, full = spec.get(task, 0.0), full_steps.get(task, 0.0)
        # detailed throughout the window: no verify step came without per-step data
        if full > 0 and steps > 0 and summary_only.get(task, 0.0) == 0:
            measured, scale = full_per_pos.get(task, {}), steps / n
            live = [measured.get(p, 0.0) / full * scale for p in range(max(per_pos[task]) + 1)]
            basis[task] = (f"the {full:.0f} of {steps:.0f} verify steps that drafted all k tokens, times the "
                           f"{scale:.1%} of {n:.0f} decode steps that drafted")
        else:
            measured = per_pos[task]
            live = [measured.get(p, 0.0) / n for p in range(max(measured) + 1)]
            why = ("no per-step data: the servers run summary mode" if summary_only.get(task, 0.0) > 0
                   else "no step of the window drafted all k tokens")
            basis[task] = (f"every one of {n:.0f} decode steps ({why}, so a draft too short to reach a position "
                           "counts as a rejection there)")
        out[task] = extend(live, sweep_acceptance.get(task, ()), k)
    if not out:
        raise LiveError(f"{url}: no decode steps with drafts in the last {window} (variant=~\"{variant}\")")
    return LiveAcceptance(out, {t: w for t, w in mix.items() if t in out and w > 0}, basis)


def data_parallel_size(url: str, window: str, variant: str) -> int:
    """The most engines (vLLM's `engine` label, its data-parallel rank) any one server of the variant(s) reported
    in the window; 0 when Prometheus scraped none (no vLLM job in this Prometheus)."""
    family = MONITORING.vllm.running
    expr = (f"max(count by (instance) (count by (instance, engine) "
            f"(last_over_time({family}{{variant=~\"{variant}\"}}[{window}]))))")
    result = _query(url, expr)
    return int(float(result[0]["value"][1])) if result else 0
