"""Checks that hold for any capture folder of vLLM 0.32.0 (committed fixtures and fresh captures)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from specwatch.acceptance import spec_field, total
from specwatch.reconcile import reconcile
from specwatch.snapshot import server_figures
from specwatch.vllm_metrics import DRAFTS, PER_POS, samples


def sse_events(raw: bytes) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except the final `[DONE]`."""
    events: list[Any] = []
    for block in raw.split(b"\n\n"):
        if not block.strip():
            continue
        assert block.startswith(b"data: "), block[:80]
        payload = block[len(b"data: "):]
        events.append(payload.decode() if payload == b"[DONE]" else json.loads(payload))
    return events


def final_body(folder: Path, name: str) -> dict[str, Any]:
    """The object that carries usage/metrics: the JSON body, or the stream's usage chunk."""
    raw = (folder / f"{name}.response").read_bytes()
    request = json.loads((folder / f"{name}.request.json").read_text())
    if not (request["body"] or {}).get("stream"):
        return dict(json.loads(raw))
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    with_usage = [e for e in events[:-1] if e.get("usage")]
    return dict(with_usage[-1]) if with_usage else {}


def _logprobs_objects(folder: Path, name: str) -> list[dict[str, Any]]:
    """Every `logprobs` object of an exchange's response, in order (one per streamed chunk)."""
    raw = (folder / f"{name}.response").read_bytes()
    request = json.loads((folder / f"{name}.request.json").read_text())
    events = sse_events(raw)[:-1] if request["body"].get("stream") else [json.loads(raw)]
    choices = [c for e in events for c in e["choices"]]
    assert choices and all("logprobs" in c for c in choices), name
    return [c["logprobs"] for c in choices if c["logprobs"] is not None]


def check_logprobs(folder: Path, name: str) -> None:
    """One position per generated token (held-back steps included), greedy: the chosen token is the top one,
    the alternatives in descending order, their probabilities summing to at most 1."""
    request = json.loads((folder / f"{name}.request.json").read_text())["body"]
    chat = "messages" in request
    top = request["top_logprobs"] if chat else request["logprobs"]
    positions: list[tuple[str, float, list[tuple[str, float]]]] = []
    offset = 0
    for obj in _logprobs_objects(folder, name):
        if chat:
            for e in obj["content"]:
                assert list(e) == ["token", "logprob", "bytes", "top_logprobs"]
                assert e["bytes"] == list(e["token"].encode()), e
                positions.append((e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]]))
        else:
            assert list(obj) == ["text_offset", "token_logprobs", "tokens", "top_logprobs"]
            for at, lp, token, alternatives in zip(obj["text_offset"], obj["token_logprobs"], obj["tokens"],
                                                   obj["top_logprobs"], strict=True):
                assert at == offset, (name, at, offset)
                offset += len(token)
                assert alternatives[token] == lp
                positions.append((token, lp, sorted(alternatives.items(), key=lambda kv: -kv[1])))
    assert len(positions) == final_body(folder, name)["usage"]["completion_tokens"], name
    for token, lp, alternatives in positions:
        assert len(alternatives) == top, (name, token, alternatives)
        values = [v for _, v in alternatives]
        assert values == sorted(values, reverse=True) and values[0] == lp <= 0, (name, token, alternatives)
        assert sum(math.exp(v) for v in values) <= 1 + 1e-6, (name, token, alternatives)


