"""Read vLLM's `/metrics` exposition: spec-decode counters summed over engines, and their differences.

Counters are cumulative since process start, so only the difference of two reads means
anything. A counter that went down between the reads means the server restarted, which
is reported as an error, never turned into a negative or silently wrong number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class CounterResetError(ValueError):
    """A counter decreased between two reads: the process restarted in between."""


@dataclass(frozen=True)
class SpecDecodeCounters:
    """vLLM's four spec-decode counters, summed across engines and model names."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)

    def minus(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        pairs = {"drafts": (self.drafts, before.drafts),
                 "draft_tokens": (self.draft_tokens, before.draft_tokens),
                 "accepted": (self.accepted, before.accepted)}
        pairs.update({f"per_position[{p}]": (self.per_position.get(p, 0.0), v)
                      for p, v in before.per_position.items()})
        for name, (after, earlier) in pairs.items():
            if after < earlier:
                raise CounterResetError(
                    f"spec-decode counter {name} went from {earlier} to {after}: the server "
                    "restarted between the two reads")
        return SpecDecodeCounters(
            self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
            self.accepted - before.accepted,
            {p: v - before.per_position.get(p, 0.0) for p, v in self.per_position.items()})


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (sample name, sorted labels)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def spec_decode_counters(text: str) -> SpecDecodeCounters:
    drafts = draft_tokens = accepted = 0.0
    per_pos: dict[int, float] = {}
    for (name, labels), value in samples(text).items():
        if name == DRAFTS:
            drafts += value
        elif name == DRAFT_TOKENS:
            draft_tokens += value
        elif name == ACCEPTED:
            accepted += value
        elif name == PER_POS:
            pos = int(dict(labels)["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    return SpecDecodeCounters(drafts, draft_tokens, accepted, dict(sorted(per_pos.items())))
