"""Which task a request belongs to: the `X-Specwatch-Task` header, else the configured rules.

The result is always one of the configured tasks or `other`, so label values stay bounded
whatever clients send.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specwatch.exporter.config import OTHER, ExporterConfig

TASK_HEADER = "x-specwatch-task"


def first_user_text(body: Mapping[str, Any] | None) -> str:
    """The first user message of a chat request (text parts joined), or the prompt of a completion."""
    if not body:
        return ""
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict) and m.get("role") == "user":
                content = m.get("content")
                if isinstance(content, list):
                    return "".join(p.get("text", "") for p in content if isinstance(p, dict))
                return content if isinstance(content, str) else ""
        return ""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[0] if prompt else ""
    return prompt if isinstance(prompt, str) else ""


def classify(cfg: ExporterConfig, path: str, headers: Mapping[str, str], body: Mapping[str, Any] | None) -> str:
    named = headers.get(TASK_HEADER)
    if named is not None:
        return named if named in cfg.tasks else OTHER
    text: str | None = None
    for rule in cfg.rules:
        if rule.path is not None and rule.path != path:
            continue
        if rule.model is not None and (body or {}).get("model") != rule.model:
            continue
        if rule.header is not None:
            value = headers.get(rule.header[0])
            if value is None or not rule.header[1].search(value):
                continue
        if rule.message_regex is not None:
            text = first_user_text(body) if text is None else text
            if not rule.message_regex.search(text):
                continue
        return rule.task
    return OTHER