def check_capture(folder: Path, speculative: bool, k: int = 4) -> None:
    manifest = json.loads((folder / "manifest.json").read_text())
    status = {e["name"]: e["status"] for e in manifest["exchanges"]}
    for error in ("error_stream_options_without_stream", "error_top_logprobs_without_logprobs",
                  "error_logprobs_above_the_maximum"):
        assert status.pop(error) == 400, error
    assert set(status.values()) == {200}
    ctype = {e["name"]: e["content_type"] for e in manifest["exchanges"]}
    assert ctype["chat_stream_usage"].startswith("text/event-stream")
    assert ctype["chat_nonstream"] == "application/json"

    for name in ("chat_logprobs_nonstream", "chat_logprobs_stop_string_stream_usage",
                 "completion_logprobs_nonstream", "completion_logprobs_stream_usage"):
        check_logprobs(folder, name)
    above = json.loads((folder / "error_logprobs_above_the_maximum.response").read_bytes())["error"]
    assert above["param"] == "logprobs" and "greater than max allowed: 20" in above["message"]

    reconcilable = [e["name"] for e in manifest["exchanges"] if e["phase"] == "reconcilable"]
    bodies = [final_body(folder, n) for n in reconcilable]
    before = (folder / "metrics_before.txt").read_text()
    mid = (folder / "metrics_mid.txt").read_text()
    summed = total(bodies)
    if not speculative:
        found = samples(mid)  # no draft counted, no position child: the server does not speculate
        assert summed.missing == len(bodies) and sum(v for (n, _), v in found.items() if n == DRAFTS) == 0
        assert not any(n == PER_POS for n, _ in found)
        return
    assert summed.missing == 0, "every reconcilable request carries metrics.speculative_decoding"
    assert len(summed.histogram) == k + 1
    children = sorted(int(dict(labels)["position"]) for name, labels in samples(before) if name == PER_POS)
    assert children == list(range(k)), "position children exist before any request"
    checks = reconcile(summed, server_figures(before, mid))
    assert [c for c in checks if not c.equal] == [] and summed.steps > 0

    # where the field is null or absent
    assert spec_field(final_body(folder, "chat_n2_nonstream")) is None
    assert spec_field(final_body(folder, "completion_multi_prompt")) is None
    stop = final_body(folder, "chat_stop_string")
    assert stop["choices"][0]["finish_reason"] == "stop" and spec_field(stop) is None
    assert final_body(folder, "chat_stream_no_usage") == {}
    error = json.loads((folder / "error_stream_options_without_stream.response").read_bytes())
    assert "error" in error or "message" in error


def shape(value: Any) -> Any:
    """The JSON structure without the values: key order, types, null versus absent. A completion's
    `top_logprobs` maps tokens to log-probabilities: its keys are values, so it is shaped as a map."""
    if isinstance(value, dict):
        return [(k, _token_maps(v) if k == "top_logprobs" else shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        distinct: list[Any] = []
        for item in value:
            if shape(item) not in distinct:
                distinct.append(shape(item))
        return ["list", distinct]
    if value is None:
        return "null"
    return type(value).__name__


def _token_maps(value: Any) -> Any:
    if isinstance(value, list) and value and all(isinstance(m, dict) and "token" not in m for m in value):
        return ["list", [["map", sorted({shape(v) for m in value for v in m.values()})]]]
    return shape(value)


def sse_shapes(raw: bytes) -> list[Any]:
    """The distinct chunk shapes of a stream, in order of first appearance, and the terminator."""
    out: list[Any] = []
    for event in sse_events(raw):
        s = event if event == "[DONE]" else shape(event)
        if s not in out:
            out.append(s)
    return out


def exchange_shapes(folder: Path, name: str) -> Any:
    raw = (folder / f"{name}.response").read_bytes()
    request = json.loads((folder / f"{name}.request.json").read_text())
    if (request["body"] or {}).get("stream"):
        return sse_shapes(raw)
    return shape(json.loads(raw)) if raw else "empty"


def vllm_families(text: str) -> dict[str, tuple[str, set[str], list[float] | None]]:
    """Each `vllm:` family of an exposition: type, label names (without `le`) and bucket bounds."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:") or fam.name.endswith("_created"):
            continue
        labels = {k for s in fam.samples for k in s.labels if k != "le"}
        buckets = sorted({float(s.labels["le"]) for s in fam.samples if "le" in s.labels} - {float("inf")})
        out[fam.name] = (fam.type, labels, buckets or None)
    return out
