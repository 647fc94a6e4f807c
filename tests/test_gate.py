"""The canary gate fails closed, by Argo Rollouts' and Flagger's own rules (`tests/controller_rules.py`).

The generated objects of deploy/k8s/progressive/ are driven with answer sequences: the verdict endpoint's real
answers (`specwatch canary --serve` started as a user starts it, one per state: pass, fail, marginal,
insufficient, none while Prometheus is down, stale while the evaluation hangs, and no answer at all) and
Prometheus answers (a value within, a value beyond, no sample, an error). Only passes ever let a step go on or
promote; the previous release's counting, put back, is caught. Then the wiring: the exporter's candidate route
reaches the revision under test (Argo's canaryService, Flagger's `-canary` Service) and nothing else.
"""

from __future__ import annotations

import copy
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from specwatch.k8s import progressive
from specwatch.net import free_port
from tests.controller_rules import (
    CanaryStatus,
    Phase,
    PromAnswer,
    RunOutcome,
    WebAnswer,
    evaluate_result,
    flagger_tick,
    prometheus_measurement,
    run_analysis,
    validate_metric,
    web_measurement,
)
from tests.test_k8s import kustomize

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "progressive"
Doc = dict[str, Any]
STATES = ("pass", "fail", "marginal", "insufficient", "none", "stale", "unreachable")
INTERVAL, DEADLINE = 1.0, 2.0  # the stale bound is 2 x interval + deadline: 4 s


def template() -> Doc:
    doc: Doc = yaml.safe_load((DEPLOY / "argo" / "analysis.yaml").read_text())
    return doc


def metric(name: str, doc: Doc | None = None) -> Doc:
    found: Doc = next(m for m in (doc or template())["spec"]["metrics"] if m["name"] == name)
    return found


def flagger_objects() -> tuple[Doc, dict[str, Doc]]:
    canary = yaml.safe_load((DEPLOY / "flagger" / "canary.yaml").read_text())
    templates = {d["metadata"]["name"]: d for d in yaml.safe_load_all((DEPLOY / "flagger" / "metrics.yaml").read_text())
                 if d}
    return canary, templates


# -- the verdict endpoint's real answers, one server per state -------------------------------------------------------
def _events(variant: str, n: int, rng: random.Random, tpot: float = 0.01, ttft: float = 0.05) -> list[str]:
    out = []
    for _ in range(n):
        t, first = tpot * rng.lognormvariate(0, 0.05), ttft * rng.lognormvariate(0, 0.05)
        out.append(json.dumps({"ts": time.time(), "variant": variant, "task": "code", "outcome": "ok", "tpot_s": t,
                               "ttft_s": first, "e2e_s": 0.05 + t * 63, "completion_tokens": 64, "C": 40, "D": 60}))
    return out


