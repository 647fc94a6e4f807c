"""Per-request `metrics.speculative_decoding` (vLLM 0.32.0): parsed and validated here, summed first, then divided.

`parse()` is the one reader of the wire fields (`num_accepted_draft_tokens` C,
`num_draft_tokens` D, `num_spec_steps` R, the dense `acceptance_histogram` of k + 1 bins);
the tap, the experiment's reconciliation, the load results and the reports all go through it.
`Acceptance` sums C, D, R and the histogram over requests; rates are ratios of those sums,
never averages of per-request percentages. D = 0 gives no rate (None), which is not 0 %.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_K = 64  # the most draft positions a histogram may describe (k + 1 bins); longer is malformed
# The largest count a field may carry: what a float64 (a Prometheus counter's value) holds exactly. A larger one
# (a 400-digit integer) is no count a server produced, and float() of it raises OverflowError.
MAX_COUNT = 2 ** 53

ACCEPTED, DRAFTED, STEPS, HISTOGRAM = (
    "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps", "acceptance_histogram")


class AcceptanceFieldError(ValueError):
    """A `metrics.speculative_decoding` object is malformed; the message names the field."""


def spec_field(response: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The per-request field at the response root (`$.metrics.speculative_decoding`), if any."""
    metrics = response.get("metrics")
    if not isinstance(metrics, Mapping):
        return None
    field = metrics.get("speculative_decoding")
    return field if isinstance(field, Mapping) else None


def rate(accepted: float, drafted: float) -> float | None:
    """C / D of sums; None without drafts (no value, not 0 %)."""
    return accepted / drafted if drafted else None


def mean_length(accepted: float, steps: float) -> float | None:
    """1 + C / R of sums: tokens per verify step, the bonus token included; None without steps."""
    return 1 + accepted / steps if steps else None


def survival(histogram: Sequence[int]) -> tuple[int, ...]:
    """Steps that accepted at least p + 1 drafts, for p in 0..k-1: vLLM's per-position counter."""
    return tuple(sum(histogram[p + 1:]) for p in range(len(histogram) - 1))


@dataclass(frozen=True)
class SpecFields:
    """One request's validated field."""

    accepted: int  # C
    drafted: int  # D
    steps: int  # R
    histogram: tuple[int, ...]  # steps that accepted exactly 0..k drafts

    @property
    def acceptance_rate(self) -> float | None:
        """C / D for this request alone; None without drafts."""
        return rate(self.accepted, self.drafted)


def parse(field: Mapping[str, Any]) -> SpecFields:
    """Validate one `metrics.speculative_decoding` object; AcceptanceFieldError names the bad key.

    Beyond each value's type and range, the fields must agree as vLLM 0.32.0 computes them (the wire format's
    section on the per-request field): the steps are the histogram's sum, the accepted tokens its weighted
    sum, and C <= D <= k * R (a draft is at most k slots, an accepted token is a drafted one). A field that
    contradicts itself (C = 50 with D = 4) is malformed, not a 12.5 acceptance rate."""
    if not isinstance(field, Mapping):
        raise AcceptanceFieldError(f"speculative_decoding: expected an object, got {_short(field)}")
    f = SpecFields(_int(field, ACCEPTED), _int(field, DRAFTED), _int(field, STEPS), _histogram(field))
    k = len(f.histogram) - 1
    if f.steps != sum(f.histogram):
        raise AcceptanceFieldError(f"speculative_decoding: {STEPS} {f.steps} is not the sum of {HISTOGRAM} "
                                   f"{list(f.histogram)}")
    if f.accepted != sum(j * h for j, h in enumerate(f.histogram)):
        raise AcceptanceFieldError(f"speculative_decoding: {ACCEPTED} {f.accepted} is not the weighted sum of "
                                   f"{HISTOGRAM} {list(f.histogram)}")
    if not f.accepted <= f.drafted <= k * f.steps:
        raise AcceptanceFieldError(f"speculative_decoding: expected {ACCEPTED} <= {DRAFTED} <= k x {STEPS}, got "
                                   f"{f.accepted}, {f.drafted} and {k} x {f.steps}")
    return f


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
        return rate(self.accepted, self.drafted)

    @property
    def mean_acceptance_length(self) -> float | None:
        return mean_length(self.accepted, self.steps)

    @property
    def survival(self) -> tuple[int, ...]:
        """Summed steps that accepted at least p + 1 drafts (what vLLM's per_pos counter adds up)."""
        return survival(self.histogram)

    @property
    def per_position(self) -> tuple[float, ...]:
        """Unconditional P(accepted >= p + 1) per verify step, as vLLM's per_pos / drafts."""
        if not self.steps:
            return ()
        return tuple(s / self.steps for s in self.survival)

    @property
    def drafted_token_share(self) -> float | None:
        """Share of output tokens that came from accepted drafts (C / output tokens)."""
        return self.accepted / self.output_tokens if self.output_tokens else None

    def add(self, field: Mapping[str, Any] | None, output_tokens: int) -> Acceptance:
        """A new total with one more request (field None: the request reported no field)."""
        if field is None:
            return Acceptance(self.requests + 1, self.missing + 1, self.accepted, self.drafted,
                              self.steps, self.histogram, self.output_tokens + output_tokens)
        f = parse(field)
        if self.histogram and len(f.histogram) != len(self.histogram):
            raise AcceptanceFieldError(
                f"acceptance_histogram has {len(f.histogram)} bins, earlier requests had {len(self.histogram)}")
        summed = tuple(a + b for a, b in zip(self.histogram, f.histogram, strict=True)) if self.histogram \
            else f.histogram
        return Acceptance(self.requests + 1, self.missing, self.accepted + f.accepted, self.drafted + f.drafted,
                          self.steps + f.steps, summed, self.output_tokens + output_tokens)

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


def is_count(value: Any) -> bool:
    """An integer in 0..MAX_COUNT (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


def _short(value: Any) -> str:
    """A value for an error message, cut to 80 characters (a 400-digit integer does not fill the log)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def _int(field: Mapping[str, Any], key: str) -> int:
    value = field.get(key)
    if isinstance(value, int) and is_count(value):
        return value
    raise AcceptanceFieldError(f"speculative_decoding.{key}: expected an integer in 0..2^53, got {_short(value)}")


def _histogram(field: Mapping[str, Any]) -> tuple[int, ...]:
    value = field.get(HISTOGRAM)
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_K + 1 or not all(is_count(v) for v in value):
        raise AcceptanceFieldError(f"speculative_decoding.{HISTOGRAM}: expected a list of 1 to {MAX_K + 1} "
                                   f"integers in 0..2^53, got {_short(value)}")
    return tuple(value)
