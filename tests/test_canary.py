"""`specwatch canary` end to end: simulators (real processes), the exporter with its event log, Locust, Prometheus.

The truth is set by the data (which servers, which drafter, which traffic and concurrency);
every case reads the one default policy, `specwatch/data/canary-policy.yaml`. One case runs on the
real vLLM 0.32.0 CPU server. The policy cases at the end start nothing: every policy this project has shipped
(`tests/fixtures/canary-policies/`, taken from git history and named after its commit) still loads.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from specwatch import cli
from specwatch.canary import policy as policy_mod
from specwatch.canary.cli import EXIT_FAIL, EXIT_INSUFFICIENT, EXIT_PASS
from specwatch.canary.samples import METRICS
from specwatch.net import free_port
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.vllm_cpu.server import VllmServer
from specwatch.vllm_metrics import samples
from specwatch.workloads import Row, article_rows, write_article_workloads
from tests.conftest import NGRAM_SIM_ARGS, Service, requests_by_variant
from tests.hog import Hog

SERVERS = pytest.mark.servers  # a simulator pair behind the exporter, Prometheus for some (not the policy cases)

TOKEN_ENV = "SPECWATCH_TEST_CANARY_TOKEN"


def sim_args(scale: float, *extra: str) -> list[str]:
    return ["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096", "--max-num-seqs", "256",
            "--seed", "42", "--sim-time-scale", str(scale), *extra]


def ngram_args(scale: float) -> list[str]:
    args = list(NGRAM_SIM_ARGS)
    args[args.index("--sim-time-scale") + 1] = str(scale)
    return args


# A draft model the target rarely agrees with on chat (k = 5): every step pays five draft passes
# and a six-token verify for about 1.4 tokens.
WEAK_DRAFTER = ["--per-request-spec-decode-metrics", "summary", "--speculative-config",
                json.dumps({"method": "draft_model", "model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5}),
                "--sim-draft-acceptance", "0.35,0.3,0.3,0.3,0.3"]


@dataclass
class Stack:
    baseline: Service
    candidate: Service
    tap: Service
    events: Path
    token: str
    folder: Path
    services: list[Service]

    def stop(self) -> None:
        for s in self.services:
            s.stop()


def start_stack(folder: Path, baseline_args: list[str], candidate_args: list[str], split: int = 50) -> Stack:
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    services: list[Service] = []
    try:
        baseline = Service("sim", baseline_args, folder / "baseline.log")
        services.append(baseline)
        candidate = Service("sim", candidate_args, folder / "candidate.log")
        services.append(candidate)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(TOKEN_ENV, token)  # the exporter reads it at start
            tap = Service("exporter", ["--upstream", f"baseline={baseline.url}", "--upstream",
                                       f"candidate={candidate.url}", "--split", f"candidate={split}",
                                       "--event-log", str(folder / "events.jsonl"), "--admin-token-env", TOKEN_ENV],
                          folder / "exporter.log", "/healthz")
        services.append(tap)
    except BaseException:
        for s in services:
            s.stop()
        raise
    return Stack(baseline, candidate, tap, folder / "events.jsonl", token, folder, services)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("workloads")
    write_article_workloads(out, lang="en")
    return out


def load(stack: Stack, data: Path, task: str, concurrency: int, requests_: int, max_tokens: int = 64) -> None:
    """Real Locust through the exporter: `requests_` measured requests of one task, fixed work per request."""
    out = stack.folder / f"load-{task}-{concurrency}"
    code = cli.main(["load", "--target", stack.tap.url, "--task", f"{task}={data / f'{task}.jsonl'}",
                     "--ignore-eos", "--max-tokens", str(max_tokens), "--concurrency", str(concurrency),
                     "--requests", str(requests_), "--warmup", "0", "--max-seconds", "240", "--out", str(out)])
    assert code == cli.EXIT_OK, (out / "locust.log").read_text()[-2000:] if (out / "locust.log").exists() else code


def canary(out: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["canary", "--window", "10m", "--out", str(out), *args])
    doc = json.loads((out / "canary.json").read_text()) if (out / "canary.json").exists() else {}
    return code, doc


def metric(doc: dict[str, Any], task: str, name: str) -> dict[str, Any]:
    t = next(t for t in doc["tasks"] if t["task"] == task)
    found: dict[str, Any] = next(m for m in t["metrics"] if m["metric"] == name)
    return found


def chat(url: str, prompt: str, max_tokens: int = 16, variant: str | None = None, task: str = "chat") -> None:
    headers = {"X-Specwatch-Task": task, **({"X-Specwatch-Variant": variant} if variant else {})}
    body = {"model": "spec-demo", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    with requests.post(url + "/v1/chat/completions", json=body, headers=headers, stream=True, timeout=120) as r:
        assert r.status_code == 200, r.text
        for _ in r.iter_lines():
            pass


# -- the cases -----------------------------------------------------------------------------------------------
@SERVERS
def test_ngram_candidate_on_code_at_concurrency_1_passes(data: Path, tmp_path: Path) -> None:
    """Prompt lookup on code edits (the output copies the prompt) at concurrency 1: much faster per token."""
    # time scale 0.3: the modelled step (about 2 ms) stays well above the simulator's own Python time per step,
    # which grows on a busy machine and would otherwise wash the difference out
    stack = start_stack(tmp_path / "stack", sim_args(0.3), ngram_args(0.3))
    try:
        load(stack, data, "code", concurrency=1, requests_=80)
        code, doc = canary(tmp_path / "report", "--event-log", str(stack.events), "--task", "code")
    finally:
        stack.stop()
    assert code == EXIT_PASS, (tmp_path / "report" / "canary.md").read_text()
    assert doc["verdict"] == "pass"
    tpot = metric(doc, "code", "tpot")
    assert tpot["state"] == "low" and not tpot["failed"]  # faster, significantly and beyond the tolerance
    assert tpot["effect"]["high"] < 0.9
    assert tpot["n_baseline"] + tpot["n_candidate"] == 80  # every measured request, each on one side
    # the baseline does not speculate: acceptance is not compared, and that is said, not scored
    assert metric(doc, "code", "acceptance_rate")["state"] == "insufficient"
    assert "PASS" in (tmp_path / "report" / "canary.md").read_text()


@pytest.fixture(scope="module")
def draft_stack(data: Path, tmp_path_factory: pytest.TempPathFactory,
                prometheus_factory: Any) -> Iterator[tuple[Stack, PrometheusServer]]:
    """Baseline against a weak draft-model candidate, chat at 48 in flight, half of the traffic each."""
    # time scale 1: at 48 in flight the simulators' own Python time per step is large on a busy machine (the
    # compose tier's images build beside the suite); the modelled draft cost must stay well above it
    stack = start_stack(tmp_path_factory.mktemp("draft"), sim_args(1.0), sim_args(1.0, *WEAK_DRAFTER))
    try:
        prom = prometheus_factory(Targets({"baseline": stack.baseline.url, "candidate": stack.candidate.url},
                                          (stack.tap.url,)))
        prom.wait_until_up(3)
        load(stack, data, "chat", concurrency=48, requests_=96)
        prom.wait_for_sum("specwatch_requests_total", 96)
        yield stack, prom
    finally:
        stack.stop()


@SERVERS
def test_draft_model_candidate_at_high_concurrency_fails_on_tpot(
        draft_stack: tuple[Stack, PrometheusServer], tmp_path: Path) -> None:
    stack, prom = draft_stack
    code, doc = canary(tmp_path, "--event-log", str(stack.events), "--prometheus", prom.url, "--task", "chat")
    assert code == EXIT_FAIL, (tmp_path / "canary.md").read_text()
    tpot = metric(doc, "chat", "tpot")
    assert (tpot["state"], tpot["failed"], tpot["critical"]) == ("high", True, True)
    assert tpot["effect"]["low"] > 1.1 and tpot["p_value"] < 0.05
    task = doc["tasks"][0]
    assert task["verdict"] == "fail" and task["reasons"][0].startswith("critical metric failed: TPOT")
    # ITL p95 exists only in Prometheus: judged there, as a ratio without an interval
    itl = metric(doc, "chat", "itl_p95")
    assert itl["state"] != "insufficient" and "Prometheus" in itl["method"] and itl["p_value"] is None
    assert itl["n_baseline"] + itl["n_candidate"] == 96


@SERVERS
def test_prometheus_alone_reaches_the_same_verdict(draft_stack: tuple[Stack, PrometheusServer],
                                                   tmp_path: Path) -> None:
    stack, prom = draft_stack
    code, doc = canary(tmp_path, "--prometheus", prom.url, "--window", "5m")
    assert code == EXIT_FAIL, (tmp_path / "canary.md").read_text()
    tpot = metric(doc, "chat", "tpot")
    assert tpot["state"] == "high" and "Prometheus" in tpot["method"]
    assert tpot["n_baseline"] + tpot["n_candidate"] == 96


@SERVERS
def test_watch_stops_the_split_when_the_verdict_fails(draft_stack: tuple[Stack, PrometheusServer],
                                                      tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stack, _ = draft_stack
    monkeypatch.setenv("SPECWATCH_ADMIN_TOKEN", stack.token)
    auth = {"Authorization": f"Bearer {stack.token}"}
    assert requests.get(stack.tap.url + "/admin/weights", headers=auth, timeout=5).json() == {
        "weights": {"candidate": 50.0}}
    code, doc = canary(tmp_path, "--event-log", str(stack.events), "--task", "chat", "--watch", "--interval", "1",
                       "--rounds", "3", "--stop-split", "--push-to", stack.tap.url)
    assert code == EXIT_FAIL
    assert requests.get(stack.tap.url + "/admin/weights", headers=auth, timeout=5).json() == {
        "weights": {"candidate": 0.0}}
    exposition = samples(requests.get(stack.tap.url + "/metrics", timeout=5).text)
    assert exposition[("specwatch_canary_verdict", (("task", "chat"), ("verdict", "fail")))] == 1
    assert exposition[("specwatch_canary_verdict", (("task", "chat"), ("verdict", "pass")))] == 0
    before = requests_by_variant(stack.tap.url)
    for i in range(12):
        chat(stack.tap.url, f"after the stop {i}")
    after = requests_by_variant(stack.tap.url)
    assert after["candidate"] == before["candidate"] and after["baseline"] == before["baseline"] + 12


@SERVERS
def test_identical_configs_pass_with_their_intervals_inside_the_tolerance(data: Path, tmp_path: Path) -> None:
    # time scale 0.6: on a busy machine the scheduling noise of two processes is small against a 4 ms step
    stack = start_stack(tmp_path / "stack", sim_args(0.6), sim_args(0.6))
    try:
        for task in ("code", "chat"):
            load(stack, data, task, concurrency=4, requests_=100)
        code, doc = canary(tmp_path / "report", "--event-log", str(stack.events))
    finally:
        stack.stop()
    assert code == EXIT_PASS, (tmp_path / "report" / "canary.md").read_text()
    assert [t["task"] for t in doc["tasks"]] == ["chat", "code"]  # every task seen, none given
    policy = {m.name: m for m in policy_mod.load().metrics}
    for task in doc["tasks"]:
        assert task["verdict"] == "pass" and task["score"] == 100
        for m in task["metrics"]:
            if m["state"] == "insufficient":
                assert m["metric"] in ("acceptance_rate", "itl_p95", "output_identical")  # no drafts, no Prometheus
                continue
            assert m["state"] == "pass"
            e, p = m["effect"], policy[m["metric"]]
            assert e["low"] <= e["estimate"] <= e["high"]
            if METRICS[m["metric"]].scale != "ratio":
                continue
            # no change: every estimate inside the tolerance; where the metric is per token (TPOT, e2e and
            # speed with fixed output lengths) the whole interval too. TTFT varies too much at 50 requests
            # per side for its interval to fit inside +-20 % every time, so only its estimate is held to it.
            assert 1 - p.allowed_decrease < e["estimate"] < 1 + p.allowed_increase, (task["task"], m)
            if m["metric"] != "ttft":
                assert 1 - p.allowed_decrease <= e["low"] and e["high"] <= 1 + p.allowed_increase, (task["task"], m)


@SERVERS
def test_too_few_requests_is_insufficient_data_and_is_pushed(data: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    stack = start_stack(tmp_path / "stack", sim_args(0.1), ngram_args(0.1))
    try:
        load(stack, data, "code", concurrency=2, requests_=6)
        monkeypatch.setenv("SPECWATCH_ADMIN_TOKEN", stack.token)
        code, doc = canary(tmp_path / "report", "--event-log", str(stack.events), "--task", "code", "--task", "chat",
                           "--push-to", stack.tap.url)
        exposition = samples(requests.get(stack.tap.url + "/metrics", timeout=5).text)
    finally:
        stack.stop()
    assert code == EXIT_INSUFFICIENT
    assert doc["verdict"] == "insufficient"
    for task in doc["tasks"]:
        assert task["verdict"] == "insufficient" and task["score"] is None
        assert "insufficient data" in task["reasons"][0]
    tpot = metric(doc, "code", "tpot")
    # the 6 requests, less any a stalled machine delivered in one read (no gap between tokens, no TPOT: once in a
    # full run, 5); every one counted as a request below the minimum
    assert 3 <= tpot["n_baseline"] + tpot["n_candidate"] <= 6, tpot
    for task in ("code", "chat"):
        assert exposition[("specwatch_canary_verdict", (("task", task), ("verdict", "insufficient")))] == 1
        assert exposition[("specwatch_canary_verdict", (("task", task), ("verdict", "pass")))] == 0


@SERVERS
def test_admin_endpoint_needs_the_token_and_then_sends_everything_to_the_baseline(tmp_path: Path) -> None:
    stack = start_stack(tmp_path / "stack", sim_args(0.05), sim_args(0.05))
    plain = None
    try:
        url = stack.tap.url + "/admin/weights"
        assert requests.post(url, json={"candidate": 0}, timeout=5).status_code == 401
        wrong = requests.post(url, json={"candidate": 0}, headers={"Authorization": "Bearer nope"}, timeout=5)
        assert wrong.status_code == 401
        auth = {"Authorization": f"Bearer {stack.token}"}
        assert requests.post(url, json={"nosuch": 0}, headers=auth, timeout=5).status_code == 400
        assert requests.post(url, json={"candidate": 101}, headers=auth, timeout=5).status_code == 400
        for i in range(16):  # the 50 % split before the stop: both routes serve (all on one: p = 2^-15)
            chat(stack.tap.url, f"before {i}")
        before = requests_by_variant(stack.tap.url)
        assert before["candidate"] > 0 and before["baseline"] > 0
        ok = requests.post(url, json={"candidate": 0}, headers=auth, timeout=5)
        assert ok.status_code == 200 and ok.json() == {"weights": {"candidate": 0.0}}
        for i in range(16):
            chat(stack.tap.url, f"after {i}")
        after = requests_by_variant(stack.tap.url)
        assert after["candidate"] == before["candidate"] and after["baseline"] == before["baseline"] + 16
        # without a configured token there is no admin endpoint, and /admin/ is never proxied upstream
        plain = Service("exporter", ["--upstream", f"baseline={stack.baseline.url}"], tmp_path / "plain.log",
                        "/healthz")
        refused = requests.post(plain.url + "/admin/weights", json={"baseline": 0}, headers=auth, timeout=5)
        assert refused.status_code == 404 and refused.text == "404: Not Found"
    finally:
        stack.stop()
        if plain is not None:
            plain.stop()
    assert stack.token not in (stack.folder / "exporter.log").read_text()


@SERVERS
@pytest.mark.real_vllm
def test_real_vllm_a_against_a_with_a_cpu_hog_mid_split_still_passes(ngram_server: VllmServer,
                                                                      tmp_path: Path) -> None:
    """An A/A canary on the real server, with a CPU hog (two busy processes per core, `tests/hog.py`) over the
    middle third of the load: the n-gram server under two route names, same engine, same config. The hog slows
    the one server, both routes slow together, and the verdict must pass; unlike the simulator cases both sides
    speculate, so the acceptance rate is compared too, its interval around 0. (A quiet A/A beside this one took
    about 80 s of the suite and claimed nothing this one does not: issue 43.) The sides are pinned, never in a
    fixed order: baseline first in every pair makes the candidate wait for the baseline's prefill, a real TTFT
    difference the canary rightly reports. Each third is 12 prompts sent to both sides; the two in flight are the two
    sides of one prompt (in a shuffled order, the side sent first drawn per prompt), as a split
    interleaves the sides at every moment. That pairing matters here: on this machine the hog does not
    slow the server evenly but stalls it for seconds at a time, hitting the two requests then in
    flight, and 36 requests a side are too few for a plain shuffle to spread a few stalls evenly."""
    folder = tmp_path / "hog"
    folder.mkdir()
    events = folder / "events.jsonl"
    tap = Service("exporter", ["--upstream", f"baseline={ngram_server.url}", "--upstream",
                               f"candidate={ngram_server.url}", "--event-log", str(events)],
                  folder / "exporter.log", "/healthz")
    # 12 prompts a third: a stalled machine delivers some answers in one read (the tap sees every token at once:
    # no TPOT), as many as 7 of the hog third's 24 requests here; the quiet thirds alone keep 24 TPOT samples a side
    rows = article_rows("code", "en", 36)
    rng = random.Random(0)
    rng.shuffle(rows)
    thirds = [[(v, row) for row in rows[i:i + 12] for v in rng.sample(("baseline", "candidate"), 2)]
              for i in (0, 12, 24)]
    # two spinners per core: one per core sometimes left this VM's server as fast as before (under-hog mean 0.51 s
    # against a quiet median of 0.55 s once); bounded: its processes end themselves after 900 s whatever happens
    # here (90 s once ran out before the hog third's last answer, and 300 s on CI's slower machine: two spinners a
    # core can slow it that much); `with hog` stops it as soon as the third is back
    hog = Hog(seconds=900, processes=2 * (os.cpu_count() or 1))
    try:
        with ThreadPoolExecutor(2) as pool:
            def send(jobs: list[tuple[str, Row]]) -> None:
                list(pool.map(lambda job: chat(tap.url, job[1].prompt, 16, job[0], "code"), jobs))

            send(thirds[0])
            with hog:
                send(thirds[1])
                covered = hog.running  # still spinning when the last request of its third came back
            stopped = time.time()
            send(thirds[2])
        code, doc = canary(folder / "report", "--event-log", str(events), "--task", "code")
    finally:
        hog.stop()
        tap.stop()
    assert code == EXIT_PASS, (folder / "report" / "canary.md").read_text()
    assert doc["verdict"] == "pass" and doc["tasks"][0]["score"] == 100
    for m in doc["tasks"][0]["metrics"]:  # no metric moved, as in the quiet A/A (no Prometheus, no mirror)
        assert m["state"] == ("insufficient" if m["metric"] in ("itl_p95", "output_identical") else "pass"), m
    acceptance = metric(doc, "code", "acceptance_rate")
    assert acceptance["n_baseline"] == acceptance["n_candidate"] == 36
    assert acceptance["effect"]["low"] <= 0 <= acceptance["effect"]["high"], acceptance
    # The hog did slow the server, on each side. Per request from the event log (`ts` is its end, on the
    # clock of `hog.started`): its 12 requests wholly under the hog against its 24 quiet ones. The mean
    # under the hog, as the stalls hit a few requests hard and leave the rest at quiet speed (a median
    # can miss them); the median of the quiet ones, as a fresh server's first requests are slow.
    assert covered and hog.started is not None
    lines = [json.loads(line) for line in events.read_text().splitlines()]
    for variant in ("baseline", "candidate"):
        mine = [e for e in lines if e["variant"] == variant]
        under = [e["e2e_s"] for e in mine if e["ts"] - e["e2e_s"] >= hog.started and e["ts"] <= stopped]
        quiet = [e["e2e_s"] for e in mine if e["ts"] < hog.started or e["ts"] - e["e2e_s"] > stopped]
        assert len(under) == 12 and len(quiet) == 24, (variant, len(under), len(quiet))
        # 1.39x and more in most runs here, 1.196x once (CI, 2026-12-05): the hog's bite on this VM varies; 1.1x
        # still says it slowed the server (a hog that did nothing gives about 1.0x)
        assert statistics.mean(under) > 1.1 * statistics.median(quiet), (variant, under, quiet)

def test_usage_errors_are_exit_2(tmp_path: Path) -> None:
    assert cli.main(["canary", "--baseline", "b", "--candidate", "c"]) == 2  # no source
    assert cli.main(["canary", "--event-log", str(tmp_path / "x"), "--window", "ten"]) == 2
    assert cli.main(["canary", "--event-log", str(tmp_path / "x"), "--stop-split"]) == 2
    assert cli.main(["canary", "--event-log", str(tmp_path / "missing.jsonl")]) == 1
    assert cli.main(["canary", "--prometheus", f"http://127.0.0.1:{free_port()}"]) == 1


# -- policies that keep working (no servers) ------------------------------------------------------------------
POLICIES = Path(__file__).parent / "fixtures" / "canary-policies"
# every policy file shipped, by the commit that introduced that content (`git log -- examples/canary-policy.yaml
# specwatch/data/canary-policy.yaml`; 7380422 moved the first unchanged); no doc has shown a policy's YAML
SHIPPED = {"30313c5-examples-canary-policy.yaml": "30313c5", "e3df190-specwatch-data-canary-policy.yaml": "e3df190"}
EVERY_METRIC = ("tpot", "ttft", "itl_p95", "e2e", "output_tps", "error_ratio", "acceptance_rate", "output_identical")


def test_the_fixtures_are_every_shipped_policy() -> None:
    assert sorted(p.name for p in POLICIES.glob("*.yaml")) == sorted(SHIPPED)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_policy_shipped_since_the_first_still_loads_with_its_metrics(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = POLICIES / name
    policy = policy_mod.load(path)
    assert tuple(m.name for m in policy.metrics) == EVERY_METRIC
    assert policy.metric("tpot").critical and policy.metric("tpot").allowed_increase == pytest.approx(0.10)
    assert policy.metric("output_identical").at_least == pytest.approx(0.99)
    assert policy.cautions == {"speculation_vs_none": ("itl_p95",), "speculation_vs_speculation": ()}
    assert policy.notices == () and capsys.readouterr().err == ""


def six_metric_policy(tmp_path: Path, **extra: Any) -> Path:
    """The first shipped policy with only the six metrics the docs listed (no itl_p95, no output_identical)."""
    doc = yaml.safe_load((POLICIES / "30313c5-examples-canary-policy.yaml").read_text())
    for name in ("itl_p95", "output_identical"):
        del doc["metrics"][name]
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump({**doc, **extra}, sort_keys=False))
    return path


def test_a_version_1_policy_without_itl_p95_loads_and_the_default_caution_is_dropped_with_a_notice(
        tmp_path: Path) -> None:
    policy = policy_mod.load(six_metric_policy(tmp_path))
    assert [m.name for m in policy.metrics] == ["tpot", "ttft", "e2e", "output_tps", "error_ratio", "acceptance_rate"]
    assert policy.cautions == {"speculation_vs_none": (), "speculation_vs_speculation": ()}
    assert len(policy.notices) == 1 and "itl_p95" in policy.notices[0]
    assert "default caution for speculation_vs_none" in policy.notices[0]


def test_a_users_caution_on_a_metric_the_policy_lacks_is_dropped_and_a_typo_is_still_an_error(tmp_path: Path) -> None:
    both = {"speculation_vs_none": {"cautions": ["itl_p95", "ttft"]},
            "speculation_vs_speculation": {"cautions": ["output_identical"]}}
    policy = policy_mod.load(six_metric_policy(tmp_path, comparisons=both))
    assert policy.cautions == {"speculation_vs_none": ("ttft",), "speculation_vs_speculation": ()}
    assert [n.split(": ", 1)[1].split()[0] for n in policy.notices] == ["itl_p95", "output_identical"]
    assert all(".comparisons." in n and "dropped" in n for n in policy.notices)
    typo = {"speculation_vs_none": {"cautions": ["itl"]}, "speculation_vs_speculation": {"cautions": []}}
    with pytest.raises(policy_mod.PolicyError, match="cautions: expected a list of the policy's metrics"):
        policy_mod.load(six_metric_policy(tmp_path, comparisons=typo))


def test_the_cli_judges_with_such_a_policy_and_says_the_notice_once(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "events.jsonl"
    rng = random.Random(3)
    log.write_text("".join(json.dumps({"ts": time.time(), "variant": v, "task": "code", "outcome": "ok",
                                       "tpot_s": 0.01 * rng.lognormvariate(0, 0.05), "ttft_s": 0.05, "e2e_s": 0.7,
                                       "completion_tokens": 64, "C": 40, "D": 60}) + "\n"
                           for v in ("baseline", "candidate") for _ in range(30)))
    code = cli.main(["canary", "--event-log", str(log), "--policy", str(six_metric_policy(tmp_path))])
    err = capsys.readouterr().err
    assert code == EXIT_PASS, err
    assert err.count("itl_p95 is not among the policy's metrics") == 1, err
