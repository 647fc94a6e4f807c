"""Reconciliation: per-request spec-decode fields summed over responses vs the server's counter deltas.

For requests that finish on the engine side with n = 1 and no stop string, vLLM 0.32.0
guarantees Σ num_spec_steps = Δ drafts, Σ num_draft_tokens = Δ draft tokens,
Σ num_accepted_draft_tokens = Δ accepted, and Σ_{j>p} histogram[j] = Δ per_pos{position=p}.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.acceptance import Acceptance
from specwatch.vllm_metrics import SpecDecodeCounters


@dataclass(frozen=True)
class Check:
    name: str
    per_request: float
    server: float

    @property
    def equal(self) -> bool:
        return self.per_request == self.server


def reconcile(summed: Acceptance, delta: SpecDecodeCounters) -> list[Check]:
    checks = [
        Check("drafts (R)", summed.steps, delta.drafts),
        Check("draft tokens (D)", summed.drafted, delta.draft_tokens),
        Check("accepted tokens (C)", summed.accepted, delta.accepted),
    ]
    survival = summed.survival  # Σ_{j>p} histogram[j], what per_pos{position=p} adds up
    for p in range(max(len(survival), len(delta.per_position))):
        checks.append(Check(f"per_pos{{position={p}}}", survival[p] if p < len(survival) else 0,
                            delta.per_position.get(p, 0.0)))
    return checks
