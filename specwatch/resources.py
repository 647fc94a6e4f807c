"""The files specwatch ships as package data (specwatch/data/), each named once, found through importlib.resources.

    canary-policy.yaml       the canary's default policy (`specwatch canary` without --policy)
    prometheus/              prometheus.yml, rules/ (recording + alerting), targets/ (compose's service
                             names), tests/ (promtool unit tests of the rules)
    grafana/                 provisioning/ (datasource with a fixed uid, dashboard provider), dashboards/
    perses/dashboards/       the same dashboards as Perses specs, and index.json (the viewer's list)

Compose, the images and the local stack read them from here; deploy/k8s keeps generated copies of the
rules and dashboards (kustomize reads no file outside its folder; `make generate` writes them and a test
fails on a stale one). So a wheel (or `pip install --no-deps .` in the image) works outside the checkout. Prometheus and
Grafana are handed folders, so the package must be installed as files (a zipped install is refused).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def _root() -> Path:
    root = files("specwatch") / "data"
    if not isinstance(root, Path):  # e.g. a zipimport: Prometheus and Grafana cannot read a zip member
        raise RuntimeError(f"specwatch's package data is not on the file system ({root}): install it unpacked")
    return root.resolve()


ROOT = _root()
CANARY_POLICY = ROOT / "canary-policy.yaml"
PROMETHEUS = ROOT / "prometheus"
PROMETHEUS_CONFIG = PROMETHEUS / "prometheus.yml"
RULES = PROMETHEUS / "rules"
TARGETS = PROMETHEUS / "targets"
RULE_TESTS = PROMETHEUS / "tests"
GRAFANA = ROOT / "grafana"
PROVISIONING = GRAFANA / "provisioning"
DASHBOARDS = GRAFANA / "dashboards"
PERSES_DASHBOARDS = ROOT / "perses" / "dashboards"

# Every resource above by name: the wheel test checks that each one is installed.
RESOURCES: dict[str, Path] = {
    "canary policy": CANARY_POLICY, "Prometheus config": PROMETHEUS_CONFIG, "rules": RULES, "targets": TARGETS,
    "rule tests": RULE_TESTS, "Grafana provisioning": PROVISIONING, "dashboards": DASHBOARDS,
    "Perses dashboards": PERSES_DASHBOARDS,
}