def _log(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


class Serving:
    """`specwatch canary --serve` as a user starts it; `answers()` is what Argo's web provider and a Flagger
    webhook get from it, taken from the generated URLs."""

    def __init__(self, args: list[str], out: Path) -> None:
        self.port = free_port()
        self.out = out
        self.proc = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "canary", *args, "--serve",
                                      f"127.0.0.1:{self.port}", "--interval", str(INTERVAL), "--deadline",
                                      str(DEADLINE)], stdout=out.open("wb"), stderr=subprocess.STDOUT)

    def url(self, generated: str) -> str:
        return urlsplit(generated)._replace(netloc=f"127.0.0.1:{self.port}").geturl()

    def answers(self) -> tuple[WebAnswer, WebAnswer]:
        argo_url = template()["spec"]["args"][0]["value"]  # {{args.verdict-url}}
        hook = flagger_objects()[0]["spec"]["analysis"]["webhooks"][0]
        argo = requests.get(self.url(argo_url), timeout=5)
        flagger = requests.post(self.url(hook["url"]), json={"name": "vllm-candidate", "namespace": "specwatch",
                                                             "phase": "Progressing"}, timeout=5)
        return WebAnswer(argo.status_code, argo.content), WebAnswer(flagger.status_code, flagger.content)

    def until(self, verdict: str, limit: float = 30) -> tuple[WebAnswer, WebAnswer]:
        deadline = time.monotonic() + limit
        while True:
            assert self.proc.poll() is None, self.out.read_text()
            try:
                argo, flagger = self.answers()
                if json.loads(argo.body).get("verdict") == verdict:
                    return argo, flagger
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (verdict, self.out.read_text())
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[WebAnswer, WebAnswer]]]:
    """Each state's (Argo's, Flagger's) answer, from a real `specwatch canary --serve`."""
    tmp = tmp_path_factory.mktemp("gate")
    rng = random.Random(7)
    logs = {
        "pass": _events("baseline", 40, rng) + _events("candidate", 40, rng),
        "fail": _events("baseline", 40, rng) + _events("candidate", 40, rng, tpot=0.02),
        "marginal": _events("baseline", 40, rng) + _events("candidate", 40, rng, ttft=0.15),  # TTFT alone, not critical
        "insufficient": _events("baseline", 5, rng) + _events("candidate", 5, rng),
    }
    servers = {state: Serving(["--event-log", str(_log(tmp / f"{state}.jsonl", lines))], tmp / f"{state}.out")
               for state, lines in logs.items()}
    closed = free_port()  # nobody listens: Prometheus down
    servers["none"] = Serving(["--prometheus", f"http://127.0.0.1:{closed}"], tmp / "none.out")
    stale_log = _log(tmp / "stale.jsonl", logs["pass"])
    servers["stale"] = Serving(["--event-log", str(stale_log)], tmp / "stale.out")
    try:
        got = {state: servers[state].until("none" if state == "none" else state)
               for state in ("pass", "fail", "marginal", "insufficient", "none")}
        servers["stale"].until("pass")
        stale_log.unlink()
        os.mkfifo(stale_log)  # a log nobody writes: the next evaluation hangs (a stand-in for a hung file system)
        got["stale"] = servers["stale"].until("stale", limit=2 * INTERVAL + DEADLINE + 10)
        got["unreachable"] = (WebAnswer(None), WebAnswer(None))
        yield got
    finally:
        for server in servers.values():
            server.stop()
        if stale_log.exists():
            stale_log.unlink()


def test_only_a_fresh_pass_is_a_2xx_without_always_200(answers: dict[str, tuple[WebAnswer, WebAnswer]]) -> None:
    statuses = {state: flagger.status for state, (_, flagger) in answers.items()}
    assert statuses == {"pass": 200, "fail": 412, "marginal": 425, "insufficient": 425, "none": 503, "stale": 503,
                        "unreachable": None}
    for state, (argo, _) in answers.items():  # Argo's web provider: 200 and the state in `verdict`
        if state != "unreachable":
            assert argo.status == 200 and json.loads(argo.body)["verdict"] == state, (state, argo)


# -- Argo Rollouts --------------------------------------------------------------------------------------------------
def verdict_run(answers: dict[str, tuple[WebAnswer, WebAnswer]], states: list[str], doc: Doc | None = None
                ) -> RunOutcome:
    m = metric("verdict", doc)
    return run_analysis([m], {"verdict": [web_measurement(m, answers[s][0]) for s in states]})


