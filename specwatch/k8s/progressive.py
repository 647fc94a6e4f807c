"""Progressive delivery gated on specwatch's verdict: Argo Rollouts and Flagger objects, generated from the policy.

`python -m specwatch.k8s.progressive` writes `deploy/k8s/progressive/` (`--check` exits 3 when a committed
file differs from a fresh generation; a test runs the same comparison):

- `verdict/`: `specwatch canary --prometheus ... --serve 0.0.0.0:9410` as a Deployment and the Service
  `specwatch-canary-verdict`, judging the split the exporter makes (`docs/canary.md`, the verdict endpoint).
- `argo/`: the `AnalysisTemplate` `specwatch-canary` (a `web` metric on the verdict endpoint, with success,
  failure and inconclusive conditions on `result`; and a `prometheus` metric per task for TPOT and acceptance
  where a user prefers PromQL) and an example `Rollout` of the candidate's vLLM Deployment whose steps wait
  on it.
- `flagger/`: a `MetricTemplate` per task and figure and a `Canary` of the candidate's Deployment whose
  analysis reads them and calls the verdict endpoint as a `rollout` webhook (2xx only on pass).

The thresholds come from the canary policy (`specwatch/data/canary-policy.yaml`: TPOT's allowed increase)
and the monitoring settings (`specwatch.monitoring`: the per-task acceptance floor of the alerts), the same
sources as `specwatch canary` and the alerts. None of this is in `deploy/k8s/kustomization.yaml`: it needs
Argo Rollouts' or Flagger's CRDs; apply `-k deploy/k8s/progressive/argo` or `.../flagger` beside the rest.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from specwatch.canary import policy as policy_mod
from specwatch.exporter.config import DEFAULT_TASKS
from specwatch.generated import write_or_check
from specwatch.monitoring import MONITORING

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "deploy" / "k8s" / "progressive"
NAMESPACE = "specwatch"
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"  # kube-prometheus-stack's; patch it in an overlay
VERDICT_PORT = 9410
VERDICT_SERVICE = "specwatch-canary-verdict"
VERDICT_URL = f"http://{VERDICT_SERVICE}.{NAMESPACE}.svc:{VERDICT_PORT}/verdict"
IMAGE = "specwatch/specwatch:0.1.0"  # as deploy/k8s/base/exporter.yaml
WINDOW = MONITORING.slow  # the canary alerts' window
INTERVAL = "1m"  # between measurements
COUNT = 5  # measurements per analysis step
HOW = "python -m specwatch.k8s.progressive"
Doc = dict[str, Any]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def tpot_limit(policy: policy_mod.Policy) -> float:
    """Candidate / baseline mean TPOT above this fails: the policy's allowed increase."""
    return round(1 + policy.metric("tpot").allowed_increase, 6)


def acceptance_floor() -> float:
    """The candidate's acceptance rate below this fails: the per-task collapse alert's level."""
    return MONITORING.alerts.task_acceptance_collapsed.level


def tpot_query(task: str) -> str:
    """The candidate's mean TPOT over the baseline's, one task, the alerts' window (one sample, or none)."""
    mean = f"variant_task:specwatch_tpot_seconds:mean_{WINDOW.rate}"
    return (f'sum({mean}{{variant="{MONITORING.candidate}",task="{task}"}})\n'
            f'/\nsum({mean}{{variant="{MONITORING.baseline}",task="{task}"}})')


def acceptance_query(task: str) -> str:
    rate = f"variant_task:specwatch_acceptance_rate:ratio_{WINDOW.rate}"
    return f'sum({rate}{{variant="{MONITORING.candidate}",task="{task}"}})'


