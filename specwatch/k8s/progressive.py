"""Progressive delivery gated on specwatch's verdict: Argo Rollouts and Flagger objects, generated from the policy.

`python -m specwatch.k8s.progressive` writes `deploy/k8s/progressive/` (`--check` exits 3 when a committed
file differs from a fresh generation; a test runs the same comparison):

- `verdict/`: `specwatch canary --prometheus ... --serve 0.0.0.0:9410` as a Deployment and the Service
  `specwatch-canary-verdict`, judging the split the exporter makes (`docs/canary.md`, the verdict endpoint).
- `argo/`: the whole of `deploy/k8s` with the candidate's vLLM run by a `Rollout` (canary strategy, a
  `canaryService` that only ever selects the revision under test, which the exporter's `candidate` route
  reaches), and the `AnalysisTemplate` `specwatch-canary` its steps wait on: a `web` metric on the verdict
  endpoint and a `prometheus` metric per task for TPOT and acceptance.
- `flagger/`: the whole of `deploy/k8s` with a `Canary` of the candidate's Deployment (Flagger owns the
  Services `vllm-candidate`, `-primary` and `-canary`; the exporter's `candidate` route reaches `-canary`, the
  new revision), a `MetricTemplate` per task and figure, and the verdict endpoint as a `rollout` webhook.

Fail closed, by the controllers' own counting (`docs/canary.md` has the table, with the source lines):
a step passes only on `PASSES` passes in a row (Argo's `consecutiveSuccessLimit`; Flagger's iterations
advance only on a passing analysis); a fail rolls back; anything else (inconclusive, no data, an
unreachable Prometheus, a failed or stale evaluation) pauses (Argo) or counts as a failed check (Flagger),
never as a pass. Each PromQL figure answers nothing unless both sides served `min_samples` requests in the
window, so too little data is no data, never a pass. `tests/controller_rules.py` re-implements both
controllers' rules and `tests/test_gate.py` drives these objects with it.

The thresholds come from the canary policy (`specwatch/data/canary-policy.yaml`: TPOT's allowed increase,
`min_samples`) and the monitoring settings (`specwatch.monitoring`: the per-task acceptance floor of the
alerts), the same sources as `specwatch canary` and the alerts. Each folder needs its controller's CRDs:
apply `-k deploy/k8s/progressive/argo` or `.../flagger` *instead of* `-k deploy/k8s` (each includes it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from specwatch.canary import policy as policy_mod
from specwatch.canary.samples import parse_window
from specwatch.exporter.config import DEFAULT_TASKS
from specwatch.files import write_or_check
from specwatch.monitoring import MONITORING
from specwatch.promconfig.rules import recorded

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "deploy" / "k8s" / "progressive"
EXPORTER = REPO / "deploy" / "k8s" / "base" / "exporter.yaml"
NAMESPACE = "specwatch"
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"  # kube-prometheus-stack's; patch it in an overlay
VERDICT_PORT = 9410
VERDICT_SERVICE = "specwatch-canary-verdict"
VERDICT_URL = f"http://{VERDICT_SERVICE}.{NAMESPACE}.svc:{VERDICT_PORT}/verdict"
IMAGE = "specwatch/specwatch:0.1.0"  # as deploy/k8s/base/exporter.yaml
WINDOW = MONITORING.slow  # the canary alerts' window, and the verdict's
INTERVAL = "1m"  # between measurements (Argo) and analyses (Flagger)
VERDICT_INTERVAL = 30  # seconds between the verdict endpoint's evaluations
PASSES = 5  # passes in a row that let an Argo step go on; Flagger's iterations (each needs a passing analysis)
COUNT = 10  # Argo: measurements at most per step; without PASSES in a row by then the step pauses
ERRORS = 4  # Argo: measurement errors in a row tolerated (its default, written out); one more aborts
FLAGGER_THRESHOLD = 5  # Flagger: failed checks (any non-pass) in one analysis before it rolls back
TARGET = "vllm-candidate"  # the candidate's vLLM Deployment (deploy/k8s/overlays/candidate)
CANARY_SERVICE = f"{TARGET}-canary"  # Argo's canaryService, and the Service Flagger makes for the new revision
FLAGGER_SELECTOR_LABEL = "app"  # the first of Flagger's --selector-labels (app,name,app.kubernetes.io/name)
# deploy/k8s's parts, named one by one (kustomize refuses `../..`, a root that contains this one)
STACK = [f"../../{r}" for r in yaml.safe_load((OUT.parent / "kustomization.yaml").read_text())["resources"]]
HOW = "python -m specwatch.k8s.progressive"
Doc = dict[str, Any]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL) as literal blocks; a repeated object written out again, never as an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _str)


def tpot_limit(policy: policy_mod.Policy) -> float:
    """Candidate / baseline mean TPOT above this fails: the policy's allowed increase."""
    return round(1 + policy.metric("tpot").allowed_increase, 6)


