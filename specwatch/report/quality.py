"""Quality of a variant's greedy outputs: identical to the baseline's, and (code task) the edit done right.

Greedy speculative decoding returns the target model's own greedy text, up to the numerics of the
forward pass: a verify step scores several tokens in one batch shape, a plain decode step one, and
where the model's two best tokens are within a rounding step of each other the argmax can flip,
after which the texts part for good. On the real CPU server (SmolLM2-135M, bfloat16) every parting
seen was such a flip: the baseline's top two 0.125 nats apart (one bfloat16 step of a logit between
16 and 32), the variant's exactly tied. So where a text differs, `parting` finds the first token that
differs and reads both runs' top logprobs there (the acceptance pass asks for two per token): the
swing is how far the two tokens' logprob difference moved between the runs (the baseline's margin
for its token plus the variant's for its own). A swing within `NEAR_TIE_NATS` is a near-tie, said as
numerics and not counted against the variant; anything else, or a parting without logprobs on both
sides, is a quality difference (a NO-GO). vLLM's own spec-decode tests accept 66 % exact matches
instead; this keeps every difference visible and explained.

The article's code prompt asks to change one function's multiplier and keep the eleven others;
`code_edit_correct` checks exactly that on the output text. Other prompts get the identity check only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specwatch.report.results import Output

EDIT_REQUEST = re.compile(r"scale_(\d+)\D+?(\d+)")
FUNCTION = re.compile(r"def (scale_\d+)\(value\):\s*\n\s*return value \* (\d+)")
SOURCE_FUNCTIONS = 12


# Two bfloat16 steps of a logit between 16 and 32 (one step: 0.125, the swing of every parting measured on the
# CPU server); a draft that changed the target's choice would move it by whole nats. The logprobs come out of a
# float32 log-softmax, so two steps read a hair either side of 0.25 (0.2502 once, row 5 token 13 of the test tier's
# study): the comparison allows FLOAT_SLACK_NATS for that, far below a step.
NEAR_TIE_NATS = 0.25
FLOAT_SLACK_NATS = 0.005
# Where one run had the two tokens exactly tied (its argmax a coin flip), the other's margin may be one bfloat16 step
# of a larger logit: 0.5 between 64 and 128, as end-of-turn tokens reach (seen once: EAGLE-3 preferred "\n" over
# "<|im_end|>" by 0.5 where the baseline tied them, row 4 token 32 of the test tier's code prompts).
TIED_STEP_NATS = 0.5


@dataclass(frozen=True)
class Parting:
    """Where a variant's greedy output leaves the baseline's: the first token that differs, and by how much each
    run preferred its own token there (its logprob minus the other's; None: the other is not in its top list)."""

    index: int  # the request's row
    position: int  # output tokens before it
    baseline_token: str
    variant_token: str
    baseline_margin: float | None
    variant_margin: float | None

    @property
    def swing(self) -> float | None:
        if self.baseline_margin is None or self.variant_margin is None:
            return None
        return self.baseline_margin + self.variant_margin

    def near_tie(self, nats: float = NEAR_TIE_NATS) -> bool:
        """Numerics, not quality: a swing within `nats`, or an exact tie in one run and one step of a large logit in
        the other (`TIED_STEP_NATS`)."""
        if self.swing is None or self.baseline_margin is None or self.variant_margin is None:
            return False
        margins = sorted((self.baseline_margin, self.variant_margin))
        tied = margins[0] == 0.0 and margins[1] <= TIED_STEP_NATS + FLOAT_SLACK_NATS
        return self.swing <= nats + FLOAT_SLACK_NATS or tied

    def describe(self) -> str:
        swing = "no logprobs to compare" if self.swing is None else f"swing {self.swing:.3f} nats"
        return f"row {self.index}, token {self.position}: {self.baseline_token!r} vs {self.variant_token!r} ({swing})"


@dataclass(frozen=True)
class Identity:
    compared: int
    identical: int
    different_indices: tuple[int, ...]
    partings: tuple[Parting, ...] = ()  # one per differing request whose tokens show where it parts

    @property
    def all_identical(self) -> bool:
        return self.compared > 0 and self.identical == self.compared

    @property
    def near_ties(self) -> int:
        """Differing requests that part at a near-tie: numerics, not quality."""
        return sum(p.near_tie() for p in self.partings)

    @property
    def quality_differences(self) -> int:
        return self.compared - self.identical - self.near_ties


def parting(output: Output, base: Output) -> Parting | None:
    """The first differing token of two outputs with tokens; None without tokens on both sides or where the token
    lists agree as far as the shorter goes (one output stopped earlier: not a near-tie)."""
    for position, (mine, theirs) in enumerate(zip(output.tokens, base.tokens, strict=False)):
        if mine.text != theirs.text:
            base_other, mine_other = dict(theirs.top).get(mine.text), dict(mine.top).get(theirs.text)
            return Parting(output.index, position, theirs.text, mine.text,
                           None if base_other is None else theirs.logprob - base_other,
                           None if mine_other is None else mine.logprob - mine_other)
    return None


def identity(outputs: list[Output], baseline: list[Output]) -> Identity:
    """Request by request (same task, same row index): is the text the baseline's, and where not, where it parts."""
    base = {o.index: o for o in baseline}
    pairs = [(o, o.text == base[o.index].text) for o in outputs if o.index in base]
    partings = tuple(p for o, same in pairs if not same and (p := parting(o, base[o.index])) is not None)
    return Identity(len(pairs), sum(same for _, same in pairs), tuple(o.index for o, same in pairs if not same),
                    partings)


def code_edit_correct(prompt: str, text: str) -> bool | None:
    """True when the asked function has the new multiplier and the others their original ones; None when the
    prompt is not the article's code edit."""
    asked = EDIT_REQUEST.search(prompt)
    if asked is None or "def scale_0(value)" not in prompt:
        return None
    fn, multiplier = int(asked.group(1)), int(asked.group(2))
    found = dict(FUNCTION.findall(text))
    expected = {f"scale_{i}": str(multiplier if i == fn else i + 1) for i in range(SOURCE_FUNCTIONS)}
    return found == expected


def code_correct_share(outputs: list[Output], prompts: list[str]) -> tuple[int, int]:
    """(correct, judged) over the outputs whose prompt is the article's code edit."""
    verdicts = [code_edit_correct(prompts[o.index], o.text) for o in outputs if o.index < len(prompts)]
    judged = [v for v in verdicts if v is not None]
    return sum(judged), len(judged)
