"""Reconciliation, the one comparison of the summed per-request spec-decode fields with the server's counters.

For requests that finish on the engine side with n = 1 and no stop string, vLLM 0.32.0 guarantees
Σ num_accepted_draft_tokens = Δ accepted (C), Σ num_draft_tokens = Δ draft tokens (D), Σ num_spec_steps = Δ drafts
(R) and Σ_{j>p} histogram[j] = Δ per_pos{position=p}; and every such request carries the field. The server's side
is the difference `specwatch.snapshot` reads (`Figures`); every study variant's `reconciliation.json`
(`experiment.passes.check_counters`; `specwatch check-server` is a one-variant study) is this list, check by check:
`C`, `D`, `R`, `per_position[p]`, `requests without the field`; and a variant that does not speculate, `baseline D`
(no request carries a draft and the server drafted nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.acceptance import Acceptance
from specwatch.snapshot import Figures


@dataclass(frozen=True)
class Check:
    name: str
    per_request: float
    server: float
    equal: bool


def _same(name: str, per_request: float, server: float) -> Check:
    return Check(name, per_request, server, per_request == server)


def reconcile(summed: Acceptance, server: Figures | None, speculative: bool = True) -> list[Check]:
    """Each counter's difference (`server`; None: the server has no spec-decode counters, all zero) against the sum
    of the per-request fields; `speculative=False` for a variant that drafts nothing."""
    server = server or Figures()
    if not speculative:
        return [Check("baseline D", summed.drafted, server.draft_tokens,
                      summed.drafted == 0 and server.draft_tokens == 0)]
    checks = [_same("C", summed.accepted, server.accepted), _same("D", summed.drafted, server.draft_tokens),
              _same("R", summed.steps, server.steps)]
    survival = summed.survival  # Σ_{j>p} histogram[j]: the steps that accepted at least p + 1, what per_pos adds up
    for p in range(max(len(survival), len(server.per_position))):
        checks.append(_same(f"per_position[{p}]", survival[p] if p < len(survival) else 0,
                            server.per_position[p] if p < len(server.per_position) else 0))
    checks.append(Check("requests without the field", summed.missing, 0, summed.missing == 0))
    return checks