def acceptance_floor() -> float:
    """The candidate's acceptance rate below this fails: the per-task collapse alert's level."""
    return MONITORING.alerts.task_acceptance_collapsed.level


def _enough(variant: str, task: str, policy: policy_mod.Policy) -> str:
    """Whether `variant` served the policy's `min_samples` requests of `task` in the window (one sample, or none)."""
    rate = recorded(f"variant_task:specwatch_requests:{WINDOW.rate}")
    seconds = int(parse_window(WINDOW.duration))
    return f'sum({rate}{{variant="{variant}",task="{task}"}}) * {seconds} >= {policy.min_samples}'


def _guarded(figure: str, task: str, policy: policy_mod.Policy) -> str:
    """`figure`, or nothing unless both sides have the requests to carry it: too little data is no data."""
    return (f"(\n{figure}\n)\nand on() ({_enough(MONITORING.candidate, task, policy)})"
            f"\nand on() ({_enough(MONITORING.baseline, task, policy)})")


def tpot_query(task: str, policy: policy_mod.Policy) -> str:
    """The candidate's mean TPOT over the baseline's, one task, the alerts' window (one sample, or none)."""
    mean = recorded(f"variant_task:specwatch_tpot_seconds:mean_{WINDOW.rate}")
    return _guarded(f'sum({mean}{{variant="{MONITORING.candidate}",task="{task}"}})\n/\n'
                    f'sum({mean}{{variant="{MONITORING.baseline}",task="{task}"}})', task, policy)


def acceptance_query(task: str, policy: policy_mod.Policy) -> str:
    rate = recorded(f"variant_task:specwatch_acceptance_rate:ratio_{WINDOW.rate}")
    return _guarded(f'sum({rate}{{variant="{MONITORING.candidate}",task="{task}"}})', task, policy)


