"""The deterministic target "model": what greedy decoding of a prompt produces, as token pieces.

Code-edit prompts (a source with `def` lines and an instruction naming a function and a
number, as in the article) get the edited file back: copy-heavy text. Other code prompts
get the code copied. Everything else gets two paragraphs of novel prose built from a
seeded phrase grammar with the prompt's own content words mixed in. Sampling with
temperature > 0 is seeded by the request's `seed` (or the server's `--seed`) and changes
word choices, so the text stays deterministic for a given (prompt, seed, temperature).
Generation past the natural end (`ignore_eos`) continues with more prose.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from specwatch.simulator.tokens import tokenize

_EDIT = re.compile(r"scale_(\d+)\D{1,40}?(\d+)")
_WORD = re.compile(r"[A-Za-z]{4,}")
_STOP = frozenset("that this with from your have will must should about which there their what when "
                  "while where paragraphs paragraph full explain describe discuss case".split())

OPENERS = ("In practice,", "At the same time,", "For example,", "On the other hand,", "As a result,",
           "In many teams,", "Most of the time,", "When traffic grows,", "From the user's point of view,",
           "In a production system,")
SUBJECTS = ("the service", "an operator", "the team", "a careful engineer", "the scheduler", "each request",
            "the system", "a deployment", "the cache", "the queue")
VERBS = ("has to balance", "needs to measure", "should look at", "can hide", "often depends on", "will expose",
         "must account for", "tends to trade", "quickly reveals", "rarely explains")
OBJECTS = ("the cost of waiting", "the shape of the tail", "the rate of new work", "the limits of capacity",
           "the behaviour under load", "the effect on users", "the price of each choice", "the long tail of delays",
           "the balance between speed and cost", "the risk of rare failures")
TAILS = ("and that matters more than it seems.", "because averages alone are misleading.",
         "so the numbers need context.", "which is easy to overlook.", "and the trade-off is rarely obvious.",
         "while the simple metrics look fine.", "even when everything seems healthy.",
         "until the first serious incident.")


@dataclass(frozen=True)
class Generation:
    """Greedy (or seeded) output: `tokens[:natural_end]` is the answer, the rest is ignore_eos filler."""

    tokens: tuple[str, ...]
    natural_end: int


def _rng(*parts: object) -> random.Random:
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _code_answer(prompt: str) -> str | None:
    lines = prompt.split("\n")
    first_def = next((i for i, line in enumerate(lines) if line.startswith("def ")), None)
    if first_def is None:
        return None
    source = "\n".join(lines[first_def:])
    edit = _EDIT.search("\n".join(lines[:first_def]))
    if edit is None:
        return source
    fn, value = edit.groups()
    pattern = re.compile(rf"(def scale_{fn}\(value\):\n\s+return value \* )\d+")
    return pattern.sub(lambda m: m.group(1) + value, source, count=1)


def _prose(rng: random.Random, prompt: str, sentences: int) -> str:
    words = [w.lower() for w in _WORD.findall(prompt) if w.lower() not in _STOP] or ["latency"]
    out: list[str] = []
    for i in range(sentences):
        topic = " ".join(rng.sample(words, k=min(2, len(words))))
        sentence = (f"{rng.choice(OPENERS)} {rng.choice(SUBJECTS)} {rng.choice(VERBS)} "
                    f"{rng.choice(OBJECTS)} of {topic} {rng.choice(TAILS)}")
        out.append(sentence if i == 0 else " " + sentence)
    return "".join(out)


def generate(prompt: str, max_tokens: int, *, temperature: float = 0.0, seed: int | None = None) -> Generation:
    """The output for a prompt, at least `max_tokens` long (so ignore_eos never runs dry)."""
    sampled = temperature > 0
    rng = _rng(prompt, seed if sampled else "greedy", round(temperature, 3) if sampled else 0)
    answer = _code_answer(prompt)
    if answer is not None and sampled:
        # a sampled answer drifts away from the copy at a rate that grows with temperature
        pieces = tokenize(answer)
        drift = min(0.5, 0.03 * temperature)
        answer = "".join(p if rng.random() > drift else " " + rng.choice(OBJECTS).split()[-1] for p in pieces)
    if answer is None:
        answer = _prose(rng, prompt, 5) + "\n\n" + _prose(rng, prompt, 5)
    tokens = tokenize(answer)
    natural_end = len(tokens)
    while len(tokens) < max_tokens:
        tokens += tokenize("\n\n" + _prose(rng, prompt, 6))
    return Generation(tuple(tokens), natural_end)
