"""Quality of a variant's greedy outputs: identical to the baseline's, and (code task) the edit done right.

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


@dataclass(frozen=True)
class Identity:
    compared: int
    identical: int
    different_indices: tuple[int, ...]

    @property
    def all_identical(self) -> bool:
        return self.compared > 0 and self.identical == self.compared


def identity(outputs: list[Output], baseline: list[Output]) -> Identity:
    """Request by request (same task, same row index): is the text the baseline's?"""
    base = {o.index: o.text for o in baseline}
    pairs = [(o.index, o.text == base[o.index]) for o in outputs if o.index in base]
    return Identity(len(pairs), sum(same for _, same in pairs), tuple(i for i, same in pairs if not same))


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