def verdict_objects() -> list[Doc]:
    labels = {"app.kubernetes.io/name": VERDICT_SERVICE, "app.kubernetes.io/part-of": "specwatch"}
    args = ["canary", f"--prometheus={PROMETHEUS}", f"--baseline={MONITORING.baseline}",
            f"--candidate={MONITORING.candidate}", f"--window={WINDOW.duration}", f"--interval={VERDICT_INTERVAL}",
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


def counting() -> Doc:
    """How each Argo metric counts its measurements: PASSES in a row succeed, a fail fails, errors in a row beyond
    ERRORS abort, and COUNT measurements without PASSES in a row end Inconclusive (a pause), never Successful."""
    return {"initialDelay": WINDOW.duration, "interval": INTERVAL, "count": COUNT, "consecutiveSuccessLimit": PASSES,
            "failureLimit": 0, "inconclusiveLimit": COUNT - PASSES, "consecutiveErrorLimit": ERRORS}


def _one_number(comparison: str) -> str:
    """An Argo condition on a PromQL answer: one sample meeting `comparison`; an empty answer meets neither."""
    return f"len(result) == 1 && result[0] {comparison}"


def analysis_template(policy: policy_mod.Policy, tasks: tuple[str, ...]) -> Doc:
    limit, floor = tpot_limit(policy), acceptance_floor()
    metrics: list[Doc] = [{
        "name": "verdict", **counting(),
        "successCondition": 'result == "pass"', "failureCondition": 'result == "fail"',
        "provider": {"web": {"url": "{{args.verdict-url}}", "jsonPath": "{$.verdict}", "timeoutSeconds": 20}},
    }]
    for task in tasks:
        metrics.append({
            "name": f"tpot-{task}", **counting(),
            "successCondition": _one_number(f"<= {limit:g}"), "failureCondition": _one_number(f"> {limit:g}"),
            "provider": {"prometheus": {"address": "{{args.prometheus}}", "query": tpot_query(task, policy)}}})
        metrics.append({
            "name": f"acceptance-{task}", **counting(),
            "successCondition": _one_number(f">= {floor:g}"), "failureCondition": _one_number(f"< {floor:g}"),
            "provider": {"prometheus": {"address": "{{args.prometheus}}", "query": acceptance_query(task, policy)}}})
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
        "metadata": {"name": TARGET, "namespace": NAMESPACE},
        "spec": {"replicas": 2, "revisionHistoryLimit": 2,
                 "selector": {"matchLabels": {"app.kubernetes.io/name": "vllm", "specwatch.io/variant": "candidate"}},
                 "workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET,
                                 "scaleDown": "progressively"},
                 "strategy": {"canary": {"canaryService": CANARY_SERVICE, "stableService": TARGET,
                                         "steps": [{"setWeight": 50}, gate, {"setWeight": 100}, gate]}}},
    }