@pytest.mark.parametrize(("states", "phase", "taken"), [
    (["pass"] * 5, "Successful", 5),
    (["pass"] * 4 + ["fail"], "Failed", 5),
    (["insufficient"] * 5, "Running", 5),  # five of them decide nothing yet ...
    (["insufficient"] * 10, "Inconclusive", 6),  # ... and one more leaves too few measurements for five passes
    (["none"] * 10, "Inconclusive", 6),  # Prometheus down throughout
    (["unreachable"] * 10, "Error", 5),  # the endpoint itself does not answer: consecutiveErrorLimit 4
    (["stale"] * 10, "Inconclusive", 6),  # a pass that went stale is no pass
    (["marginal"] * 10, "Inconclusive", 6),
    (["insufficient"] * 3 + ["pass"] * 5, "Successful", 8),  # warming up, then five passes in a row
    (["pass", "pass", "stale", "pass", "pass", "pass", "none", "pass"], "Running", 8),  # never five in a row yet
    (["pass"] * 4 + ["insufficient"] + ["pass"] * 5, "Successful", 10),  # the streak restarts: five in a row at 10
    (["pass"] * 4 + ["insufficient"] + ["pass"] * 4 + ["marginal"], "Inconclusive", 10),  # count 10, never five
])
def test_argo_counts_the_verdict_metric_as_the_docs_table_says(
        answers: dict[str, tuple[WebAnswer, WebAnswer]], states: list[str], phase: str, taken: int) -> None:
    outcome = verdict_run(answers, states)
    assert outcome.phase == phase, outcome
    assert len(outcome.measurements["verdict"]) == taken, outcome


def only_passes_promote(answers: dict[str, tuple[WebAnswer, WebAnswer]], doc: Doc | None = None) -> None:
    """Over every kind of answer sequence: Successful only after PASSES passes in a row and no fail before."""
    rng = random.Random(3)
    count = metric("verdict", doc).get("count", 1)
    sequences = [[s] * count for s in STATES] + [[rng.choice(STATES) for _ in range(count)] for _ in range(3000)]
    for states in sequences:
        outcome = verdict_run(answers, states, doc)
        taken = states[:len(outcome.measurements["verdict"])]
        if outcome.phase == "Successful":
            run = "".join("P" if s == "pass" else "." for s in taken)
            assert "P" * progressive.PASSES in run and "fail" not in taken, (states, outcome)
        if "pass" not in states:
            assert outcome.phase != "Successful", states
        if "fail" in taken:
            assert outcome.rollout == "abort", (states, outcome)


def test_only_passes_ever_let_a_step_go_on(answers: dict[str, tuple[WebAnswer, WebAnswer]]) -> None:
    only_passes_promote(answers)


def test_the_previous_releases_counting_put_back_is_caught(answers: dict[str, tuple[WebAnswer, WebAnswer]]) -> None:
    """The mutation check: `count: 5, inconclusiveLimit: 5` (no consecutiveSuccessLimit), as shipped before, lets
    five `insufficient` answers through to Successful, and the property above says so."""
    old = template()
    m = metric("verdict", old)
    for key in ("consecutiveSuccessLimit", "consecutiveErrorLimit", "initialDelay"):
        m.pop(key)
    m.update(count=5, failureLimit=0, inconclusiveLimit=5)
    assert verdict_run(answers, ["insufficient"] * 5, old).phase == "Successful"
    with pytest.raises(AssertionError):
        only_passes_promote(answers, old)
    m.update(inconclusiveLimit=0)  # without the limit a first inconclusive pauses, with or without it no pass
    only_passes_promote(answers, old)


@pytest.mark.parametrize("name", ["tpot-code", "acceptance-chat"])
def test_argo_counts_each_promql_metric_the_same_way(name: str) -> None:
    m = metric(name)
    good, bad = ((0.8,), (1.5,)) if name.startswith("tpot") else ((0.6,), (0.01,))
    cases: list[tuple[list[PromAnswer], str]] = [
        ([PromAnswer(good)] * 5, "Successful"),
        ([PromAnswer(good)] * 4 + [PromAnswer(bad)], "Failed"),
        ([PromAnswer(())] * 10, "Inconclusive"),  # too few requests on a side: the guard answers nothing
        ([PromAnswer(error="connection refused")] * 10, "Error"),  # Prometheus down
        ([PromAnswer((float("nan"),))] * 10, "Inconclusive"),
        ([PromAnswer(good + good)] * 10, "Inconclusive"),  # two series: not the one number the condition reads
    ]
    for feed, phase in cases:
        outcome = run_analysis([m], {name: [prometheus_measurement(m, a) for a in feed]})
        assert outcome.phase == phase, (feed, outcome)


