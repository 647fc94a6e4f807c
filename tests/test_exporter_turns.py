"""A stream's end waits its turn (`turns.py`), and its upstream connection is back in the pool by then.

The exporter's app runs in this process on uvloop, in front of an upstream that replays a stream vLLM
0.32.0 wrote (the golden capture, event by event, a few ms apart). The tap's `Turns` is replaced by a
gate the test opens: while a stream's end waits there, the client must not have its last bytes yet.
Relayed in Python, the end waits once, after the upstream's answer is complete, with its connection
already idle in the pool (a request arriving meanwhile does not open a new one). Over the relay thread,
each hand-back at the end (the finish chunk, the usage chunk) is fed at its turn (with an event log: an end
the thread may write must be counted before it leaves). Then the gate opens and the client gets every byte
the upstream sent, counted. Where the thread may write the end (one process, no event log, the client's own
include_usage), the client has every byte, and its keep-alive connection takes the next request, while the
count waits at its gate (`Tap.counts_after`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
from aiohttp import web

from specwatch.exporter import fastrelay
from specwatch.exporter.config import load
from specwatch.exporter.main import Exporter
from specwatch.exporter.turns import Turns
from specwatch.net import free_port

CAPTURE = Path(__file__).parent / "fixtures" / "vllm-0.32.0" / "baseline"


class Gate(Turns):
    """Turns that record what the tap had done when a stream's end came to wait, and hold it there."""

    def __init__(self, exporter: Exporter, received: bytearray) -> None:
        super().__init__()
        self.exporter, self.received = exporter, received
        self.seen: list[dict[str, Any]] = []
        self.open = asyncio.Event()

    async def wait(self) -> None:
        self.seen.append({"idle_upstream_connections": self.exporter.tap.pool.idle_count(),
                          "client_has_done": b"data: [DONE]" in self.received})
        await self.open.wait()


@pytest.mark.parametrize("relay", ["python", "thread", "thread-writes-the-end"])
def test_a_streams_end_waits_its_turn_before_its_last_bytes(relay: str, tmp_path: Path) -> None:
    if relay != "python" and not fastrelay.AVAILABLE:
        pytest.skip("the compiled relay is not built here")
    body = (CAPTURE / "chat_stream_usage.response").read_bytes()
    events = [e + b"\n\n" for e in body.split(b"\n\n") if e.strip()]
    request = json.loads((CAPTURE / "chat_stream_usage.request.json").read_text())["body"]

    async def upstream(req: web.Request) -> web.StreamResponse:
        await req.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(req)
        for event in events:
            await resp.write(event)
            await asyncio.sleep(0.002)
        await resp.write_eof()
        return resp

    async def scenario() -> tuple[list[dict[str, Any]], bytes, bytes, str]:
        up_app = web.Application()
        up_app.router.add_post("/v1/chat/completions", upstream)
        up_runner = web.AppRunner(up_app, access_log=None)
        await up_runner.setup()
        up_port, port = free_port(), free_port()
        await web.TCPSite(up_runner, "127.0.0.1", up_port).start()
        flags: dict[str, Any] = {"upstream": [f"baseline=http://127.0.0.1:{up_port}"], "listen": f"127.0.0.1:{port}",
                                 "no_fast_relay": relay == "python"}
        if relay == "thread":
            flags["event_log"] = str(tmp_path / "events.jsonl")
        exporter = Exporter(load(flags, None))
        received = bytearray()
        gate = Gate(exporter, received)
        if relay == "thread-writes-the-end":
            exporter.tap.counts_after = gate
        else:
            exporter.tap.turns = gate
        runner = web.AppRunner(exporter.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session:

                async def client() -> None:
                    async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=request) as resp:
                        assert resp.status == 200
                        async for piece in resp.content.iter_any():
                            received.extend(piece)

                reading = asyncio.create_task(client())
                for _ in range(500):  # the stream's end reaches the gate (at most 5 s)
                    if gate.seen or reading.done():
                        break
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)  # held there: nothing more reaches the client meanwhile
                held = bytes(received)
                if relay == "thread-writes-the-end":  # the client has it all, the count still waits
                    await asyncio.wait_for(reading, 10)
                    # on the stream's own keep-alive connection: its handler returned before the count (a next
                    # request is read at once); /metrics waits 1 s for the count, then answers without it
                    async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                        uncounted = await resp.text()
                    assert "specwatch_fast_relay_ends_total 1.0" in uncounted.splitlines()
                    counted = [m for m in uncounted.splitlines()
                               if m.startswith("specwatch_requests_total{") and not m.endswith(" 0.0")]
                    assert not counted, (counted, gate.seen)  # not before its turn
                gate.open.set()
                await asyncio.wait_for(reading, 10)
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    metrics = await resp.text()
        finally:
            await runner.cleanup()
            await up_runner.cleanup()
        return gate.seen, held, bytes(received), metrics

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        seen, held, full, metrics = runner.run(scenario())
    line = 'specwatch_requests_total{outcome="ok",task="code",variant="baseline"} 1.0'
    assert line in metrics.splitlines(), [m for m in metrics.splitlines() if m.startswith("specwatch_requests_total")]
    assert full == b"".join(events)  # every byte, as the upstream sent it
    if relay == "thread-writes-the-end":  # one turn, for the count, once the client had [DONE] and the end and
        assert seen == [{"idle_upstream_connections": 1, "client_has_done": True}], seen  # the connection is back
        assert held == full
        return
    assert seen and not any(wait["client_has_done"] for wait in seen), seen
    if relay == "python":  # one turn, after the upstream connection went back to the pool
        assert seen == [{"idle_upstream_connections": 1, "client_has_done": False}], seen
    else:  # the thread relayed the content and handed the end back: fed at its turn
        relayed = [m for m in metrics.splitlines() if m.startswith("specwatch_fast_relay_chunks_total ")]
        assert relayed and float(relayed[0].split()[1]) > 0, relayed
    assert b'"content":"def"' in held and b"data: [DONE]" not in held  # the content first; the end waited
