"""A down upstream gives its share of the split to the others until it is healthy again (`availability`).

The router's arithmetic with a clock of its own (which requests move, where to, when the variant comes back,
the doubling wait of one that flaps, one without a health endpoint, two workers over one shared folder),
then the real exporter in front of two simulators: the candidate killed with SIGKILL mid-load (as an OOM
kill would), brought back on its port, and every request counted once on the side that served it. Last,
reroute that heals, with real exporters in front of loopback upstreams whose health and answers the test
sets: a slow answer is no outage, a 404 or no probe leaves the judging to requests, 413 / 400 are never
counted rerouted and rerouted requests never mirrored, `--workers 2` brings a variant back while worker 0
serves nothing, and a worker killed during an outage leaves no 0 in `specwatch_upstream_routable`.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import requests.adapters
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from specwatch.exporter.availability import Availability
from specwatch.exporter.config import ConfigError, load
from specwatch.exporter.health import UpstreamProbe
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.routing import Router
from specwatch.exporter.shared import SharedState
from specwatch.net import free_port
from tests.conftest import NGRAM_SIM_ARGS, Service
from tests.test_exporter import Factory, samples, value


def router_with_clock(split: list[str], seed: int = 1, sticky: str | None = None) -> tuple[Router, list[float]]:
    upstreams = ["baseline=http://b", "candidate=http://c", "other=http://o"]
    flags: dict[str, object] = {"upstream": upstreams, "split": split}
    if sticky:
        flags["sticky_header"] = sticky
    cfg = load(flags, None)
    metrics = ExporterMetrics(CollectorRegistry(), cfg)
    router = Router(cfg, metrics, random.Random(seed))
    now = [0.0]
    router.availability = Availability(cfg, metrics, clock=lambda: now[0])
    return router, now


def rerouted(router: Router, source: str, to: str) -> float:
    return router.metrics.rerouted.labels(source, to)._value.get()  # noqa: SLF001 - the test reads the counter


def test_only_the_down_variants_share_moves_and_it_moves_in_proportion_to_the_others():
    router, _ = router_with_clock(["candidate=30", "other=20"])  # baseline: the rest, 50
    before = [router.route({}) for _ in range(20000)]
    router, _ = router_with_clock(["candidate=30", "other=20"])  # the same random buckets again
    for _ in range(router.cfg.down_after_failures - 1):
        router.availability.failed("candidate")
    assert not router.availability.is_down("candidate")  # not yet: a failure or two is not an outage
    router.availability.reached("candidate")
    for _ in range(router.cfg.down_after_failures - 1):
        router.availability.failed("candidate")
    assert not router.availability.is_down("candidate")  # a success in between starts the count again
    router.availability.failed("candidate")
    assert router.availability.is_down("candidate")
    picks = [router.pick({}) for _ in range(20000)]
    after = [to for to, _ in picks]
    assert "candidate" not in after
    assert all(b == a for b, a in zip(before, after, strict=True) if b != "candidate")  # nobody else moves
    moved = [a for a, b in zip(after, before, strict=True) if b == "candidate"]
    assert len(moved) == before.count("candidate")
    assert [a for a, source in picks if source == "candidate"] == moved  # each says where it was taken from
    assert rerouted(router, "candidate", "baseline") == 0  # routing counts nothing: the tap counts what it forwards
    for to, source in picks:
        router.forwarded(to, source)
    assert rerouted(router, "candidate", "baseline") == moved.count("baseline")
    assert rerouted(router, "candidate", "other") == moved.count("other")
    assert 50 / 70 - 0.03 < moved.count("baseline") / len(moved) < 50 / 70 + 0.03  # in proportion: 50 to 20
    assert router.route({"x-specwatch-variant": "candidate"}) == "candidate"  # pinned: never rerouted
    assert router.metrics.upstream_routable.labels("candidate")._value.get() == 0  # noqa: SLF001


def test_it_comes_back_once_its_probe_has_answered_for_up_after_seconds_without_a_failure():
    router, now = router_with_clock(["candidate=50"])
    availability, up_after = router.availability, router.cfg.up_after_seconds
    availability.probed("candidate", False)
    assert availability.is_down("candidate") and "health probe failed" in availability.down["candidate"]
    availability.probed("candidate", True)
    now[0] = up_after - 1
    availability.probed("candidate", True)
    assert availability.is_down("candidate")
    availability.failed("candidate")  # a request still cannot reach it: the wait starts again
    now[0] = up_after + 1
    availability.probed("candidate", True)
    assert availability.is_down("candidate")
    now[0] = 2 * up_after + 1
    availability.probed("candidate", True)
    assert not availability.is_down("candidate")
    assert {router.route({}) for _ in range(400)} == {"baseline", "candidate"}


def test_sticky_keys_keep_their_route_while_it_is_down_and_return_to_it_after():
    router, now = router_with_clock(["candidate=50"], sticky="X-User")
    keys = [{"x-user": f"user-{i}"} for i in range(200)]
    home = [router.route(k) for k in keys]
    router.availability.probed("candidate", False)
    away = [router.route(k) for k in keys]
    assert away == [router.route(k) for k in keys] and set(away) == {"baseline"}
    router.availability.probed("candidate", True)
    now[0] = router.cfg.up_after_seconds
    router.availability.probed("candidate", True)
    assert [router.route(k) for k in keys] == home


def test_with_every_other_variant_down_or_shareless_the_pick_stands():
    router, _ = router_with_clock(["candidate=100"])  # baseline has no share: it still takes the traffic
    router.availability.probed("candidate", False)
    assert {router.route({}) for _ in range(50)} == {"baseline"}
    router.availability.probed("baseline", False)
    router.availability.probed("other", False)
    assert {router.route({}) for _ in range(50)} == {"candidate"}  # nobody to send it to: it fails as it is


def test_down_again_soon_after_coming_back_it_waits_twice_as_long_up_to_the_cap_and_a_stable_run_resets_it() -> None:
    router, now = router_with_clock(["candidate=50"])
    router.cfg = router.availability.cfg = replace(router.cfg, up_after_seconds=10, up_after_max_seconds=35,
                                                   flap_window_seconds=100)
    availability = router.availability

    def outage_then_return(wait: float) -> None:
        """It goes down now; its probe answers from now on: out for exactly `wait` seconds, then back."""
        start = now[0]
        for _ in range(router.cfg.down_after_failures):
            availability.failed("candidate")
        assert availability.is_down("candidate") and availability.outages["candidate"]["wait"] == wait
        availability.probed("candidate", True)
        now[0] = start + wait - 0.5
        availability.probed("candidate", True)
        assert availability.is_down("candidate"), wait
        now[0] = start + wait
        availability.probed("candidate", True)
        assert not availability.is_down("candidate"), wait

    for wait in (10, 20, 35, 35):  # each time down again 5 s after it came back: doubled, capped at 35
        outage_then_return(wait)
        now[0] += 5
    now[0] += 100  # up for the flap window: the next outage is a first one again
    outage_then_return(10)


def test_without_a_health_endpoint_it_is_judged_by_its_requests_and_back_after_its_wait():
    router, now = router_with_clock(["candidate=50"])
    availability, wait = router.availability, router.cfg.up_after_seconds
    for _ in range(5):  # the probe has nothing to say (404, or no probe): never taken out by it
        availability.probed("candidate", None)
    assert not availability.is_down("candidate")
    for _ in range(router.cfg.down_after_failures):
        availability.failed("candidate")
    assert availability.is_down("candidate")
    now[0] = wait - 1
    availability.probed("candidate", None)
    availability.failed("candidate")  # a pinned request still cannot reach it: its wait starts again
    now[0] = wait + 1
    availability.probed("candidate", None)
    assert availability.is_down("candidate")
    now[0] = 2 * wait - 1
    availability.probed("candidate", None)
    assert not availability.is_down("candidate")  # wait seconds since its last failure: on probation
    assert router.metrics.upstream_routable.labels("candidate")._value.get() == 1  # noqa: SLF001


def test_the_prober_brings_back_a_variant_another_worker_took_out_through_the_shared_files(tmp_path: Path) -> None:
    """Two workers' `Availability` over one real `SharedState` folder: worker 1 sees the failures, worker 0 (the
    prober) never routes a request, rereads the shared set each round and brings the variant back for both, and
    the doubled wait of a second outage is the same for both."""
    cfg = replace(load({"upstream": ["baseline=http://b", "candidate=http://c"], "split": ["candidate=50"]}, None),
                  workers=2)
    SharedState.create(tmp_path, cfg.split).close()
    now = [0.0]
    workers = [Router(cfg, ExporterMetrics(CollectorRegistry(), cfg), shared=SharedState(tmp_path))
               for _ in range(2)]
    for router in workers:
        router.availability = Availability(cfg, router.metrics, router.shared, clock=lambda: now[0])
    prober, other = workers
    probe = UpstreamProbe(cfg, prober.metrics, prober.availability, prober.refresh)

    def probe_round(up: bool) -> None:
        probe.refresh()
        for variant in cfg.upstreams:
            prober.availability.probed(variant, up)

    for _ in range(cfg.down_after_failures):
        other.availability.failed("candidate")
    assert other.availability.is_down("candidate") and not prober.availability.is_down("candidate")
    probe_round(True)
    assert prober.availability.is_down("candidate")  # read from the shared set, no request needed
    now[0] = cfg.up_after_seconds
    probe_round(True)
    assert not prober.availability.is_down("candidate")
    other.refresh()
    assert not other.availability.is_down("candidate")
    assert other.metrics.upstream_routable.labels("candidate")._value.get() == 1  # noqa: SLF001
    now[0] += 1
    for _ in range(cfg.down_after_failures):  # down again a second after it came back
        other.availability.failed("candidate")
    probe_round(True)
    assert prober.availability.outages["candidate"]["wait"] == 2 * cfg.up_after_seconds


@pytest.mark.parametrize("flag,yaml_line,expected", [
    (None, "", "/health"), ("/ready", "", "/ready"), (None, "health_path: /v1/models", "/v1/models"),
    ("off", "health_path: /ready", None), ("", "", None), (None, "health_path: off", None),
    (None, "health_path: ''", None), ("/ready", "health_path: off", "/ready"),
])
def test_the_health_path_comes_from_the_flag_or_the_yaml_and_off_turns_the_probe_off(
        tmp_path: Path, flag: str | None, yaml_line: str, expected: str | None) -> None:
    config = tmp_path / "e.yaml"
    config.write_text(f"upstreams:\n  baseline: http://127.0.0.1:1\n{yaml_line}\n")
    cfg = load({"health_path": flag}, config)
    assert cfg.health_path == expected
    assert (cfg.up_after_seconds, cfg.up_after_max_seconds, cfg.flap_window_seconds) == (10, 300, 300)
    registry = CollectorRegistry()
    ExporterMetrics(registry, cfg)  # no probe, no probe series: an alert on `specwatch_upstream_up == 0` stays quiet
    assert (registry.get_sample_value("specwatch_upstream_up", {"variant": "baseline"}) is None) == (expected is None)


@pytest.mark.parametrize("flag,yaml_lines,match", [
    ("health", "", "--health-path 'health': expected a path starting with /"),
    (None, "health_path: 5", "health_path: expected a path such as /health, or off, got 5"),
    (None, "up_after_seconds: 60\nup_after_max_seconds: 30", "up_after_max_seconds 30 is below up_after_seconds 60"),
    (None, "flap_window_seconds: 0", "flap_window_seconds: expected a positive number"),
])
def test_bad_health_paths_and_backoff_settings_are_refused_with_the_key(
        tmp_path: Path, flag: str | None, yaml_lines: str, match: str) -> None:
    config = tmp_path / "e.yaml"
    config.write_text(f"upstreams:\n  baseline: http://127.0.0.1:1\n{yaml_lines}\n")
    with pytest.raises(ConfigError, match=re.escape(match)):
        load({"health_path": flag}, config)


# -- the real exporter, two simulators, a SIGKILL ----------------------------------------------------------

def start_sim(port: int, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "sim", *NGRAM_SIM_ARGS, "--port", str(port)],
                            stdout=log.open("ab"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        assert proc.poll() is None, log.read_text()
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except requests.RequestException:
            pass
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


def ask(url: str, n: int, **headers: str) -> list[int]:
    body = {"model": "spec-demo", "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "def add(a, b):"}]}
    statuses = []
    for _ in range(n):
        r = requests.post(url + "/v1/chat/completions", json=body, timeout=60, headers={"X-Specwatch-Task": "code",
                                                                                       **headers})
        statuses.append(r.status_code)
    return statuses


def test_a_killed_candidate_loses_no_request_after_the_first_failures_and_gets_its_share_back(
        service_factory: Factory, sim_factory: Callable[[list[str]], Service], tmp_path: Path) -> None:
    baseline = sim_factory(NGRAM_SIM_ARGS)
    port = free_port()
    sim_log = tmp_path / "candidate.log"
    candidate = start_sim(port, sim_log)
    config = tmp_path / "exporter.yaml"
    config.write_text(f"upstreams:\n  baseline: {baseline.url}\n  candidate: http://127.0.0.1:{port}\n"
                      "split:\n  candidate: 50\nprobe_interval_seconds: 0.5\nup_after_seconds: 2\n")
    tap = service_factory("exporter", ["--config.file", str(config)])
    try:
        assert ask(tap.url, 20) == [200] * 20
        assert value(tap.url, "specwatch_requests_total", variant="candidate", outcome="ok") > 0
        candidate.kill()  # SIGKILL, as an OOM kill: no goodbye, the port refuses from now on
        candidate.wait()
        statuses = ask(tap.url, 40)
        failed = [i for i, s in enumerate(statuses) if s != 200]
        assert all(s in (200, 502) for s in statuses), statuses
        # at most the 3 in a row that mark it down (the split picks it for about half: within the first 25)
        assert len(failed) <= 3 and (not failed or max(failed) < 25), statuses
        assert statuses[25:] == [200] * 15
        moved = value(tap.url, "specwatch_rerouted_total", **{"from": "candidate", "to": "baseline"})
        assert moved >= 5, moved  # about half of the requests after it was known down
        assert value(tap.url, "specwatch_upstream_routable", variant="candidate") == 0
        assert ask(tap.url, 1, **{"X-Specwatch-Variant": "candidate"}) == [502]  # pinned: not rerouted
        errors = value(tap.url, "specwatch_requests_total", variant="candidate", outcome="upstream_error")
        assert errors == len(failed) + 1  # every failure counted once, on the side that failed it
        served = {v: value(tap.url, "specwatch_requests_total", variant=v, outcome="ok")
                  for v in ("baseline", "candidate")}
        assert served["baseline"] + served["candidate"] == 60 - len(failed)  # each answer counted once
        candidate = start_sim(port, sim_log)  # back on its port: in the split again once the probe holds
        deadline = time.monotonic() + 30
        while value(tap.url, "specwatch_upstream_routable", variant="candidate") != 1:
            assert time.monotonic() < deadline, tap.log.read_text()[-3000:]
            time.sleep(0.25)
        before = value(tap.url, "specwatch_requests_total", variant="candidate", outcome="ok")
        assert ask(tap.url, 30) == [200] * 30
        assert value(tap.url, "specwatch_requests_total", variant="candidate", outcome="ok") - before >= 5
        assert value(tap.url, "specwatch_rerouted_total", **{"from": "candidate", "to": "baseline"}) == moved
        log = tap.log.read_text()
        assert log.count("upstream candidate is down") == 1 and log.count("upstream candidate is healthy again") == 1
    finally:
        candidate.kill()
        candidate.wait()


@pytest.mark.parametrize("bad", ["down_after_failures: 0", "up_after_seconds: -1", "down_after_failures: 1.5"])
def test_bad_thresholds_are_refused_with_the_key(tmp_path: Path, bad: str) -> None:
    config = tmp_path / "e.yaml"
    config.write_text(f"upstreams:\n  baseline: http://127.0.0.1:1\n{bad}\n")
    done = subprocess.run([sys.executable, "-m", "specwatch.cli", "exporter", "--config.file", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and bad.split(":")[0] in done.stderr, done.stderr


def test_with_workers_the_down_set_is_shared_and_every_worker_routes_around(
        service_factory: Factory, sim_factory: Callable[[list[str]], Service], tmp_path: Path) -> None:
    """`--workers 3`: only worker 0 probes, yet a candidate that is down from the start is routed around by
    every worker (the down set lives in the shared state); each request on its own connection spreads them."""
    baseline = sim_factory(NGRAM_SIM_ARGS)
    config = tmp_path / "exporter.yaml"
    config.write_text(f"upstreams:\n  baseline: {baseline.url}\n  candidate: http://127.0.0.1:{free_port()}\n"
                      "split:\n  candidate: 50\nprobe_interval_seconds: 0.5\nworkers: 3\n")
    tap = service_factory("exporter", ["--config.file", str(config)])
    deadline = time.monotonic() + 20
    while value(tap.url, "specwatch_upstream_routable", variant="candidate") != 0:
        assert time.monotonic() < deadline, tap.log.read_text()[-2000:]
        time.sleep(0.2)
    workers = set()
    for _ in range(30):  # a fresh connection each: the kernel spreads them over the workers' sockets
        with requests.Session() as session:
            body = {"model": "spec-demo", "stream": True, "max_tokens": 4, "temperature": 0,
                    "messages": [{"role": "user", "content": "hi"}]}
            r = session.post(tap.url + "/v1/chat/completions", json=body, timeout=60,
                             headers={"X-Specwatch-Task": "chat", "Connection": "close"})
            assert r.status_code == 200, r.text[:300]
    for _ in range(20):
        workers.add(requests.get(tap.url + "/metrics", timeout=5, headers={"Connection": "close"})
                    .headers.get("X-Specwatch-Worker"))
    assert len(workers) >= 2, workers  # several workers answered: each saw the candidate down
    assert value(tap.url, "specwatch_rerouted_total", **{"from": "candidate", "to": "baseline"}) >= 5
    assert value(tap.url, "specwatch_requests_total", variant="candidate") == 0  # none was sent to it


# -- reroute that heals: real exporters in front of loopback upstreams whose health and answers the test sets --

class Upstream:
    """A loopback upstream (one thread per connection): `health` is what its health path answers, `post` how it
    answers a POST: `ok` (a small chat completion, or an event stream where asked), `reset` (the connection reset
    once the request is read: unreachable, as a crashed server), `slow` (an answer after `slow_seconds`)."""

    def __init__(self) -> None:
        self.health, self.post, self.slow_seconds = 200, "ok", 1.5
        self.gets: list[str] = []
        self.posts = 0
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                upstream.gets.append(self.path)
                self._answer(upstream.health, b"", "text/plain")

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                upstream.posts += 1
                if upstream.post == "reset":
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()
                    return
                if upstream.post == "slow":
                    time.sleep(upstream.slow_seconds)
                usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
                if body.get("stream"):
                    chunks = [{"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]},
                              {"choices": [], "usage": usage}]
                    raw = b"".join(b"data: %s\n\n" % json.dumps(c).encode() for c in chunks) + b"data: [DONE]\n\n"
                    self._answer(200, raw, "text/event-stream")
                else:
                    answer = {"object": "chat.completion", "usage": usage, "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}
                    self._answer(200, json.dumps(answer).encode(), "application/json")

            def _answer(self, status: int, body: bytes, content_type: str) -> None:
                with contextlib.suppress(OSError):  # the tap may have given up on a slow answer
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstreams() -> Iterator[Callable[[], Upstream]]:
    made: list[Upstream] = []

    def make() -> Upstream:
        made.append(Upstream())
        return made[-1]

    yield make
    for upstream in made:
        upstream.close()


def exporter(factory: Factory, tmp_path: Path, yaml: str, *flags: str) -> Service:
    config = tmp_path / "exporter.yaml"
    config.write_text(yaml)
    return factory("exporter", ["--config.file", str(config), *flags])


def post(url: str, *, stream: bool = False, session: requests.Session | None = None,
         headers: dict[str, str] | None = None) -> int:
    body = {"model": "m", "stream": stream, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    return (session or requests).post(url + "/v1/chat/completions", json=body, timeout=60,
                                      headers={"X-Specwatch-Task": "chat", **(headers or {})}).status_code


def wait_until(check: Callable[[], bool], seconds: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out: {what}\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_slow_answer_is_an_upstream_error_not_an_outage(service_factory: Factory, upstreams: Any, tmp_path: Path,
                                                          stream: bool) -> None:
    """Answers slower than `upstream_timeout_seconds`: each a 502 counted `upstream_error`, but the upstream
    answered its connection and its probe, so it stays in the split (a read timeout is not unreachable)."""
    slow, other = upstreams(), upstreams()
    slow.post = "slow"
    tap = exporter(service_factory, tmp_path, f"upstreams:\n  baseline: {slow.url}\n  candidate: {other.url}\n"
                   "upstream_timeout_seconds: 0.5\nprobe_interval_seconds: 0.2\n")
    n = 2 * tap_cfg_down_after()
    assert [post(tap.url, stream=stream) for _ in range(n)] == [502] * n
    assert value(tap.url, "specwatch_requests_total", variant="baseline", outcome="upstream_error") == n
    assert value(tap.url, "specwatch_upstream_routable", variant="baseline") == 1
    assert "is down" not in tap.log.read_text()
    slow.post = "ok"
    assert post(tap.url, stream=stream) == 200


def tap_cfg_down_after() -> int:
    return load({"upstream": ["baseline=http://x"]}, None).down_after_failures


@pytest.mark.parametrize("health", ["404", "off"])
def test_an_upstream_without_a_health_endpoint_is_judged_by_its_requests_and_backs_off_when_it_flaps(
        service_factory: Factory, upstreams: Any, tmp_path: Path, health: str) -> None:
    """No health endpoint (a 404 there, or `--health-path off`): the probe never takes it out; requests that cannot
    reach it do, and it comes back after `up_after_seconds` without failure; down again at once, it waits twice
    as long. With the probe off nothing is sent to the health path and `specwatch_upstream_up` is not exported."""
    baseline, candidate = upstreams(), upstreams()
    candidate.health = 404
    flags = ["--health-path", "off"] if health == "off" else []
    tap = exporter(service_factory, tmp_path, f"upstreams:\n  baseline: {baseline.url}\n  candidate: {candidate.url}\n"
                   "split:\n  candidate: 100\nprobe_interval_seconds: 0.1\nup_after_seconds: 1\n", *flags)
    if health == "off":
        time.sleep(1.0)  # ten rounds
        assert candidate.gets == [] and samples(tap.url, "specwatch_upstream_up") == {}
    else:
        wait_until(lambda: len(candidate.gets) >= 5, 10, "five probes", tap.log)
        assert set(candidate.gets) == {"/health"}
        assert value(tap.url, "specwatch_upstream_up", variant="candidate") == 1
        assert value(tap.url, "specwatch_upstream_probe_errors_total", variant="candidate") == 0
    assert value(tap.url, "specwatch_upstream_routable", variant="candidate") == 1  # the probe never took it out
    assert [post(tap.url) for _ in range(3)] == [200] * 3 and candidate.posts == 3
    candidate.post = "reset"
    down_after = tap_cfg_down_after()
    assert [post(tap.url) for _ in range(down_after + 3)] == [502] * down_after + [200] * 3  # then rerouted
    # the first of them went on the kept-alive connection, which the tap's client sends once more on a fresh one
    # (an upstream that closed an idle connection meanwhile looks the same); the others opened fresh ones
    assert candidate.posts == 3 + down_after + 1
    assert value(tap.url, "specwatch_upstream_routable", variant="candidate") == 0
    candidate.post = "ok"
    wait_until(lambda: value(tap.url, "specwatch_upstream_routable", variant="candidate") == 1, 10,
               "back after its wait", tap.log)
    assert post(tap.url) == 200 and candidate.posts == 5 + down_after  # its requests judge it again
    candidate.post = "reset"  # flaps: down again at once
    assert [post(tap.url) for _ in range(down_after)] == [502] * down_after
    went_down = time.monotonic()
    candidate.post = "ok"
    wait_until(lambda: value(tap.url, "specwatch_upstream_routable", variant="candidate") == 1, 10,
               "back after its doubled wait", tap.log)
    assert time.monotonic() - went_down >= 2 * 1 - 0.1  # twice up_after_seconds
    log = tap.log.read_text()
    assert "until it is healthy for 2 s; down again" in log and "the wait doubles" in log
    assert log.count("upstream candidate is healthy again (no health endpoint") == 2


def test_rerouted_counts_forwarded_requests_only_and_the_mirror_copies_only_the_default_routes_own(
        service_factory: Factory, upstreams: Any, tmp_path: Path) -> None:
    """The candidate is down and has every pick: each request goes to baseline, rerouted. A 413 or a 400 the tap
    answers itself was never forwarded: not counted. The mirror copies baseline's own (pinned) requests, never
    the rerouted ones."""
    baseline, shadow = upstreams(), upstreams()
    tap = exporter(service_factory, tmp_path, f"upstreams:\n  baseline: {baseline.url}\n"
                   f"  candidate: http://127.0.0.1:{free_port()}\n  shadow: {shadow.url}\n"
                   "split:\n  candidate: 100\nmirror: shadow\nmax_body_bytes: 8192\nprobe_interval_seconds: 0.2\n")
    wait_until(lambda: value(tap.url, "specwatch_upstream_routable", variant="candidate") == 0, 10,
               "the candidate known down", tap.log)
    url = tap.url + "/v1/chat/completions"
    json_type = {"Content-Type": "application/json"}
    assert {requests.post(url, data=b"x" * 10000, headers=json_type, timeout=30).status_code for _ in range(4)} == {413}
    deep = b"[" * 3000 + b"]" * 3000  # deeper than the tap parses: its own 400
    assert {requests.post(url, data=deep, headers=json_type, timeout=30).status_code for _ in range(4)} == {400}
    assert value(tap.url, "specwatch_rerouted_total") == 0
    assert [post(tap.url) for _ in range(6)] == [200] * 6
    assert value(tap.url, "specwatch_rerouted_total", **{"from": "candidate", "to": "baseline"}) == 6
    assert [post(tap.url, headers={"X-Specwatch-Variant": "baseline"}) for _ in range(3)] == [200] * 3
    wait_until(lambda: value(tap.url, "specwatch_requests_total", variant="shadow") >= 3, 10, "the mirror copies",
               tap.log)
    time.sleep(0.5)  # any late copy of a rerouted request would land by now
    assert shadow.posts == 3 and value(tap.url, "specwatch_requests_total", variant="shadow") == 3
    assert baseline.posts == 9


# -- with workers: recovery whichever worker gets traffic, and a dead worker's gauge --------------------------

def run_folder(tap: Service) -> Path:
    found = re.search(r"run folder (\S+)\)", tap.log.read_text())
    assert found, tap.log.read_text()
    return Path(found.group(1))


def session_on_worker(url: str, index: str) -> requests.Session:
    """A keep-alive session whose one connection landed on worker `index` (new connections spread by hash)."""
    for _ in range(200):
        session = requests.Session()
        session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=1))
        if session.get(url + "/healthz", timeout=5).headers["X-Specwatch-Worker"] == index:
            return session
        session.close()
    raise AssertionError(f"no connection landed on worker {index}")


def routable_per_worker(run_dir: Path, variant: str) -> dict[str, float]:
    """Each live worker's own `specwatch_upstream_routable{variant}`, from its gauge file."""
    out = {}
    for path in sorted((run_dir / "metrics").glob("gauge_livemin_*.db")):
        for family in MultiProcessCollector.merge([str(path)]):
            for s in family.samples:
                if s.name == "specwatch_upstream_routable" and s.labels["variant"] == variant:
                    out[path.stem.rsplit("_", 1)[1]] = s.value
    return out