def test_a_whole_step_waits_for_every_metric() -> None:
    """The verdict passing is not enough while a PromQL metric has no data; one failing aborts the step."""
    doc = template()
    metrics = doc["spec"]["metrics"]

    def step(odd_one: str = "", phase: Phase = "Successful") -> str:
        feeds: dict[str, list[Phase]] = {m["name"]: ["Successful"] * 10 for m in metrics}
        if odd_one:
            feeds[odd_one] = [phase] * 10
        return run_analysis(metrics, feeds).rollout
    assert step() == "next step"
    assert step("tpot-chat", "Inconclusive") == "pause"
    assert step("acceptance-code", "Failed") == "abort"


def test_every_generated_metric_is_valid_for_argo_and_counts_alike() -> None:
    metrics = template()["spec"]["metrics"]
    for m in metrics:
        validate_metric(m)
        assert {k: m[k] for k in progressive.counting()} == progressive.counting(), m["name"]
    broken = copy.deepcopy(metrics[0])
    broken.update(count=3)  # fewer than failureLimit + consecutiveSuccessLimit: Argo refuses the template
    with pytest.raises(ValueError):
        validate_metric(broken)
    assert evaluate_result(metrics[1], []) == "Inconclusive"  # an empty answer meets neither condition


# -- Flagger --------------------------------------------------------------------------------------------------------
WITHIN = PromAnswer((-1.0,))  # stands for a value within each MetricTemplate's range (`_answer_for`)


def _answer_for(template_name: str, answer: PromAnswer) -> PromAnswer:
    if answer != WITHIN:
        return answer
    return PromAnswer((0.8,) if "tpot" in template_name else (0.6,))  # TPOT ratio under 1.1, acceptance over floor


def flagger_run(answers: dict[str, tuple[WebAnswer, WebAnswer]], states: list[str],
                queries: list[PromAnswer] | None = None) -> CanaryStatus:
    """Flagger's ticks with the webhook answering each state in turn and the MetricTemplates `queries`."""
    canary, templates = flagger_objects()
    status = CanaryStatus()
    hooks = [h["name"] for h in canary["spec"]["analysis"]["webhooks"]]
    for i, state in enumerate(states):
        answer = queries[i] if queries else WITHIN
        flagger_tick(canary, status, {h: answers[state][1].status for h in hooks},
                     {name: _answer_for(name, answer) for name in templates})
        if status.phase != "Progressing":
            break
    return status


@pytest.mark.parametrize(("states", "queries", "phase"), [
    (["pass"] * (progressive.PASSES + 2), None, "Promoting"),
    (["pass"] * 4 + ["fail"] * 10, None, "RolledBack"),
    (["insufficient"] * 10, [PromAnswer(())] * 10, "RolledBack"),
    (["none"] * 10, [PromAnswer(error="connection refused")] * 10, "RolledBack"),  # Prometheus down throughout
    (["stale"] * 10, None, "RolledBack"),
    (["unreachable"] * 10, None, "RolledBack"),
    (["pass"] * 10, [PromAnswer(())] * 10, "RolledBack"),  # the verdict passes, a MetricTemplate has no data
    (["insufficient"] * 3 + ["pass"] * 10, None, "Promoting"),  # warm-up within the threshold
])
def test_flagger_promotes_on_passes_only(answers: dict[str, tuple[WebAnswer, WebAnswer]], states: list[str],
                                         queries: list[PromAnswer] | None, phase: str) -> None:
    status = flagger_run(answers, states, queries)
    assert status.phase == phase, status.log


