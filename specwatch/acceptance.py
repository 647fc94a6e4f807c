"""Per-request `metrics.speculative_decoding` (vLLM 0.32.0): parsed and validated here, summed first, then divided.

`parse()` is the one reader of the wire fields (`num_accepted_draft_tokens` C,
`num_draft_tokens` D, `num_spec_steps` R, the dense `acceptance_histogram` of k + 1 bins, and in
vLLM's `detailed` mode `per_step_accepted` / `per_step_drafted`); the tap, the experiment's
reconciliation, the load results and the reports all go through it. `Acceptance` sums C, D, R
and the histogram over requests; rates are ratios of those sums, never averages of per-request
percentages. D = 0 gives no rate (None), which is not 0 %.

Acceptance by position has two definitions, named wherever it is shown:
- **per draft** (every mode): steps that accepted position p / all verify steps, vLLM's
  `per_pos / num_drafts`. When drafts vary in length (suffix, n-gram, a per-batch-size k), a
  draft too short to reach p counts as a rejection there.
- **of drafts that reached it** (`detailed` mode only): steps that accepted p / steps whose draft
  had at least p + 1 tokens (`reached`), from `per_step_drafted`. With a fixed k the two agree.
Steps at **full depth** (drafted the configured k) are what `specwatch tune` reads live: their
survival is the acceptance of a draft free to reach every position.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

MAX_K = 64  # the most draft positions a histogram may describe (k + 1 bins); longer is malformed
# The largest count a field may carry: what a float64 (a Prometheus counter's value) holds exactly. A larger one
# (a 400-digit integer) is no count a server produced, and float() of it raises OverflowError.
MAX_COUNT = 2 ** 53

ACCEPTED, DRAFTED, STEPS, HISTOGRAM = (
    "num_accepted_draft_tokens", "num_draft_tokens", "num_spec_steps", "acceptance_histogram")
STEP_ACCEPTED, STEP_DRAFTED = "per_step_accepted", "per_step_drafted"
PER_DRAFT = "per draft: steps accepting position p / all verify steps (short drafts count as rejections)"
OF_REACHED = "of drafts that reached it: steps accepting position p / steps drafting at least p + 1 tokens"


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


def reached(per_step: Sequence[tuple[int, int]], k: int) -> tuple[int, ...]:
    """Steps whose draft had at least p + 1 tokens, for p in 0..k-1 (per_step: (accepted, drafted) pairs, each
    drafted <= k): one pass to count draft lengths, then their running sum from the longest (the tap's hot path)."""
    lengths = [0] * (k + 1)
    for _, d in per_step:
        lengths[d] += 1
    out, running = [0] * k, 0
    for p in range(k - 1, -1, -1):
        running += lengths[p + 1]
        out[p] = running
    return tuple(out)


def full_depth_histogram(per_step: Sequence[tuple[int, int]], k: int) -> tuple[int, ...]:
    """Steps that drafted all k tokens, by the number they accepted (k + 1 bins)."""
    out = [0] * (k + 1)
    for a, d in per_step:
        if d == k:
            out[a] += 1
    return tuple(out)


@dataclass(frozen=True)
class SpecFields:
    """One request's validated field."""

    accepted: int  # C
    drafted: int  # D
    steps: int  # R
    histogram: tuple[int, ...]  # steps that accepted exactly 0..k drafts
    per_step: tuple[tuple[int, int], ...] | None = None  # (accepted, drafted) per step, `detailed` mode only

    @property
    def k(self) -> int:
        return len(self.histogram) - 1

    @property
    def acceptance_rate(self) -> float | None:
        """C / D for this request alone; None without drafts."""
        return rate(self.accepted, self.drafted)

    @property
    def reached(self) -> tuple[int, ...] | None:
        """Steps whose draft reached position p (None without per-step data)."""
        return None if self.per_step is None else reached(self.per_step, self.k)

    @property
    def full_depth(self) -> tuple[int, ...] | None:
        """Full-depth steps by accepted count (None without per-step data)."""
        return None if self.per_step is None else full_depth_histogram(self.per_step, self.k)


def parse(field: Mapping[str, Any]) -> SpecFields:
    """Validate one `metrics.speculative_decoding` object; AcceptanceFieldError names the bad key.

    Beyond each value's type and range, the fields must agree as vLLM 0.32.0 computes them (the wire format's
    section on the per-request field): the steps are the histogram's sum, the accepted tokens its weighted
    sum, and C <= D <= k * R (a draft is at most k slots, an accepted token is a drafted one). A field that
    contradicts itself (C = 50 with D = 4) is malformed, not a 12.5 acceptance rate."""
    if not isinstance(field, Mapping):
        raise AcceptanceFieldError(f"speculative_decoding: expected an object, got {_short(field)}")
    f = SpecFields(_int(field, ACCEPTED), _int(field, DRAFTED), _int(field, STEPS), _histogram(field))
    k = f.k
    if f.steps != sum(f.histogram):
        raise AcceptanceFieldError(f"speculative_decoding: {STEPS} {f.steps} is not the sum of {HISTOGRAM} "
                                   f"{list(f.histogram)}")
    if f.accepted != sum(j * h for j, h in enumerate(f.histogram)):
        raise AcceptanceFieldError(f"speculative_decoding: {ACCEPTED} {f.accepted} is not the weighted sum of "
                                   f"{HISTOGRAM} {list(f.histogram)}")
    if not f.accepted <= f.drafted <= k * f.steps:
        raise AcceptanceFieldError(f"speculative_decoding: expected {ACCEPTED} <= {DRAFTED} <= k x {STEPS}, got "
                                   f"{f.accepted}, {f.drafted} and {k} x {f.steps}")
    per_step = _per_step(field, f)
    return f if per_step is None else SpecFields(f.accepted, f.drafted, f.steps, f.histogram, per_step)


def _per_step(field: Mapping[str, Any], f: SpecFields) -> tuple[tuple[int, int], ...] | None:
    """The `detailed` arrays as (accepted, drafted) pairs, checked against the summary: one pair per step, the
    accepted counts those of the histogram, the sums C and D, each step 0 <= accepted <= drafted <= k. Absent
    (summary mode, or vLLM leaving empty arrays out): None; one without the other is malformed."""
    accepted, drafted = field.get(STEP_ACCEPTED), field.get(STEP_DRAFTED)
    if accepted is None and drafted is None:
        return None
    for key, value in ((STEP_ACCEPTED, accepted), (STEP_DRAFTED, drafted)):
        if not isinstance(value, list) or len(value) != f.steps or not all(is_count(v) for v in value):
            raise AcceptanceFieldError(f"speculative_decoding.{key}: expected a list of {STEPS} ({f.steps}) "
                                       f"integers, got {_short(value)}")
    assert isinstance(accepted, list) and isinstance(drafted, list)
    pairs = tuple(zip(accepted, drafted, strict=True))
    bad = next((i for i, (a, d) in enumerate(pairs) if not a <= d <= f.k), None)
    if bad is not None:
        raise AcceptanceFieldError(f"speculative_decoding: step {bad} accepted {pairs[bad][0]} of "
                                   f"{pairs[bad][1]} drafted, expected accepted <= drafted <= k ({f.k})")
    counts = [0] * (f.k + 1)
    for a in accepted:
        counts[a] += 1
    if tuple(counts) != f.histogram or sum(drafted) != f.drafted:
        raise AcceptanceFieldError(f"speculative_decoding: {STEP_ACCEPTED} / {STEP_DRAFTED} disagree with "
                                   f"{HISTOGRAM} {list(f.histogram)} or {DRAFTED} {f.drafted}")
    return pairs


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
    # from the requests that carried per-step data (`detailed` mode) alone:
    detailed_steps: int = 0  # their verify steps
    detailed_survival: tuple[int, ...] = ()  # their steps that accepted at least p + 1
    reached: tuple[int, ...] = ()  # their steps whose draft had at least p + 1 tokens
    full_depth: tuple[int, ...] = ()  # their steps that drafted k, by accepted count

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
        """Per draft (PER_DRAFT): P(accepted >= p + 1) per verify step, as vLLM's per_pos / drafts."""
        if not self.steps:
            return ()
        return tuple(s / self.steps for s in self.survival)

    @property
    def per_position_of_reached(self) -> tuple[float | None, ...]:
        """Of drafts that reached it (OF_REACHED), from the detailed requests; () without any, None at a position
        no draft reached."""
        return tuple(rate(a, n) for a, n in zip(self.detailed_survival, self.reached, strict=True))

    @property
    def full_depth_per_position(self) -> tuple[float, ...]:
        """P(accepted >= p + 1) among steps that drafted k: a draft free to reach every position."""
        steps = sum(self.full_depth)
        return tuple(s / steps for s in survival(self.full_depth)) if steps else ()

    @property
    def detailed(self) -> bool:
        """Every verify step came with per-step data, so the reached figures cover them all."""
        return bool(self.steps) and self.detailed_steps == self.steps

    @property
    def drafted_token_share(self) -> float | None:
        """Share of output tokens that came from accepted drafts (C / output tokens)."""
        return self.accepted / self.output_tokens if self.output_tokens else None

    def add(self, field: Mapping[str, Any] | None, output_tokens: int) -> Acceptance:
        """A new total with one more request (field None: the request reported no field)."""
        if field is None:
            return replace(self, requests=self.requests + 1, missing=self.missing + 1,
                           output_tokens=self.output_tokens + output_tokens)
        f = parse(field)
        if self.histogram and len(f.histogram) != len(self.histogram):
            raise AcceptanceFieldError(
                f"acceptance_histogram has {len(f.histogram)} bins, earlier requests had {len(self.histogram)}")
        detailed: dict[str, Any] = {}
        if f.per_step is not None:
            assert f.reached is not None and f.full_depth is not None
            detailed = {"detailed_steps": self.detailed_steps + f.steps,
                        "detailed_survival": _add(self.detailed_survival, survival(f.histogram)),
                        "reached": _add(self.reached, f.reached), "full_depth": _add(self.full_depth, f.full_depth)}
        return replace(self, requests=self.requests + 1, accepted=self.accepted + f.accepted,
                       drafted=self.drafted + f.drafted, steps=self.steps + f.steps,
                       histogram=_add(self.histogram, f.histogram), output_tokens=self.output_tokens + output_tokens,
                       **detailed)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests, "missing_field": self.missing,
            "C": self.accepted, "D": self.drafted, "R": self.steps,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "histogram": list(self.histogram), "per_position": list(self.per_position),
            "output_tokens": self.output_tokens, "drafted_token_share": self.drafted_token_share,
            "detailed_steps": self.detailed_steps, "reached": list(self.reached),
            "per_position_of_reached": list(self.per_position_of_reached),
            "full_depth_histogram": list(self.full_depth),
        }


def total(responses: Iterable[Mapping[str, Any]]) -> Acceptance:
    """Sum a set of OpenAI-style response bodies (each with `usage` and maybe the field)."""
    acc = Acceptance()
    for body in responses:
        usage = body.get("usage") or {}
        acc = acc.add(spec_field(body), int(usage.get("completion_tokens") or 0))
    return acc


def _add(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Element-wise sum of two equal-length count tuples (an empty one is zeros)."""
    return tuple(x + y for x, y in zip(a, b, strict=True)) if a else b


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
