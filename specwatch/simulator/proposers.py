"""Draft proposers: real n-gram prompt lookup, real suffix matching, and modelled drafters.

Each proposer sees the request's context (prompt + generated pieces) and returns up to k
proposed pieces. Verification happens elsewhere (the engine compares the proposal with the
target's tokens), so acceptance is measured, never set. The n-gram and suffix proposers
can return nothing (no match: the step is not a draft); modelled drafters (draft_model,
eagle, eagle3, mtp) always propose k pieces, agreeing with the target's next piece with a
per-position conditional probability, higher where the next piece is copyable from the
context (as learned drafters are on code).
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence

MISS = "\x00miss"  # a proposed piece the target never produces

# Conditional per-position agreement (P(accept p | accepted p - 1)) by method, before the copy
# boost. Calibrated to published vLLM figures (../shared/reference/published-sd-figures.md):
# EAGLE-3 E7 (.59 .51 .50 .53 .54) and E5 on code (.77 .58 .53); draft_model has no published
# Qwen3 pair and is set a little below EAGLE-3; MTP k=1 from MiMo's report (about 0.75-0.9).
DEFAULT_PROFILES: dict[str, tuple[float, ...]] = {
    "eagle3": (0.62, 0.55, 0.52, 0.52, 0.50),
    "eagle": (0.55, 0.50, 0.47, 0.45, 0.45),
    "draft_model": (0.58, 0.52, 0.50, 0.50, 0.48),
    "mtp": (0.80, 0.60, 0.50),
}
COPY_BOOST = 0.6  # share of the remaining disagreement removed when the next piece is copyable


class NgramIndex:
    """Earliest occurrence of every n-gram (n in [n_min, n_max]) of a growing sequence.

    vLLM 0.32.0's CPU proposer (`_find_longest_matched_ngram_and_propose_tokens`) takes the
    longest suffix n-gram that occurred before and, among equally long ones, the earliest.
    """

    def __init__(self, n_min: int, n_max: int) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[str] = []
        self._earliest: dict[tuple[str, ...], int] = {}

    def extend(self, pieces: Sequence[str]) -> None:
        for piece in pieces:
            # n-grams ending at the current last token become "earlier" once a new token arrives
            end = len(self.tokens)
            for n in range(self.n_min, self.n_max + 1):
                if end - n >= 0:
                    self._earliest.setdefault(tuple(self.tokens[end - n:end]), end - n)
            self.tokens.append(piece)

    def propose(self, k: int) -> list[str]:
        """Up to k pieces following the longest suffix n-gram seen earlier (its earliest occurrence)."""
        size = len(self.tokens)
        for n in range(min(self.n_max, size), self.n_min - 1, -1):
            start = self._earliest.get(tuple(self.tokens[size - n:]))
            if start is not None:
                return self.tokens[start + n:start + n + k]
        return []


class SuffixIndex:
    """Suffix matching over the request's history and, when caching, past requests' outputs.

    The longest suffix of the context (up to `max_depth` pieces) that occurred before selects
    the candidate continuations; the proposal walks forward taking the most frequent next
    piece while its share stays >= `min_token_prob`, for at most min(k, spec_factor x match).
    """

    def __init__(self, max_depth: int, min_token_prob: float, spec_factor: float,
                 cache: SuffixCache | None = None) -> None:
        self.max_depth, self.min_prob, self.spec_factor = max_depth, min_token_prob, spec_factor
        self.tokens: list[str] = []
        self._starts: dict[tuple[str, ...], list[int]] = {}
        self.cache = cache

    def extend(self, pieces: Sequence[str]) -> None:
        for piece in pieces:
            end = len(self.tokens)
            for n in range(1, min(self.max_depth, end) + 1):
                self._starts.setdefault(tuple(self.tokens[end - n:end]), []).append(end - n)
            self.tokens.append(piece)

    def propose(self, k: int) -> list[str]:
        size = len(self.tokens)
        for n in range(min(self.max_depth, size), 0, -1):
            key = tuple(self.tokens[size - n:])
            sources: list[tuple[Sequence[str], int]] = [(self.tokens, s + n) for s in self._starts.get(key, ())]
            if self.cache is not None:
                sources += self.cache.continuations(key)
            if sources:
                return self._walk(sources, min(k, max(1, int(self.spec_factor * n))))
        return []

    def _walk(self, sources: list[tuple[Sequence[str], int]], limit: int) -> list[str]:
        out: list[str] = []
        while len(out) < limit:
            counts: dict[str, int] = {}
            for seq, pos in sources:
                if pos < len(seq):
                    counts[seq[pos]] = counts.get(seq[pos], 0) + 1
            if not counts:
                break
            piece, count = max(counts.items(), key=lambda kv: kv[1])
            if count / len(sources) < self.min_prob:
                break
            out.append(piece)
            sources = [(seq, pos + 1) for seq, pos in sources if pos < len(seq) and seq[pos] == piece]
        return out


class SuffixCache:
    """Outputs of the last `max_requests` finished requests, shared by every request's SuffixIndex."""

    def __init__(self, max_requests: int, max_depth: int) -> None:
        self.max_depth = max_depth
        self._outputs: deque[tuple[list[str], dict[tuple[str, ...], list[int]]]] = deque(maxlen=max_requests)

    def add(self, output: Sequence[str]) -> None:
        if self._outputs.maxlen == 0:
            return
        starts: dict[tuple[str, ...], list[int]] = {}
        tokens = list(output)
        for end in range(1, len(tokens) + 1):
            for n in range(1, min(self.max_depth, end) + 1):
                starts.setdefault(tuple(tokens[end - n:end]), []).append(end - n)
        self._outputs.append((tokens, starts))

    def continuations(self, key: tuple[str, ...]) -> list[tuple[Sequence[str], int]]:
        return [(tokens, s + len(key)) for tokens, starts in self._outputs for s in starts.get(key, ())]


class ModelledDrafter:
    """A learned drafter's behaviour: per-position agreement with the target, boosted where copyable."""

    def __init__(self, profile: Sequence[float], rng: random.Random) -> None:
        if not profile:
            raise ValueError("a drafter profile needs at least one position")
        self.profile, self.rng = tuple(profile), rng

    def propose(self, upcoming: Sequence[str], k: int, copyable: Sequence[bool]) -> list[str]:
        """k pieces; `upcoming` are the target's next pieces, `copyable[i]` whether piece i is in an n-gram match."""
        out: list[str] = []
        agreeing = True
        for p in range(k):
            c = self.profile[min(p, len(self.profile) - 1)]
            if p < len(copyable) and copyable[p]:
                c += (1 - c) * COPY_BOOST
            agreeing = agreeing and p < len(upcoming) and self.rng.random() < c
            out.append(upcoming[p] if agreeing else MISS)
        return out
