"""The simulator's HTTP API: vLLM 0.32.0's endpoints and JSON / SSE shapes, served by aiohttp.

`/health`, `/v1/models`, `/version`, `/metrics`, `/v1/chat/completions`, `/v1/completions`.
Response bodies keep vLLM's key order, its null-versus-absent rules (non-streaming bodies
keep nulls, streamed chunks drop them), one SSE chunk per engine step per choice, the usage
chunk only with `include_usage` or `--enable-force-include-usage`, and the per-request
`metrics.speculative_decoding` only for n = 1, a single prompt and an engine-side finish,
and a chunk for every engine step that produced tokens, even when a possible stop string holds
their text back. Log-probabilities, when asked for, come from `logprobs.py`.
Bad requests get vLLM's error object and status; nothing a client sends crashes the server.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from specwatch.simulator import logprobs
from specwatch.simulator.engine import EOS, Engine, EngineRequest, StepOutput
from specwatch.simulator.target import generate
from specwatch.simulator.tokens import tokenize
from specwatch.simulator.unsimulated import unsimulated

VERSION = "0.32.0"
CHAT_TEMPLATE = "<|im_start|>{role}\n{content}<|im_end|>\n"
GENERATION_PROMPT = "<|im_start|>assistant\n"
GREEDY_BELOW = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it is greedy sampling


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.status}}
        return _json(body, self.status)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _json(obj: Any, status: int = 200) -> web.Response:
    """A compact JSON body with vLLM's exact `Content-Type: application/json` (no charset)."""
    return web.Response(body=_dumps(obj).encode(), status=status, headers={"Content-Type": "application/json"})


def _drop_none(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_drop_none(v) for v in obj]
    return obj


@dataclass(frozen=True)
class ApiConfig:
    served_model_names: tuple[str, ...]
    model_path: str
    max_model_len: int
    per_request_spec_metrics: str
    enable_per_request_metrics: bool
    force_include_usage: bool
    seed: int | None
    fingerprint: str


@dataclass
class _Parsed:
    prompts: list[tuple[list[str], str]]  # (prompt pieces, the text the target answers)
    n: int
    max_tokens: int
    stream: bool
    include_usage: bool
    stop: tuple[str, ...]
    temperature: float
    seed: int | None
    ignore_eos: bool
    logprobs: int | None  # alternatives per position; None: no logprobs asked for


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise ApiError(f"`{key}` must be a number in [{lo}, {hi}], got {value!r}.", param=key)
    return float(value)


def _int(body: dict[str, Any], key: str, default: int | None, lo: int) -> int | None:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ApiError(f"`{key}` must be an integer >= {lo}, got {value!r}.", param=key)
    return value


