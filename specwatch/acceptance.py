"""Per-task acceptance from per-request `metrics.speculative_decoding` fields: sum first, then divide.

C (accepted draft tokens), D (draft tokens), R (verify steps with a draft) and the dense
histogram are summed over requests; rates are ratios of those sums, never averages of
per-request percentages. D = 0 gives no rate (None), which is not 0 % acceptance.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class AcceptanceFieldError(ValueError):
    """A `metrics.speculative_decoding` object is malformed; the message names the field."""


def spec_field(response: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The per-request field at the response root (`$.metrics.speculative_decoding`), if any."""
    metrics = response.get("metrics")
    if not isinstance(metrics, Mapping):
        return None
    field = metrics.get("speculative_decoding")
    return field if isinstance(field, Mapping) else None


@dataclass(frozen=True)
class Acceptance:
    """Sums over a set of requests (one task, one variant)."""

    requests: int = 0
    missing: int = 0  # requests that carried no per-request field
    accepted: int = 0  # C
    drafted: int = 0  # D
    steps: int = 0  # R
    histogram: tuple[int, ...] = ()
    output_tokens: int = 0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + C / R: tokens per verify step, the bonus token included."""
        return 1 + self.accepted / self.steps if self.steps else None

    @property
    def per_position(self) -> tuple[float, ...]:
        """Unconditional P(accepted >= p + 1) per verify step, as vLLM's per_pos / drafts."""
        if not self.steps:
            return ()
        survival = [sum(self.histogram[p + 1:]) for p in range(len(self.histogram) - 1)]
        return tuple(s / self.steps for s in survival)

    @property
    def drafted_token_share(self) -> float | None:
        """Share of output tokens that came from accepted drafts (C / output tokens)."""
        return self.accepted / self.output_tokens if self.output_tokens else None

    def add(self, field: Mapping[str, Any] | None, output_tokens: int) -> Acceptance:
        """A new total with one more request (field None: the request reported no field)."""
        if field is None:
            return Acceptance(self.requests + 1, self.missing + 1, self.accepted, self.drafted,
                              self.steps, self.histogram, self.output_tokens + output_tokens)
        hist = _int_list(field, "acceptance_histogram")
        if self.histogram and len(hist) != len(self.histogram):
            raise AcceptanceFieldError(
                f"acceptance_histogram has {len(hist)} bins, earlier requests had {len(self.histogram)}")
        summed = tuple(a + b for a, b in zip(self.histogram, hist, strict=True)) if self.histogram \
            else tuple(hist)
        return Acceptance(
            self.requests + 1, self.missing,
            self.accepted + _int(field, "num_accepted_draft_tokens"),
            self.drafted + _int(field, "num_draft_tokens"),
            self.steps + _int(field, "num_spec_steps"),
            summed, self.output_tokens + output_tokens)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "missing_field": self.missing,
            "C": self.accepted, "D": self.drafted, "R": self.steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "histogram": list(self.histogram), "per_position": list(self.per_position),
            "output_tokens": self.output_tokens, "drafted_token_share": self.drafted_token_share,
        }


def total(responses: Iterable[Mapping[str, Any]]) -> Acceptance:
    """Sum a set of OpenAI-style response bodies (each with `usage` and maybe the field)."""
    acc = Acceptance()
    for body in responses:
        usage = body.get("usage") or {}
        acc = acc.add(spec_field(body), int(usage.get("completion_tokens") or 0))
    return acc


def _int(field: Mapping[str, Any], key: str) -> int:
    value = field.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise AcceptanceFieldError(f"speculative_decoding.{key}: expected a non-negative integer, "
                                   f"got {value!r}")
    return value


def _int_list(field: Mapping[str, Any], key: str) -> list[int]:
    value = field.get(key)
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise AcceptanceFieldError(f"speculative_decoding.{key}: expected a non-empty list of "
                                   f"non-negative integers, got {value!r}")
    return value