def verdict_objects() -> list[Doc]:
    labels = {"app.kubernetes.io/name": VERDICT_SERVICE, "app.kubernetes.io/part-of": "specwatch"}
    args = ["canary", f"--prometheus={PROMETHEUS}", f"--baseline={MONITORING.baseline}",
            f"--candidate={MONITORING.candidate}", f"--window={WINDOW.duration}", "--interval=30",
            f"--serve=0.0.0.0:{VERDICT_PORT}"]
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": VERDICT_SERVICE, "namespace": NAMESPACE, "labels": labels},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app.kubernetes.io/name": VERDICT_SERVICE}},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "verdict", "image": IMAGE, "args": args,
                         "ports": [{"name": "http", "containerPort": VERDICT_PORT}],
                         "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10},
                         "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                       "limits": {"memory": "512Mi"}},
                         "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                             "capabilities": {"drop": ["ALL"]}}}]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": VERDICT_SERVICE, "namespace": NAMESPACE, "labels": labels},
        "spec": {"selector": {"app.kubernetes.io/name": VERDICT_SERVICE},
                 "ports": [{"name": "http", "port": VERDICT_PORT, "targetPort": "http"}]},
    }
    return [deployment, service]


def analysis_template(policy: policy_mod.Policy, tasks: tuple[str, ...]) -> Doc:
    limit, floor = tpot_limit(policy), acceptance_floor()
    metrics: list[Doc] = [{
        "name": "verdict", "interval": INTERVAL, "count": COUNT, "failureLimit": 0, "inconclusiveLimit": COUNT,
        "successCondition": 'result == "pass"', "failureCondition": 'result == "fail"',
        "provider": {"web": {"url": "{{args.verdict-url}}", "jsonPath": "{$.verdict}", "timeoutSeconds": 20}},
    }]
    for task in tasks:
        metrics.append({
            "name": f"tpot-{task}", "interval": INTERVAL, "count": COUNT, "failureLimit": 1,
            "successCondition": f"result[0] <= {limit:g}", "failureCondition": f"result[0] > {limit:g}",
            "provider": {"prometheus": {"address": "{{args.prometheus}}", "query": tpot_query(task)}}})
        metrics.append({
            "name": f"acceptance-{task}", "interval": INTERVAL, "count": COUNT, "failureLimit": 1,
            "successCondition": f"result[0] >= {floor:g}", "failureCondition": f"result[0] < {floor:g}",
            "provider": {"prometheus": {"address": "{{args.prometheus}}", "query": acceptance_query(task)}}})
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AnalysisTemplate",
        "metadata": {"name": "specwatch-canary", "namespace": NAMESPACE},
        "spec": {"args": [{"name": "verdict-url", "value": f"{VERDICT_URL}?always_200=true"},
                          {"name": "prometheus", "value": PROMETHEUS}],
                 "metrics": metrics},
    }


def rollout() -> Doc:
    gate = {"analysis": {"templates": [{"templateName": "specwatch-canary"}]}}
    return {
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
        "metadata": {"name": "vllm-candidate", "namespace": NAMESPACE},
        "spec": {"replicas": 2, "revisionHistoryLimit": 2,
                 "selector": {"matchLabels": {"app.kubernetes.io/name": "vllm", "specwatch.io/variant": "candidate"}},
                 "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-candidate",
                                 "scaleDown": "progressively"},
                 "strategy": {"canary": {"steps": [{"setWeight": 50}, gate, {"setWeight": 100}, gate]}}},
    }


def metric_templates(tasks: tuple[str, ...]) -> list[Doc]:
    out = []
    for task in tasks:
        for name, query in ((f"specwatch-tpot-ratio-{task}", tpot_query(task)),
                            (f"specwatch-acceptance-{task}", acceptance_query(task))):
            out.append({"apiVersion": "flagger.app/v1beta1", "kind": "MetricTemplate",
                        "metadata": {"name": name, "namespace": NAMESPACE},
                        "spec": {"provider": {"type": "prometheus", "address": PROMETHEUS}, "query": query}})
    return out


