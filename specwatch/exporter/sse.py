"""Server-sent events, incrementally: bytes in, complete events (with their exact bytes) out.

`plain_text()` is the per-chunk fast path: it recognises, by a byte pattern, an ordinary streamed
content chunk (one choice, no usage, no finish reason) and returns its text without a full JSON
parse. It only answers where the pattern fixes what a full parse would say; anything else (the
usage chunk, a finish chunk, tool calls, several choices, unusual spacing) returns None and is
parsed in full by the caller.
"""

from __future__ import annotations

import json
import re
from typing import Any


class Event:
    """One event: `raw` exactly as received (terminator included), `data` its joined `data:` payload
    (None for a comment-only event)."""

    __slots__ = ("raw", "data")

    def __init__(self, raw: bytes, data: bytes | None) -> None:
        self.raw = raw
        self.data = data

    def json(self) -> Any:
        """The payload as JSON; None for `[DONE]`, comments or anything unparsable."""
        if self.data is None or self.data == b"[DONE]":
            return None
        try:
            return json.loads(self.data)
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            return None


class SseSplitter:
    """Splits a byte stream at blank lines (LF LF or CRLF CRLF), keeping every byte."""

    def __init__(self, max_event_bytes: int = 8 * 1024 * 1024) -> None:
        self._buffer = b""
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[Event]:
        buf = self._buffer + chunk if self._buffer else chunk
        crlf = b"\r" in buf  # the CRLF CRLF search only where a CR can be
        events: list[Event] = []
        start = 0
        while True:
            lf = buf.find(b"\n\n", start)
            cut = lf + 2 if lf >= 0 else -1
            if crlf:
                cr = buf.find(b"\r\n\r\n", start)
                if cr >= 0 and (cut < 0 or cr + 4 < cut):
                    cut = cr + 4
            if cut < 0:
                break
            raw = buf[start:cut] if start or cut != len(buf) else buf
            events.append(Event(raw, _data(raw)))
            start = cut
        rest = buf[start:] if start else buf
        if len(rest) > self.max_event_bytes:  # not SSE as we know it: pass it on whole
            events.append(Event(rest, None))
            rest = b""
        self._buffer = rest
        return events

    def empty(self) -> bool:
        """Nothing is held back: the next event starts with the next byte fed."""
        return not self._buffer

    def flush(self) -> list[Event]:
        if not self._buffer:
            return []
        raw, self._buffer = self._buffer, b""
        return [Event(raw, _data(raw))]


def _data(raw: bytes) -> bytes | None:
    if raw.startswith(b"data: ") and raw.find(b"\n") == len(raw) - 2:  # one line and LF LF: the usual case
        return raw[6:-2]
    lines = [line[5:].removeprefix(b" ") for line in raw.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


# -- the fast path -------------------------------------------------------------------------------
# Compact JSON only (vLLM's pydantic serialisation). Other strings: printable ASCII without escapes,
# so the bytes are valid UTF-8 and equal the parsed value. The text: any JSON string (strict: no raw
# control characters). Keys that decide anything (choices, usage; delta, text, finish_reason) may not
# appear elsewhere, so a duplicate key cannot override what the pattern saw.
_KEY = rb'[A-Za-z_][A-Za-z0-9_]*'
_ASCII = rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*"'
_INT = rb'-?(?:0|[1-9][0-9]*)'
_SCALAR = rb'(?:' + _ASCII + rb'|' + _INT + rb'|null|true|false)'
_TEXT_BODY = rb'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*'
_TEXT = rb'"(' + _TEXT_BODY + rb')"'
_TOP = rb'"(?!choices"|usage")' + _KEY + rb'":' + _SCALAR
_CHOICE_KEY = rb'"(?!delta"|text"|finish_reason")' + _KEY + rb'"'
_PLAIN = re.compile(
    rb'\{(?:' + _TOP + rb',)*'
    rb'"choices":\[\{(?:' + _CHOICE_KEY + rb':(?:' + _INT + rb'|null),)*'
    rb'(?:"delta":\{(?:"role":"assistant",)?"content":' + _TEXT + rb'(?:,"(?!content")' + _KEY + rb'":null)*\}'
    rb'|"text":' + _TEXT + rb')'
    rb'(?:,(?:' + _CHOICE_KEY + rb'|"finish_reason"):null)*\}\]'
    rb'(?:,' + _TOP + rb')*\}')


def plain_text(data: bytes) -> bytes | None:
    """The UTF-8 text of an ordinary content chunk (b"" for one without text), or None: parse it in full.

    Where this returns bytes, `json.loads(data)` is an object without "usage" whose "choices" is a list
    of one object with no truthy "finish_reason" and whose delta content (chat) or text (completion)
    encodes to exactly these bytes.
    """
    match = _PLAIN.fullmatch(data)
    if match is None:
        return None
    chat, completion = match.groups()
    return _decoded(completion if chat is None else chat)


def _decoded(text: bytes) -> bytes | None:
    """The UTF-8 bytes of a JSON string's body (as the pattern's text group matched it)."""
    if b"\\" in text:
        try:
            return str(json.loads(b'"' + text + b'"')).encode("utf-8", "surrogatepass")
        except ValueError:  # not UTF-8 besides the escapes: the full parse fails too
            return None
    return text if _utf8(text) else None


def _utf8(text: bytes) -> bool:
    """What json.loads accepts as the bytes of a string without escapes; else the full parse decides."""
    if text.isascii():
        return True
    try:
        text.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


_STRING_BODY = re.compile(_TEXT_BODY)


class PlainReader:
    """`plain_text` for one stream, at a third of its cost per chunk.

    vLLM writes every content chunk of a stream with the same bytes around its text (id, created, model,
    index, the trailing nulls). Once the full pattern has matched a chunk, the bytes before and after its
    text are kept; a later chunk that starts and ends with exactly those bytes, and whose text between is a
    JSON string's body (the pattern's own text group), is the same match with another text: the
    pattern has no back-references and none of its look-aheads reaches into the text. Anything else goes
    to the full pattern, which learns the new surroundings (the role chunk, a change of shape).

    `last_plain` says whether the last chunk read was plain: only then is the stream between chunks of
    the learned shape (a stream whose content chunks carry logprobs has a plain role chunk, then none).
    """

    __slots__ = ("prefix", "suffix", "least", "last_plain")

    def __init__(self) -> None:
        self.prefix: bytes | None = None
        self.suffix = b""
        self.least = 0
        self.last_plain = False

    def text(self, data: bytes) -> bytes | None:
        prefix = self.prefix
        if prefix is not None and len(data) >= self.least and data.startswith(prefix) and data.endswith(self.suffix):
            text = data[len(prefix):len(data) - len(self.suffix)]
            if _STRING_BODY.fullmatch(text) is not None:
                decoded = _decoded(text)
                self.last_plain = decoded is not None
                return decoded
        self.last_plain = False
        if b'"finish_reason":"' in data or b'"usage":{' in data:  # the end of a stream: never plain, parsed in full
            return None
        match = _PLAIN.fullmatch(data)
        if match is None:
            return None
        group = 1 if match.start(1) >= 0 else 2
        self.prefix, self.suffix = data[:match.start(group)], data[match.end(group):]
        self.least = len(self.prefix) + len(self.suffix)
        decoded = _decoded(match[group])
        self.last_plain = decoded is not None
        return decoded
