"""The Argo Rollouts and Flagger objects of deploy/k8s/progressive/: current, valid, and right on live data.

Rendered with the official kubectl's kustomize and validated offline: core kinds against the Kubernetes
schemas (strict), Argo's and Flagger's kinds against JSON schemas made from their own CRDs (vendored in
tests/fixtures/k8s/crd-schemas/, see make_progressive_crd_schemas.py there). Then each generated query and
URL is run as Argo and Flagger would run it, against a real Prometheus (the repository's rules) scraping
the real exporter in front of two simulators (a baseline and an n-gram candidate, split 50 / 50, a labelled
load) and against `specwatch canary --serve` on that Prometheus: each value meets the condition its template
expects for a candidate that is faster and accepts drafts, and the verdict's status is what a Flagger
webhook and Argo's web provider read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from specwatch import cli
from specwatch.canary import policy as policy_mod
from specwatch.k8s import progressive
from specwatch.net import free_port
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.workloads import write_article_workloads
from tests.conftest import NGRAM_SIM_ARGS, Service
from tests.controller_rules import WebAnswer, evaluate_result, web_measurement
from tests.test_grafana_dashboards import SIM_BASELINE_ARGS, at_gpu_speed, evaluated_after, newest, wait_for
from tests.test_k8s import kustomize, validate

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "k8s" / "progressive"
Doc = dict[str, Any]


def test_the_committed_objects_are_current() -> None:
    assert progressive.main(["--check"]) == 0, "run `make generate`"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {name: kustomize(DEPLOY / name) for name in ("verdict", "argo", "flagger")}


def test_every_object_validates_and_a_broken_one_does_not(rendered: dict[str, list[Doc]]) -> None:
    import jsonschema  # type: ignore[import-untyped]
    import kubernetes_validate  # type: ignore[import-untyped]

    kinds = set()
    for docs in rendered.values():
        for doc in docs:
            validate(doc)
            kinds.add(doc["kind"])
    assert {"AnalysisTemplate", "Rollout", "MetricTemplate", "Canary", "Deployment", "Service"} <= kinds, kinds
    for folder, kind, change in (("argo", "AnalysisTemplate", lambda d: d["spec"]["metrics"][0].update(bogus=1)),
                                 ("argo", "Rollout", lambda d: d["spec"]["strategy"]["canary"].update(step=[])),
                                 ("flagger", "Canary", lambda d: d["spec"]["analysis"].update(webhook=[])),
                                 ("flagger", "MetricTemplate", lambda d: d["spec"].update(querry="x"))):
        doc = json.loads(json.dumps(next(d for d in rendered[folder] if d["kind"] == kind)))
        change(doc)
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
            validate(doc)


def test_the_thresholds_are_the_policys_and_the_alerts() -> None:
    template = yaml.safe_load((DEPLOY / "argo" / "analysis.yaml").read_text())
    conditions = {m["name"]: m["successCondition"] for m in template["spec"]["metrics"]}
    limit = 1 + policy_mod.load().metric("tpot").allowed_increase
    assert conditions["tpot-code"] == f"len(result) == 1 && result[0] <= {limit:g}"
    assert conditions["verdict"] == 'result == "pass"'
    assert f">= {policy_mod.load().min_samples}" in metric_query(template, "tpot-code")  # too few requests: no answer
    canary = yaml.safe_load((DEPLOY / "flagger" / "canary.yaml").read_text())
    ranges = {m["name"]: m["thresholdRange"] for m in canary["spec"]["analysis"]["metrics"]}
    assert ranges["tpot-ratio-chat"] == {"max": limit} and set(ranges["acceptance-code"]) == {"min"}


def metric_query(template: Doc, name: str) -> str:
    query: str = next(m for m in template["spec"]["metrics"] if m["name"] == name)["provider"]["prometheus"]["query"]
    return query


def test_each_condition_reads_what_the_live_stack_gives(service_factory: Any, prometheus_factory: Any,
                                                         tmp_path: Path) -> None:
    candidate = service_factory("sim", at_gpu_speed(NGRAM_SIM_ARGS))
    baseline = service_factory("sim", at_gpu_speed(SIM_BASELINE_ARGS))
    tap = service_factory("exporter", ["--upstream", f"baseline={baseline.url}", "--upstream",
                                       f"candidate={candidate.url}", "--split", "candidate=50"])
    prom: PrometheusServer = prometheus_factory(Targets({"baseline": baseline.url, "candidate": candidate.url},
                                                        (tap.url,)))
    wait_for("three targets up", lambda: sorted(prom.values("up").values()) == [1.0, 1.0, 1.0])
    template = yaml.safe_load((DEPLOY / "argo" / "analysis.yaml").read_text())
    promql = [m for m in template["spec"]["metrics"] if "prometheus" in m["provider"]]
    wait_for("the request rule evaluated", evaluated_after(prom, "variant_task:specwatch_requests:rate5m",
                                                            max(newest(prom, "up"))))
    for metric in promql:  # before any request: no answer, which Argo counts inconclusive (never a pass)
        before = [float(s["value"][1]) for s in prom.query(metric["provider"]["prometheus"]["query"])]
        assert before == [] and evaluate_result(metric, before) == "Inconclusive", (metric["name"], before)
    data = tmp_path / "data"
    write_article_workloads(data, lang="en")
    code = cli.main(["load", "--target", tap.url, "--task", f"code={data / 'code.jsonl'}", "--task",
                     f"chat={data / 'chat.jsonl'}", "--concurrency", "4", "--requests", "160", "--warmup", "0",
                     "--ignore-eos", "--max-tokens", "64", "--max-seconds", "90", "--out", str(tmp_path / "load")])
    assert code == cli.EXIT_OK
    settled = time.time()
    wait_for("a scrape after the load", lambda: min(newest(prom, "up"), default=0) >= settled)
    wait_for("the rules after it", evaluated_after(prom, "variant_task:specwatch_tpot_seconds:mean_rate5m",
                                                    max(newest(prom, "up"))))
    for metric in promql:  # Argo's prometheus provider reads the vector's values (tests/controller_rules.py)
        result = [float(s["value"][1]) for s in prom.query(metric["provider"]["prometheus"]["query"])]
        assert len(result) == 1 and evaluate_result(metric, result) == "Successful", (metric["name"], result)
    assert len(promql) == 4  # TPOT and acceptance for code and chat
    for doc in yaml.safe_load_all((DEPLOY / "flagger" / "metrics.yaml").read_text()):
        if not doc:
            continue
        value = float(prom.query(doc["spec"]["query"])[0]["value"][1])
        canary = yaml.safe_load((DEPLOY / "flagger" / "canary.yaml").read_text())
        ranges = {m["templateRef"]["name"]: m["thresholdRange"] for m in canary["spec"]["analysis"]["metrics"]}
        bounds = ranges[doc["metadata"]["name"]]
        assert bounds.get("min", -1e300) <= value <= bounds.get("max", 1e300), (doc["metadata"]["name"], value)
    # the verdict endpoint, judging from the same Prometheus, called as Argo's web provider and Flagger's webhook
    port = free_port()
    log = (tmp_path / "canary.log").open("wb")
    serving = subprocess.Popen([sys.executable, "-m", "specwatch.cli", "canary", "--prometheus", prom.url,
                                "--window", "5m", "--interval", "1", "--serve", f"127.0.0.1:{port}"],
                               stdout=log, stderr=subprocess.STDOUT)
    try:
        web = next(m for m in template["spec"]["metrics"] if "web" in m["provider"])
        url = web["provider"]["web"]["url"].replace("{{args.verdict-url}}", template["spec"]["args"][0]["value"])
        local = urlsplit(url)._replace(netloc=f"127.0.0.1:{port}").geturl()
        deadline = time.monotonic() + 30
        while True:
            try:
                argo = requests.get(local, timeout=10)
                if argo.json().get("evaluations"):
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline and serving.poll() is None, (tmp_path / "canary.log").read_text()
            time.sleep(0.3)
        assert argo.status_code == 200  # Argo's web provider: always 200, the verdict in the body
        verdict = argo.json()["verdict"]  # jsonPath {$.verdict}
        assert verdict in ("pass", "marginal", "insufficient"), argo.json()  # a faster candidate never fails
        phase = web_measurement(web, WebAnswer(argo.status_code, argo.content))
        assert phase == ("Successful" if verdict == "pass" else "Inconclusive"), (phase, verdict)
        hook = yaml.safe_load((DEPLOY / "flagger" / "canary.yaml").read_text())["spec"]["analysis"]["webhooks"][0]
        flagger = requests.post(urlsplit(hook["url"])._replace(netloc=f"127.0.0.1:{port}").geturl(),
                                json={"name": "vllm-candidate", "namespace": "specwatch", "phase": "Progressing"},
                                timeout=10)
        assert (flagger.status_code == 200) == (flagger.json()["verdict"] == "pass")
        assert flagger.status_code in (200, 425), flagger.json()
    finally:
        serving.terminate()
        serving.wait(timeout=30)
        log.close()
    assert isinstance(tap, Service)