def test_flagger_never_promotes_without_enough_passing_analyses(
        answers: dict[str, tuple[WebAnswer, WebAnswer]]) -> None:
    rng = random.Random(5)
    for _ in range(2000):
        states = [rng.choice(STATES) for _ in range(20)]
        status = flagger_run(answers, states)
        if status.phase == "Promoting":
            assert status.log.count("failed check") < progressive.FLAGGER_THRESHOLD
            passes = sum(1 for line in status.log if line.startswith(("iteration", "routing", "promoted")))
            assert passes >= progressive.PASSES + 2, status.log  # the first iteration runs no analysis
        if "pass" not in states:
            assert status.phase != "Promoting", states


def test_argos_url_on_a_flagger_webhook_would_promote_on_insufficient_data(
        answers: dict[str, tuple[WebAnswer, WebAnswer]]) -> None:
    """Why the webhook reads the status and only Argo's URL carries always_200: swapped, Flagger would promote."""
    swapped = {state: (argo, argo) for state, (argo, _) in answers.items()}
    assert flagger_run(swapped, ["insufficient"] * 10).phase == "Promoting"
    assert flagger_run(answers, ["insufficient"] * 10).phase == "RolledBack"


# -- the wiring: the candidate route reaches the revision under test --------------------------------------------------
def _pods(docs: list[Doc]) -> dict[str, dict[str, str]]:
    """Every workload's pod labels by its name."""
    return {d["metadata"]["name"]: d["spec"]["template"]["metadata"].get("labels", {}) for d in docs
            if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")}


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _candidate_route(docs: list[Doc]) -> str:
    exporter = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "specwatch-exporter")
    args = exporter["spec"]["template"]["spec"]["containers"][0]["args"]
    route = next(a for a in args if a.startswith("--upstream=candidate="))
    return urlsplit(route.split("=", 2)[2]).hostname or ""


def test_argo_the_exporters_candidate_is_the_canary_service_of_the_rollout() -> None:
    docs = kustomize(DEPLOY / "argo")
    rollout = next(d for d in docs if d["kind"] == "Rollout")
    strategy = rollout["spec"]["strategy"]["canary"]
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert _candidate_route(docs) == strategy["canaryService"] != strategy["stableService"]
    pods = _pods(docs)
    target = rollout["spec"]["workloadRef"]["name"]
    for name in (strategy["canaryService"], strategy["stableService"]):
        # Argo narrows both Services to one revision by adding rollouts-pod-template-hash (rollout/service.go 62-73)
        selector = services[name]["spec"]["selector"]
        assert [p for p, labels in pods.items() if _selects(selector, labels)] == [target], (name, selector)
    assert _selects(rollout["spec"]["selector"]["matchLabels"], pods[target])


def test_flagger_the_exporters_candidate_is_the_canary_service_flagger_makes() -> None:
    docs = kustomize(DEPLOY / "flagger")
    canary = next(d for d in docs if d["kind"] == "Canary")
    target = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] ==
                  canary["spec"]["targetRef"]["name"])
    # the selector label: the first of --selector-labels (app,name,app.kubernetes.io/name) in the target's
    # selector (pkg/canary/deployment_controller.go 321-333; cmd/flagger/main.go 116)
    matched = target["spec"]["selector"]["matchLabels"]
    label = next(k for k in ("app", "name", "app.kubernetes.io/name") if k in matched)
    canary_selector = {label: matched[label]}  # pkg/router/kubernetes_default.go 49-60, 100-106
    apex = canary["spec"].get("service", {}).get("name") or canary["spec"]["targetRef"]["name"]
    assert _candidate_route(docs) == f"{apex}-canary"  # pkg/apis/flagger/v1beta1/canary.go 608-616
    assert [p for p, labels in _pods(docs).items() if _selects(canary_selector, labels)] == [target["metadata"]["name"]]
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("Service", apex) not in names  # Flagger owns the apex Service (and -primary, -canary)
    assert ("Service", "vllm-baseline") in names