def test_with_workers_a_variant_taken_out_by_requests_comes_back_while_worker_0_serves_nothing(
        service_factory: Factory, upstreams: Any, tmp_path: Path) -> None:
    """`--workers 2`, every request over one connection to worker 1: its failures take the candidate out while
    its /health answers 200. Worker 0, the prober, never routes a request, yet reads the shared down set each
    round and brings it back; worker 1 sends it traffic again."""
    baseline, candidate = upstreams(), upstreams()
    candidate.post = "reset"
    tap = exporter(service_factory, tmp_path, f"upstreams:\n  baseline: {baseline.url}\n  candidate: {candidate.url}\n"
                   "split:\n  candidate: 100\nprobe_interval_seconds: 0.2\nup_after_seconds: 1\nworkers: 2\n")
    down_after = tap_cfg_down_after()
    with session_on_worker(tap.url, "1") as session:
        assert [post(tap.url, session=session) for _ in range(down_after + 2)] == [502] * down_after + [200] * 2
        assert session.get(tap.url + "/healthz", timeout=5).headers["X-Specwatch-Worker"] == "1"  # the same one
        assert value(tap.url, "specwatch_upstream_routable", variant="candidate") == 0
        candidate.post = "ok"  # nobody sends anything now: the probe alone must see it
        wait_until(lambda: value(tap.url, "specwatch_upstream_routable", variant="candidate") == 1, 15,
                   "the prober brings the candidate back", tap.log)
        assert [post(tap.url, session=session) for _ in range(3)] == [200] * 3
        assert candidate.posts == down_after + 3  # worker 1 routes to it again
        assert session.get(tap.url + "/healthz", timeout=5).headers["X-Specwatch-Worker"] == "1"
    served = {}
    for path in (run_folder(tap) / "metrics").glob("counter_*.db"):
        served[path.stem] = sum(s.value for f in MultiProcessCollector.merge([str(path)]) for s in f.samples
                                if s.name == "specwatch_requests_total")
    assert sorted(served.values()) == [0, down_after + 5], served  # one worker served every request
    log = tap.log.read_text()
    assert log.count("upstream candidate is down") == 1 and log.count("upstream candidate is healthy again") == 1