class SimApi:
    def __init__(self, cfg: ApiConfig, engine: Engine, registry: CollectorRegistry) -> None:
        self.cfg, self.engine, self.registry = cfg, engine, registry

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/v1/completions", self.completions)
        return app

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def models(self, request: web.Request) -> web.Response:
        now = int(time.time())
        cards = [{"id": name, "object": "model", "created": now, "owned_by": "vllm", "root": self.cfg.model_path,
                  "parent": None, "max_model_len": self.cfg.max_model_len,
                  "permission": [{"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission",
                                  "created": now, "allow_create_engine": False, "allow_sampling": True,
                                  "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                  "allow_fine_tuning": False, "organization": "*", "group": None,
                                  "is_blocking": False}]}
                 for name in self.cfg.served_model_names]
        return _json({"object": "list", "data": cards})

    # -- parsing ---------------------------------------------------------------------------
    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(f"Request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise ApiError("Request body must be a JSON object.")
        model = body.get("model")
        if model is not None and model not in self.cfg.served_model_names:
            raise ApiError(f"The model `{model}` does not exist. Valid aliases: "
                           f"{', '.join(self.cfg.served_model_names)}.", 404, "NotFoundError", "model")
        return body

    def _common(self, body: dict[str, Any], prompts: list[tuple[list[str], str]], chat: bool) -> _Parsed:
        stream = bool(body.get("stream", False))
        options = body.get("stream_options")
        if options is not None and not stream:
            raise ApiError("Stream options can only be defined when `stream=True`. (parameter=stream_options)",
                           param="stream_options")
        if options is not None and not isinstance(options, dict):
            raise ApiError("`stream_options` must be an object.", param="stream_options")
        n = _int(body, "n", 1, 1) or 1
        longest = max(len(p) for p, _ in prompts)
        room = self.cfg.max_model_len - longest
        if room <= 0:
            raise ApiError(f"This model's maximum context length is {self.cfg.max_model_len} tokens. However, your "
                           f"request has {longest} input tokens. Please reduce the length of the input messages.",
                           param="messages")
        key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = _int(body, key, room, 1) or room
        if max_tokens > room:
            raise ApiError(f"'{key}' is too large: {max_tokens}. This model's maximum context length is "
                           f"{self.cfg.max_model_len} tokens and your request has {longest} input tokens "
                           f"({max_tokens} > {self.cfg.max_model_len} - {longest}).", param=key)
        stop = body.get("stop") or ()
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) and s for s in stop):
            raise ApiError("`stop` must be a string or a list of non-empty strings.", param="stop")
        include_usage = bool((options or {}).get("include_usage")) or self.cfg.force_include_usage
        try:
            top = logprobs.parse_chat(body) if chat else logprobs.parse_completion(body)
        except logprobs.LogprobsError as err:
            raise ApiError(err.message, param=err.param) from None
        temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
        if temperature < GREEDY_BELOW and n > 1:  # vLLM's SamplingParams._verify_greedy_sampling
            raise ApiError(f"n must be 1 when using greedy sampling, got {n}.")
        missing = unsimulated(body, chat)
        if missing is not None:  # after the checks vLLM makes, so a malformed request still gets its 400
            field, needs = missing
            shown = _dumps(body[field])
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise ApiError(f"specwatch sim does not simulate `{field}` (set to {shown}): it needs "
                           f"{needs}, which the simulator does not model. vLLM {VERSION} answers it; leave the field "
                           f"out, or send this request to a real server.", 501, "NotImplementedError", field)
        return _Parsed(prompts, n, max_tokens, stream, include_usage, tuple(stop), temperature,
                       _int(body, "seed", self.cfg.seed, -2**63), bool(body.get("ignore_eos", False)), top)

    # -- endpoints -------------------------------------------------------------------------
    async def chat(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
                raise ApiError("`messages` must be a non-empty list of {role, content} objects.", param="messages")
            text = "".join(CHAT_TEMPLATE.format(role=m["role"], content=_content(m)) for m in messages)
            users = [_content(m) for m in messages if m["role"] == "user"]
            parsed = self._common(body, [(tokenize(text + GENERATION_PROMPT), users[-1] if users else text)],
                                  chat=True)
        except ApiError as err:
            return err.response()
        return await self._run(request, parsed, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            prompt = body.get("prompt")
            texts = [prompt] if isinstance(prompt, str) else prompt
            if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
                raise ApiError("`prompt` must be a string or a non-empty list of strings.", param="prompt")
            parsed = self._common(body, [(tokenize(t), t) for t in texts], chat=False)
        except ApiError as err:
            return err.response()
        return await self._run(request, parsed, chat=False)

    async def _run(self, request: web.Request, p: _Parsed, chat: bool) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id") or secrets.token_hex(8)
        response_id = ("chatcmpl-" if chat else "cmpl-") + rid
        seqs = []
        for prompt_index, (pieces, answer_to) in enumerate(p.prompts):
            for i in range(p.n):
                seed = None if p.seed is None else p.seed + i
                gen = generate(answer_to, p.max_tokens, temperature=p.temperature, seed=seed)
                target = gen.tokens if p.ignore_eos else (*gen.tokens[:gen.natural_end], EOS)
                seqs.append(EngineRequest(f"{rid}-{prompt_index}-{i}", pieces, target, p.max_tokens, p.stop, p.n))
        for seq in seqs:
            self.engine.add(seq)
        single = len(seqs) == 1
        try:
            if p.stream:
                return await self._stream(request, p, chat, response_id, seqs, single)
            outputs = await asyncio.gather(*(_collect(s) for s in seqs))
        except (asyncio.CancelledError, ConnectionResetError):
            for s in seqs:
                self.engine.abort(s)
            raise
        created = int(time.time())
        usage = self._usage(p, seqs, streamed=False)
        metrics = self._metrics(seqs[0], streamed=False) if single else None
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": text, "refusal": None,
                                                "annotations": None, "audio": None, "function_call": None,
                                                "reasoning": None},
                        "logprobs": self._logprobs(p, s.generated, chat), "finish_reason": s.finish_reason,
                        "stop_reason": last.stop_reason, "token_ids": None, "routed_experts": None}
                       for i, (s, (text, last)) in enumerate(zip(seqs, outputs, strict=True))]
            body = {"id": response_id, "object": "chat.completion", "created": created,
                    "model": self.cfg.served_model_names[0], "choices": choices, "service_tier": None,
                    "system_fingerprint": self.cfg.fingerprint, "usage": usage, "prompt_logprobs": None,
                    "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
                    "ec_transfer_params": None, "metrics": metrics}
        else:
            choices = [{"index": i, "text": text, "logprobs": self._logprobs(p, s.generated, chat),
                        "finish_reason": s.finish_reason,
                        "stop_reason": last.stop_reason, "token_ids": None, "prompt_logprobs": None,
                        "prompt_token_ids": None, "routed_experts": None}
                       for i, (s, (text, last)) in enumerate(zip(seqs, outputs, strict=True))]
            body = {"id": response_id, "object": "text_completion", "created": created,
                    "model": self.cfg.served_model_names[0], "choices": choices, "service_tier": None,
                    "system_fingerprint": self.cfg.fingerprint, "usage": usage, "kv_transfer_params": None,
                    "ec_transfer_params": None, "metrics": metrics}
        return _json(body)

    @staticmethod
    def _logprobs(p: _Parsed, pieces: Sequence[str], chat: bool) -> dict[str, Any] | None:
        """A whole choice's `logprobs` object (non-streamed), or None when the request asked for none."""
        if p.logprobs is None:
            return None
        entries = logprobs.positions(pieces, 0, p.logprobs)
        return logprobs.chat_logprobs(entries) if chat else logprobs.completion_logprobs(entries, 0)[0]

    def _usage(self, p: _Parsed, seqs: list[EngineRequest], streamed: bool) -> dict[str, Any]:
        prompt = sum(len(pieces) for pieces, _ in p.prompts)
        completion = sum(len(s.generated) for s in seqs)
        usage: dict[str, Any] = {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                 "completion_tokens": completion}
        if not streamed:
            usage.update(prompt_tokens_details=None, completion_tokens_details=None)
        return usage

    def _metrics(self, seq: EngineRequest, streamed: bool) -> dict[str, Any] | None:
        out: dict[str, Any] = {}
        if self.cfg.enable_per_request_metrics:
            out.update(seq.timing_metrics())
        spec = None
        if self.cfg.per_request_spec_metrics != "none" and seq.spec_stats is not None and seq.spec_visible:
            spec = seq.spec_stats.to_dict(self.cfg.per_request_spec_metrics == "detailed")
        if not out and spec is None:
            return None
        if not self.cfg.enable_per_request_metrics:
            out = dict.fromkeys(("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
                                 "tokens_per_second"))
        out["speculative_decoding"] = spec
        return _drop_none(out) if streamed else out

    async def _stream(self, request: web.Request, p: _Parsed, chat: bool, response_id: str,
                      seqs: list[EngineRequest], single: bool) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        created = int(time.time())
        model = self.cfg.served_model_names[0]
        obj = "chat.completion.chunk" if chat else "text_completion"

        async def send(payload: dict[str, Any]) -> None:
            await resp.write(b"data: " + _dumps(payload).encode() + b"\n\n")

        def head() -> dict[str, Any]:
            return {"id": response_id, "object": obj, "created": created, "model": model}

        roles_sent = not chat
        sent_positions = [0] * len(seqs)  # per choice: the tokens whose logprobs went out, their characters
        sent_chars = [0] * len(seqs)
        async for i, out in _merge(seqs):
            if not roles_sent:  # vLLM sends the role chunks with the first engine output, not before prefill
                roles_sent = True
                for index in range(len(seqs)):
                    role = {**head(), "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                   "logprobs": None, "finish_reason": None}],
                            "prompt_token_ids": None, "prompt_text": None}
                    if self.cfg.force_include_usage:
                        role["usage"] = self._usage(p, seqs, streamed=True)
                    await send(role)
            if not out.pieces and out.finish_reason is None:
                continue  # no token in this step: nothing to send (a step whose text is held back still sends)
            lp: dict[str, Any] | None = None
            if p.logprobs is not None:
                entries = logprobs.positions(out.pieces, sent_positions[i], p.logprobs)
                sent_positions[i] += len(entries)
                if chat:
                    lp = logprobs.chat_logprobs(entries)
                else:
                    lp, sent_chars[i] = logprobs.completion_logprobs(entries, sent_chars[i])
            choice: dict[str, Any]
            if chat:
                choice = {"index": i, "delta": {"content": out.text}, "logprobs": lp,
                          "finish_reason": out.finish_reason}
            else:
                choice = {"index": i, "text": out.text, "logprobs": lp, "finish_reason": out.finish_reason}
            if out.finish_reason is not None or not chat:
                choice["stop_reason"] = out.stop_reason
            if not chat:
                choice["prompt_token_ids"] = None
            choice["token_ids"] = None
            chunk = {**head(), "choices": [choice]}
            if self.cfg.force_include_usage:  # continuous usage stats: running totals on every chunk
                chunk["usage"] = self._usage(p, seqs, streamed=True)
            if out.finish_reason is not None and not p.include_usage and all(s.finished for s in seqs):
                chunk["system_fingerprint"] = self.cfg.fingerprint
            await send(chunk)
        if p.include_usage:
            final: dict[str, Any] = {**head(), "choices": [], "usage": self._usage(p, seqs, streamed=True),
                                     "system_fingerprint": self.cfg.fingerprint}
            metrics = self._metrics(seqs[0], streamed=True) if single else None
            if metrics:
                final["metrics"] = metrics
            await send(final)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


async def _collect(seq: EngineRequest) -> tuple[str, StepOutput]:
    parts: list[str] = []
    while True:
        out = await seq.outputs.get()
        parts.append(out.text)
        if out.finish_reason is not None:
            return "".join(parts), out


async def _merge(seqs: list[EngineRequest]) -> AsyncIterator[tuple[int, StepOutput]]:
    """Outputs of several sequences in the order they arrive, tagged with the choice index."""
    if len(seqs) == 1:  # the common case, without a future per step
        while True:
            out = await seqs[0].outputs.get()
            yield 0, out
            if out.finish_reason is not None:
                return
    pending = {asyncio.ensure_future(s.outputs.get()): i for i, s in enumerate(seqs)}
    while pending:
        done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for fut in sorted(done, key=lambda f: pending[f]):
            i = pending.pop(fut)
            out = fut.result()
            yield i, out
            if out.finish_reason is None:
                pending[asyncio.ensure_future(seqs[i].outputs.get())] = i
