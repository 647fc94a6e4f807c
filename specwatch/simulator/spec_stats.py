"""Per-request speculative-decoding accounting, serialised exactly as vLLM 0.32.0's RequestSpecDecodeMetrics."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestSpecStats:
    """One histogram observation per verify step that had at least one draft slot."""

    k: int
    histogram: list[int] = field(default_factory=list)
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.k + 1)

    def observe(self, drafted: int, accepted: int) -> None:
        self.histogram[accepted] += 1
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.per_step_accepted.append(accepted)
        self.per_step_drafted.append(drafted)

    def to_dict(self, detailed: bool) -> dict[str, Any]:
        """Field order and values as `RequestSpecDecodeMetrics.to_dict()` (vllm/v1/metrics/stats.py)."""
        return {
            "mean_acceptance_length": 1 + self.accepted / self.steps if self.steps else 1.0,
            "draft_acceptance_rate": self.accepted / self.drafted if self.drafted else 0.0,
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": self.steps,
            "num_accepted_draft_tokens": self.accepted,
            "num_draft_tokens": self.drafted,
            "num_spec_tokens": self.k,
            # vLLM adds the arrays only when they hold a step (`if self.per_step_accepted:`), and the response
            # drops nulls: a detailed request that never drafted has neither key, as in summary mode
            "per_step_accepted": list(self.per_step_accepted) if detailed and self.steps else None,
            "per_step_drafted": list(self.per_step_drafted) if detailed and self.steps else None,
        }