def canary_service() -> Doc:
    """Argo's canaryService: the candidate's pods, narrowed by Argo to the revision under test."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": CANARY_SERVICE, "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/part-of": "specwatch", "specwatch.io/variant": "candidate"}},
        "spec": {"selector": {"app.kubernetes.io/name": "vllm", "specwatch.io/variant": "candidate"},
                 "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
    }


def metric_templates(policy: policy_mod.Policy, tasks: tuple[str, ...]) -> list[Doc]:
    out = []
    for task in tasks:
        for name, query in ((f"specwatch-tpot-ratio-{task}", tpot_query(task, policy)),
                            (f"specwatch-acceptance-{task}", acceptance_query(task, policy))):
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
        "metadata": {"name": TARGET, "namespace": NAMESPACE},
        "spec": {"provider": "kubernetes",
                 "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET},
                 "progressDeadlineSeconds": 1800,
                 "service": {"port": 8000, "targetPort": 8000},
                 "analysis": {"interval": INTERVAL, "threshold": FLAGGER_THRESHOLD, "iterations": PASSES,
                              "metrics": metrics,
                              "webhooks": [{"name": "specwatch-verdict", "type": "rollout", "url": VERDICT_URL,
                                            "timeout": "20s"}]}},
    }


def _exporter_candidate_patch(to: str) -> Doc:
    """A JSON patch of the exporter's Deployment: its `candidate` route goes to `to`; the `test` op makes the build
    fail, rather than patch the wrong argument, if deploy/k8s/base/exporter.yaml has moved it."""
    docs = [d for d in yaml.safe_load_all(EXPORTER.read_text()) if d and d.get("kind") == "Deployment"]
    args: list[str] = docs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    old = next(a for a in args if a.startswith(f"--upstream={MONITORING.candidate}="))
    where = f"/spec/template/spec/containers/0/args/{args.index(old)}"
    ops = [{"op": "test", "path": where, "value": old},
           {"op": "replace", "path": where, "value": f"--upstream={MONITORING.candidate}={to}"}]
    return {"target": {"kind": "Deployment", "name": docs[0]["metadata"]["name"]},
            "patch": yaml.dump(ops, Dumper=_Dumper, sort_keys=False, width=10**6)}


def _flagger_patches() -> list[Doc]:
    """Flagger makes the candidate's Services from a selector label of its own (`app`, unique to the candidate:
    `app.kubernetes.io/name: vllm` is the baseline's too); the overlay's Service `vllm-candidate` goes, since
    Flagger owns that name."""
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": TARGET, "namespace": NAMESPACE},
                  "spec": {"selector": {"matchLabels": {FLAGGER_SELECTOR_LABEL: TARGET}},
                           "template": {"metadata": {"labels": {FLAGGER_SELECTOR_LABEL: TARGET}}}}}
    service = {"$patch": "delete", "apiVersion": "v1", "kind": "Service",
               "metadata": {"name": TARGET, "namespace": NAMESPACE}}
    return [{"patch": yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=10**6)} for d in (deployment, service)]


def _dump(header: str, docs: list[Doc]) -> str:
    body = "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=10**6) for d in docs)
    return f"# Generated by `{HOW}` ({header}): do not edit.\n" + body


def _kustomization(comment: str, resources: list[str], patches: list[Doc] | None = None) -> str:
    lines = [f"# {line}" for line in comment.splitlines()]
    doc: Doc = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": resources}
    if patches:
        doc["patches"] = patches
    return "\n".join(lines) + "\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=10**6)


def render(policy: policy_mod.Policy | None = None, tasks: tuple[str, ...] = DEFAULT_TASKS) -> dict[str, str]:
    """Every file of deploy/k8s/progressive/, by path relative to it."""
    policy = policy or policy_mod.load()
    source = "the canary policy and specwatch.monitoring"
    canary_url = f"http://{CANARY_SERVICE}:8000"
    return {
        "verdict/verdict.yaml": _dump("the verdict endpoint", verdict_objects()),
        "verdict/kustomization.yaml": _kustomization(
            "`specwatch canary --serve` judging the exporter's split from Prometheus (set PROMETHEUS in\n"
            "specwatch/k8s/progressive.py, or patch --prometheus in an overlay, for yours).\n"
            f"Generated by `{HOW}`: do not edit.", ["verdict.yaml"]),
        "argo/analysis.yaml": _dump(source, [analysis_template(policy, tasks)]),
        "argo/rollout.yaml": _dump("the candidate's vLLM as a Rollout, each step gated on the analysis; its "
                                   "canaryService is the exporter's candidate", [rollout(), canary_service()]),
        "argo/kustomization.yaml": _kustomization(
            "deploy/k8s with Argo Rollouts (needs its CRDs; apply this instead of deploy/k8s): the candidate's vLLM\n"
            f"as a Rollout whose canaryService {CANARY_SERVICE} is the exporter's candidate route, the\n"
            "AnalysisTemplate on specwatch's verdict, and the verdict endpoint.\n"
            f"Generated by `{HOW}`: do not edit.", [*STACK, "../verdict", "analysis.yaml", "rollout.yaml"],
            [_exporter_candidate_patch(canary_url)]),
        "flagger/metrics.yaml": _dump(source, metric_templates(policy, tasks)),
        "flagger/canary.yaml": _dump(source, [flagger_canary(policy, tasks)]),
        "flagger/kustomization.yaml": _kustomization(
            "deploy/k8s with Flagger (needs its CRDs; apply this instead of deploy/k8s): a Canary of the candidate's\n"
            f"vLLM (Flagger owns {TARGET}, -primary and -canary; the exporter's candidate route is {CANARY_SERVICE},\n"
            "the new revision), MetricTemplates per task and specwatch's verdict as a rollout webhook.\n"
            f"Generated by `{HOW}`: do not edit.", [*STACK, "../verdict", "metrics.yaml", "canary.yaml"],
            [_exporter_candidate_patch(canary_url), *_flagger_patches()]),
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
