"""A down upstream gives its share of the split to the others until it is healthy again (`availability`).

The router's arithmetic with a clock of its own (which requests move, where to, what is counted, when the
variant comes back), then the real exporter in front of two simulators: the candidate killed with SIGKILL
mid-load (as an OOM kill would), brought back on its port, and every request counted once on the side that
served it.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry

from specwatch.exporter.availability import Availability
from specwatch.exporter.config import load
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.exporter.routing import Router
from specwatch.net import free_port
from tests.conftest import NGRAM_SIM_ARGS, Service
from tests.test_exporter import Factory, value


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
    after = [router.route({}) for _ in range(20000)]
    assert "candidate" not in after
    assert all(b == a for b, a in zip(before, after, strict=True) if b != "candidate")  # nobody else moves
    moved = [a for a, b in zip(after, before, strict=True) if b == "candidate"]
    assert len(moved) == before.count("candidate")
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
