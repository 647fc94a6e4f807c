"""Request fields vLLM 0.32.0 answers that the simulator cannot: refused with a 501 that names the field.

The simulator has no tokenizer ids, no logits and no grammar engine. A request that asks for what needs
them (the prompt echoed back, token ids, tool calls, a JSON schema, a minimum length) would otherwise get
an ordinary answer of another shape than the real server's, and the client would not know. Fields that
only steer sampling (`top_p`, `top_k`, penalties, `logit_bias`) change no shape and stay accepted, as
does a field set to its default (`"echo": false`, `"min_tokens": 0`, `"tools": []`).

The field names and defaults are those of vLLM 0.32.0's request models
(`vllm/entrypoints/openai/{chat_completion,completion}/protocol.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _set(value: Any) -> bool:
    return value not in (None, False, [], {})  # False == 0: `"min_tokens": 0` is not set either


def _structured(value: Any) -> bool:
    return value is not None and not (isinstance(value, dict) and value.get("type") == "text")


WHAT_IT_NEEDS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "echo": ("the prompt's text echoed back", _set),
    "prompt_logprobs": ("the prompt's log-probabilities", lambda v: v is not None),
    "logprob_token_ids": ("log-probabilities of chosen token ids", _set),
    "return_token_ids": ("token ids", _set),
    "return_tokens_as_token_ids": ("token ids", _set),
    "return_token_offsets": ("token offsets", _set),
    "include_stop_str_in_output": ("the stop string kept in the text", _set),
    "min_tokens": ("a minimum length", _set),
    "stop_token_ids": ("token ids", _set),
    "allowed_token_ids": ("token ids", _set),
    "bad_words": ("a tokenizer", _set),
    "use_beam_search": ("beam search", _set),
    "tools": ("tool calls", _set),
    "response_format": ("structured output", _structured),
    "structured_outputs": ("structured output", lambda v: v is not None),
    "continue_final_message": ("a chat template", _set),
}


CHAT_ONLY = frozenset({"tools", "continue_final_message"})  # not fields of a completion: vLLM ignores them there


def unsimulated(body: dict[str, Any], chat: bool) -> tuple[str, str] | None:
    """The first field of `body` the simulator cannot answer as vLLM would, and what it needs; None if none."""
    for field, (needs, is_set) in WHAT_IT_NEEDS.items():
        if field in body and is_set(body[field]) and (chat or field not in CHAT_ONLY):
            return field, needs
    return None
