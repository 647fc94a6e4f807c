"""The simulator's tokenizer: text split into word-like pieces (a leading space belongs to the word).

There is no real vocabulary: a token is a string piece, so proposers and verification
compare pieces, and joining pieces gives back the text exactly.
"""

from __future__ import annotations

import re

_PIECE = re.compile(r" ?[A-Za-z_]+| ?[0-9]| ?[^\sA-Za-z0-9_]|\n|[ \t]+")


def tokenize(text: str) -> list[str]:
    pieces = _PIECE.findall(text)
    assert "".join(pieces) == text, "tokenizer must be lossless"
    return pieces

