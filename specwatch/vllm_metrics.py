"""Read vLLM's `/metrics` exposition: its samples, and the names of the four spec-decode counters.

Counters are cumulative since process start, so only the difference of two reads means anything: that difference
is `specwatch.snapshot`'s (summed over engines, per position, a restart refused with CounterResetError, never a
negative or silently wrong number), the one reader of /metrics differences.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


class CounterResetError(ValueError):
    """A counter decreased between two reads: the process restarted in between."""


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (sample name, sorted labels)."""
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out
