"""Deterministic stand-in for vLLM's OpenAI chat endpoint, paced for proxy benchmarks.

Streaming `/v1/chat/completions` follows vLLM 0.32.0's wire format
(shared/reference/vllm-0.32-wire-format.md, section 3.6): a role chunk (written together with
the first content chunk, as vLLM does), N content chunks on a fixed schedule, a finish chunk,
the usage chunk (`choices: []`, `usage`, `system_fingerprint`, `metrics.speculative_decoding`)
when `stream_options.include_usage` is true, then `data: [DONE]`.

Timing: the first content chunk is written `--ttft-ms` after the request arrived, content
chunk i at ttft + i * interval on an absolute schedule (no drift), the finish/usage/[DONE]
events right after the last content chunk. Content depends only on the chunk index, so every
request yields the same text. Also serves non-streaming chat, `GET /v1/models` and
`GET /health` (200, empty body).

Usage: python stub_upstream.py --port 18001 [--chunks 64] [--interval-ms 10] [--ttft-ms 20]
                                 [--processes N]

--processes N (default 1: one process, as before): N forked worker processes, each with its own
event loop and its own listening socket on the same port (SO_REUSEPORT: the kernel spreads the
connections over them). The sockets are bound before the fork, so every worker is in the group
from the start. The parent only supervises: SIGTERM/SIGINT to it stops the workers; when one
worker dies the others are stopped too. The workers share the CPU set they inherit (taskset on the
parent). The bytes served are the same as with one process; generated request ids (no
X-Request-Id) stay unique across workers.

Origin: ../shared/perf/stub_upstream.py (the issue 18 reference harness), brought into the repo (one variable
renamed for mypy).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import socket
import sys
import time

from aiohttp import web

WORDS = (
    " The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", ".",
    " Speculative", " decoding", " drafts", " tokens", " and", " verifies", " them", ",",
    " one", " step", " at", " a", " time", ";", " def", " f", "(x", "):", " return", " x",
    " *", " 2",
)
SPEC_K = 3
ACCEPT_PATTERN = (2, 1, 3, 0, 3, 2, 1, 3)  # accepted drafts per verify step, cycled
FINGERPRINT = "vllm-0.32.0-5747ab00"


def spec_metrics(completion_tokens: int) -> dict:
    """A consistent per-request SpeculativeDecodingMetrics: 1 + steps + accepted = tokens."""
    hist = [0] * (SPEC_K + 1)
    steps = accepted = 0
    remaining = completion_tokens - 1  # the prefill token
    for a in itertools.cycle(ACCEPT_PATTERN):
        if remaining <= 0:
            break
        a = min(a, remaining - 1)  # each step yields its accepted drafts plus the bonus token
        hist[a] += 1
        steps += 1
        accepted += a
        remaining -= a + 1
    drafted = steps * SPEC_K
    return {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": hist,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": SPEC_K,
    }


def dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"))


class Stub:
    def __init__(self, chunks: int, interval_s: float, ttft_s: float, model: str,
                 worker: int = 0, workers: int = 1) -> None:
        self.chunks = chunks
        self.interval_s = interval_s
        self.ttft_s = ttft_s
        self.model = model
        self.counter = itertools.count(1 + worker, workers)  # 1, 2, 3, ... with one process

    def _n_tokens(self, body: dict) -> int:
        for key in ("max_completion_tokens", "max_tokens"):
            value = body.get(key)
            if isinstance(value, int) and value > 0:
                return min(value, self.chunks)
        return self.chunks

    def _request_id(self, request: web.Request) -> str:
        rid = request.headers.get("X-Request-Id")
        return "chatcmpl-" + (rid if rid else f"{next(self.counter):016x}")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
            "root": self.model, "parent": None, "max_model_len": 4096,
        }
        return web.json_response({"object": "list", "data": [card]}, dumps=dumps)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        t_arrival = loop.time()
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as exc:
            err = {"error": {"message": f"invalid JSON body: {exc}", "type": "BadRequestError",
                             "code": 400}}
            return web.json_response(err, status=400, dumps=dumps)
        n = self._n_tokens(body)
        rid = self._request_id(request)
        created = int(time.time())
        model = body.get("model") or self.model
        prompt_tokens = 8 * max(1, len(body.get("messages") or []))
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n,
                 "completion_tokens": n}
        metrics = {"speculative_decoding": spec_metrics(n)}
        text_of = [WORDS[i % len(WORDS)] for i in range(n)]

        if not body.get("stream"):
            await asyncio.sleep(max(0.0, t_arrival + self.ttft_s + (n - 1) * self.interval_s
                                    - loop.time()))
            answer = {
                "id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant",
                                                     "content": "".join(text_of)},
                             "logprobs": None, "finish_reason": "length", "stop_reason": None}],
                "system_fingerprint": FINGERPRINT, "usage": usage,
                "metrics": {"time_to_first_token_ms": None, "generation_time_ms": None,
                            "queue_time_ms": None, "mean_itl_ms": None,
                            "tokens_per_second": None, **metrics},
            }
            return web.json_response(answer, dumps=dumps)

        head = (f'data: {{"id":{dumps(rid)},"object":"chat.completion.chunk",'
                f'"created":{created},"model":{dumps(model)},"choices":')
        role = (head + '[{"index":0,"delta":{"role":"assistant","content":""},'
                '"logprobs":null,"finish_reason":null}],"prompt_token_ids":null}\n\n')
        content_tail = '},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
        finish = (head + '[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length",'
                  '"stop_reason":null,"token_ids":null}]}\n\n')
        tail = finish
        if (body.get("stream_options") or {}).get("include_usage"):
            tail += (head + f'[],"usage":{dumps(usage)},"system_fingerprint":"{FINGERPRINT}",'
                     f'"metrics":{dumps(metrics)}}}\n\n')
        tail += "data: [DONE]\n\n"

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        t_first = t_arrival + self.ttft_s
        for i in range(n):
            delay = t_first + i * self.interval_s - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            event = head + '[{"index":0,"delta":{"content":' + dumps(text_of[i]) + content_tail
            await resp.write(((role if i == 0 else "") + event).encode())
        await resp.write(tail.encode())
        await resp.write_eof()
        return resp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=18001)
    p.add_argument("--chunks", type=int, default=64, help="content chunks per stream")
    p.add_argument("--interval-ms", type=float, default=10.0, help="gap between content chunks")
    p.add_argument("--ttft-ms", type=float, default=20.0, help="delay before the first chunk")
    p.add_argument("--model", default="stub-model", help="name listed by /v1/models")
    p.add_argument("--no-uvloop", action="store_true", help="use the default asyncio loop")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="worker processes sharing the port through SO_REUSEPORT (default 1)")
    p.add_argument("--backlog", type=int, default=1024,
                   help="listen backlog of each worker's socket with --processes > 1")
    args = p.parse_args(argv)
    if args.chunks < 1 or args.interval_ms < 0 or args.ttft_ms < 0:
        p.error("--chunks must be >= 1, --interval-ms and --ttft-ms >= 0")
    if args.processes < 1:
        p.error("--processes must be >= 1")
    return args


def make_app(args: argparse.Namespace, worker: int = 0, workers: int = 1) -> web.Application:
    if not args.no_uvloop:
        try:
            import uvloop
            uvloop.install()
        except ImportError:
            pass
    stub = Stub(args.chunks, args.interval_ms / 1000, args.ttft_ms / 1000, args.model,
                worker, workers)
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.add_routes([
        web.get("/health", stub.health),
        web.get("/v1/models", stub.models),
        web.post("/v1/chat/completions", stub.chat),
    ])
    return app


def reuseport_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (best effort)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def serve_processes(args: argparse.Namespace) -> int:
    """Fork args.processes workers, each serving its own SO_REUSEPORT socket; supervise them."""
    n = args.processes
    socks = [reuseport_socket(args.host, args.port) for _ in range(n)]
    for sock in socks:
        sock.listen(args.backlog)
    sys.stdout.flush()
    sys.stderr.flush()
    pids: list[int] = []
    for i in range(n):
        pid = os.fork()
        if pid == 0:  # worker i
            code = 0
            try:
                die_with_parent()
                for j, other in enumerate(socks):
                    if j != i:
                        other.close()
                web.run_app(make_app(args, i, n), sock=socks[i], backlog=args.backlog,
                            print=None, access_log=None)
            except BaseException as exc:  # noqa: BLE001 - report and leave with a code
                if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    print(f"stub worker {i}: {exc!r}", file=sys.stderr, flush=True)
                    code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    for sock in socks:  # each worker holds its own; a dead worker's socket leaves the group
        sock.close()
    print(f"stub: {n} worker processes {pids} on {args.host}:{args.port} (SO_REUSEPORT)",
          file=sys.stderr, flush=True)

    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    rc = 0
    alive = set(pids)
    while alive:
        pid, status = os.wait()
        alive.discard(pid)
        code = os.waitstatus_to_exitcode(status)
        if not stopping:
            print(f"stub: worker PID {pid} exited ({code}); stopping the others", file=sys.stderr,
                  flush=True)
            rc = 1
            stop(signal.SIGTERM, None)
    return rc


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.processes > 1:
        sys.exit(serve_processes(args))
    web.run_app(make_app(args), host=args.host, port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
