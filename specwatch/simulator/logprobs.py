"""The log-probabilities the simulator reports when a request asks for them, in vLLM 0.32.0's shapes.

Requests are validated as vLLM validates them, with its messages: chat's `logprobs` (a boolean)
and `top_logprobs` (0 to 20 alternatives per position), completions' `logprobs` (0 to 20).
Every generated token gets a position, the end-of-sequence token included (as `<|im_end|>`),
so a response has as many positions as `usage.completion_tokens`, streamed with the step that
produced them (a step whose text is held back for a possible stop string still sends its
positions).

The simulator has no vocabulary and no logits. Its target is its own greedy choice, so each
chosen token is reported as the most likely one, with a log-probability drawn deterministically
from the token and its position (most near 0, some down to -2.5, as a small model's are), and
the alternatives are common pieces below it (by at least 0.125 each) whose probabilities, with
the chosen token's, sum to at most 1. The values are plausible, not a model's: they exist so
that clients that ask for logprobs get the real server's shape, and so that code reading them
can be exercised.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specwatch.simulator.engine import EOS

MAX_LOGPROBS = 20  # vLLM's `--max-logprobs` default: the most alternatives a request may ask for
VOCAB_SIZE = 49152  # SmolLM2's: what `-1` (the whole vocabulary) asks for, refused as above the maximum
EOS_TEXT = "<|im_end|>"  # the end-of-sequence token as the real server names it (SmolLM2's chat template)
STEP = 0.125  # the least gap below the token before: one bfloat16 step at logits 16-32, as the real server's
FLOOR = -9999.0  # vLLM's clamp for a log-probability of a token with no probability
ALTERNATIVES = (" the", ",", ".", " a", "\n", " to", " and", " of", " is", " in", " that", " it", "(", ")",
                " value", " *", "_", "0", "1", "2", " return", " def", ":", " for", " be", " with", " on",
                " as", " this", " can")


class LogprobsError(ValueError):
    """A request's logprobs fields as vLLM refuses them: the message and the parameter it names."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Position:
    """One generated token: its text, its log-probability, and the top alternatives (itself first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]


def _integer(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)):  # bool is an int, as in vLLM (true asks for 1)
        raise LogprobsError(f"`{key}` must be an integer. (parameter={key}, value={value})", key)
    if isinstance(value, float) and not value.is_integer():  # a fraction, or JSON's Infinity / NaN
        raise LogprobsError(f"`{key}` must be an integer, got {value!r}.", key)
    number = int(value)
    if number < 0 and number != -1:
        raise LogprobsError(f"`{key}` must be a positive value or -1. (parameter={key}, value={number})", key)
    return number


def _within_maximum(top: int) -> int:
    asked = VOCAB_SIZE if top == -1 else top
    if asked > MAX_LOGPROBS:
        raise LogprobsError(f"Requested sample logprobs of {asked}, which is greater than max allowed: "
                            f"{MAX_LOGPROBS} (parameter=logprobs, value={asked})", "logprobs")
    return asked


def _boolean(value: Any) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("0", "off", "f", "false", "n", "no", "1", "on", "t", "true",
                                                    "y", "yes"):
        return value.lower() in ("1", "on", "t", "true", "y", "yes")
    raise LogprobsError(f"`logprobs` must be a boolean, got {value!r}.", "logprobs")


def parse_chat(body: dict[str, Any]) -> int | None:
    """How many alternatives a chat request asks for per position, or None when it asks for no logprobs."""
    wanted = _boolean(body.get("logprobs"))
    top = _integer(body, "top_logprobs")
    if top is not None and top != 0 and not wanted:
        raise LogprobsError("when using `top_logprobs`, `logprobs` must be set to true. (parameter=top_logprobs)",
                            "top_logprobs")
    return _within_maximum(top or 0) if wanted else None


def parse_completion(body: dict[str, Any]) -> int | None:
    """How many alternatives a completions request asks for per position, or None when it asks for none."""
    top = _integer(body, "logprobs")
    return None if top is None else _within_maximum(top)


def _unit(index: int, token: str, salt: str) -> float:
    return zlib.crc32(f"{salt}\x1f{index}\x1f{token}".encode()) / 2**32


def position(index: int, piece: str, top: int) -> Position:
    """The reported log-probabilities of the token at `index` (0 = the first generated one)."""
    token = EOS_TEXT if piece == EOS else piece
    chosen = -2.5 * _unit(index, token, "chosen") ** 3
    rest = 1.0 - math.exp(chosen)
    entries = [(token, chosen)]
    start = int(_unit(index, token, "alternatives") * len(ALTERNATIVES))
    candidates = (ALTERNATIVES[(start + k) % len(ALTERNATIVES)] for k in range(len(ALTERNATIVES)))
    share = 1.0
    for alternative in candidates:
        if len(entries) >= max(top, 1):
            break
        if alternative == token:
            continue
        share /= 2  # the rest of the mass halves from one alternative to the next: the sum stays below it
        p = rest * share
        below = min(math.log(p), entries[-1][1] - STEP) if p > 0 else FLOOR
        entries.append((alternative, max(below, FLOOR)))
    return Position(token, chosen, tuple(entries[:top]))


def positions(pieces: Sequence[str], first: int, top: int) -> list[Position]:
    return [position(first + i, piece, top) for i, piece in enumerate(pieces)]


def chat_logprobs(entries: Sequence[Position]) -> dict[str, Any]:
    """A chat choice's (or streamed delta's) `logprobs` object."""
    return {"content": [{"token": p.token, "logprob": p.logprob, "bytes": list(p.token.encode()),
                         "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in p.top]}
                        for p in entries]}


def completion_logprobs(entries: Sequence[Position], offset: int) -> tuple[dict[str, Any], int]:
    """A completion choice's (or streamed chunk's) `logprobs` object, its text offsets counted from `offset`
    (the characters of the choice's tokens before these); also the offset after them."""
    offsets = []
    for p in entries:
        offsets.append(offset)
        offset += len(p.token)
    body = {"text_offset": offsets, "token_logprobs": [p.logprob for p in entries],
            "tokens": [p.token for p in entries],
            "top_logprobs": [dict(p.top) if p.top else {p.token: p.logprob} for p in entries]}
    return body, offset