def flagger_canary(policy: policy_mod.Policy, tasks: tuple[str, ...]) -> Doc:
    metrics: list[Doc] = []
    for task in tasks:
        metrics.append({"name": f"tpot-ratio-{task}", "interval": INTERVAL,
                        "templateRef": {"name": f"specwatch-tpot-ratio-{task}", "namespace": NAMESPACE},
                        "thresholdRange": {"max": tpot_limit(policy)}})
        metrics.append({"name": f"acceptance-{task}", "interval": INTERVAL,
                        "templateRef": {"name": f"specwatch-acceptance-{task}", "namespace": NAMESPACE},
                        "thresholdRange": {"min": acceptance_floor()}})
    return {
        "apiVersion": "flagger.app/v1beta1", "kind": "Canary",
        "metadata": {"name": "vllm-candidate", "namespace": NAMESPACE},
        "spec": {"provider": "kubernetes",
                 "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "vllm-candidate"},
                 "progressDeadlineSeconds": 1800,
                 "service": {"port": 8000, "targetPort": 8000},
                 "analysis": {"interval": INTERVAL, "threshold": 3, "iterations": COUNT, "metrics": metrics,
                              "webhooks": [{"name": "specwatch-verdict", "type": "rollout", "url": VERDICT_URL,
                                            "timeout": "20s"}]}},
    }


def _dump(header: str, docs: list[Doc]) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=10**6) for d in docs)
    return f"# Generated by `{HOW}` ({header}): do not edit.\n" + body


def _kustomization(comment: str, resources: list[str]) -> str:
    lines = [f"# {line}" for line in comment.splitlines()]
    return "\n".join([*lines, "apiVersion: kustomize.config.k8s.io/v1beta1", "kind: Kustomization", "",
                      "resources:", *(f"  - {r}" for r in resources), ""])


def render(policy: policy_mod.Policy | None = None, tasks: tuple[str, ...] = DEFAULT_TASKS) -> dict[str, str]:
    """Every file of deploy/k8s/progressive/, by path relative to it."""
    policy = policy or policy_mod.load()
    source = "the canary policy and specwatch.monitoring"
    return {
        "verdict/verdict.yaml": _dump("the verdict endpoint", verdict_objects()),
        "verdict/kustomization.yaml": _kustomization(
            "`specwatch canary --serve` judging the exporter's split from Prometheus (set PROMETHEUS in\n"
            "specwatch/k8s/progressive.py, or patch --prometheus in an overlay, for yours).\n"
            f"Generated by `{HOW}`: do not edit.", ["verdict.yaml"]),
        "argo/analysis.yaml": _dump(source, [analysis_template(policy, tasks)]),
        "argo/rollout.yaml": _dump("an example: the candidate's vLLM Deployment, each step gated on the analysis",
                                   [rollout()]),
        "argo/kustomization.yaml": _kustomization(
            "Argo Rollouts (needs its CRDs): the AnalysisTemplate on specwatch's verdict and an example Rollout.\n"
            f"Generated by `{HOW}`: do not edit.", ["../verdict", "analysis.yaml", "rollout.yaml"]),
        "flagger/metrics.yaml": _dump(source, metric_templates(tasks)),
        "flagger/canary.yaml": _dump(source, [flagger_canary(policy, tasks)]),
        "flagger/kustomization.yaml": _kustomization(
            "Flagger (needs its CRDs): MetricTemplates per task and a Canary with specwatch's verdict as a webhook.\n"
            f"Generated by `{HOW}`: do not edit.", ["../verdict", "metrics.yaml", "canary.yaml"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=HOW, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT, help="the folder to write (default deploy/k8s/progressive)")
    parser.add_argument("--check", action="store_true", help="exit 3 when a committed file is stale")
    args = parser.parse_args(argv)
    worst = 0
    for name, text in render().items():
        worst = max(worst, write_or_check(args.out / name, text, args.check, HOW))
    return worst


if __name__ == "__main__":
    sys.exit(main())
