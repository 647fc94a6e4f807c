"""Send the article's acceptance pass: non-streaming chat requests, several in flight, bodies kept.

The request follows PLAYBOOK §4: temperature 0, top_p 1, seed 42, n 1, thinking disabled
through `chat_template_kwargs`. Responses are returned whole (raw JSON), in input order.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import requests

from specwatch.vllm_cpu.server import SERVED_MODEL_NAME
from specwatch.workloads import Row


class RequestFailed(RuntimeError):
    """A request got no usable answer; the message names the URL, status and body."""


@dataclass(frozen=True)
class Result:
    row: Row
    body: dict[str, Any]
    seconds: float


def chat_body(row: Row, max_tokens: int, model: str = SERVED_MODEL_NAME, **extra: Any) -> dict[str, Any]:
    return {
        "model": model, "messages": row.messages(), "temperature": 0, "top_p": 1, "seed": 42, "n": 1,
        "max_tokens": max_tokens, "chat_template_kwargs": {"enable_thinking": False}, **extra,
    }


def post_json(session: requests.Session, url: str, body: dict[str, Any], timeout: float = 600) -> dict[str, Any]:
    response = session.post(url, json=body, timeout=timeout)
    if response.status_code != 200:
        raise RequestFailed(f"POST {url}: HTTP {response.status_code}: {response.text[:500]}")
    try:
        parsed = response.json()
    except ValueError:
        raise RequestFailed(f"POST {url}: response is not JSON: {response.text[:200]!r}") from None
    if not isinstance(parsed, dict):
        raise RequestFailed(f"POST {url}: expected a JSON object, got {type(parsed).__name__}")
    return parsed


def run_chat(base_url: str, rows: Sequence[Row], *, max_tokens: int = 256, concurrency: int = 4,
             model: str = SERVED_MODEL_NAME, extra: Mapping[str, Any] | None = None) -> list[Result]:
    """Send every row (at most `concurrency` in flight); results in the order of `rows`. `extra`: more body
    fields (the acceptance pass asks for the top logprobs)."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=max(concurrency, 10)))

    def one(row: Row) -> Result:
        start = time.perf_counter()
        body = post_json(session, url, chat_body(row, max_tokens, model, **(extra or {})))
        return Result(row, body, time.perf_counter() - start)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, rows))


def fetch_metrics(base_url: str) -> str:
    response = requests.get(base_url.rstrip("/") + "/metrics", timeout=30)
    response.raise_for_status()
    return response.text