def test_a_worker_killed_while_a_variant_was_down_leaves_no_0_behind(
        service_factory: Factory, upstreams: Any, tmp_path: Path) -> None:
    """`--workers 3`, the candidate's probe failing: every worker's own gauge says 0. One worker is SIGKILLed (its
    file would say 0 forever) and replaced; once the candidate is healthy the merged gauge is 1 again: the
    supervisor marked the dead pid dead, and `livemin` reads live workers only."""
    baseline, candidate = upstreams(), upstreams()
    candidate.health = 503
    tap = exporter(service_factory, tmp_path, f"upstreams:\n  baseline: {baseline.url}\n  candidate: {candidate.url}\n"
                   "split:\n  candidate: 50\nprobe_interval_seconds: 0.2\nup_after_seconds: 1\nworkers: 3\n")
    run_dir = run_folder(tap)
    pids = [int(p) for p in Path(f"/proc/{tap.proc.pid}/task/{tap.proc.pid}/children").read_text().split()]
    assert len(pids) == 3
    wait_until(lambda: routable_per_worker(run_dir, "candidate") == {str(p): 0.0 for p in pids}, 10,
               "every worker routes around the candidate (each rereads the shared set)", tap.log)
    victim = pids[-1]
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: victim not in [int(p) for p in Path(f"/proc/{tap.proc.pid}/task/{tap.proc.pid}/children")
                                      .read_text().split()] and "starting a replacement" in tap.log.read_text(),
               10, "a replacement worker", tap.log)
    assert not (run_dir / "metrics" / f"gauge_livemin_{victim}.db").exists()  # mark_process_dead removed it
    candidate.health = 200
    wait_until(lambda: value(tap.url, "specwatch_upstream_routable", variant="candidate") == 1, 15,
               "the merged gauge says routable", tap.log)
    assert set(routable_per_worker(run_dir, "candidate").values()) == {1.0}
