"""The Grafana dashboards: committed JSON is current, panels are well formed and read only known series,
and every panel query returns data from a real Prometheus scraping simulators and the exporter under load.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from specwatch import cli, resources
from specwatch.exporter.config import DEFAULT_ADMIN_TOKEN_ENV, ExporterConfig
from specwatch.exporter.metrics import CANARY_VERDICTS, ExporterMetrics
from specwatch.grafana import canary, dashboards
from specwatch.grafana.board import DATASOURCE_UID
from specwatch.grafana.key_queries import substitute
from specwatch.monitoring import MONITORING
from specwatch.promconfig.alerts import from_policy
from specwatch.promconfig.cost_rules import StepCost, write_cost_rules
from specwatch.promconfig.server import PrometheusServer, Targets
from specwatch.workloads import write_article_workloads
from tests.conftest import DETAILED_SIM_ARGS, Service, requests_by_variant

REPO = Path(__file__).parents[1]
COMMITTED = resources.DASHBOARDS
PROVISIONING = resources.PROVISIONING
UIDS = {"specwatch-acceptance", "specwatch-latency", "specwatch-canary"}
NO_QUERY = {"row", "alertlist"}
SIM_BASELINE_ARGS = ["Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096",
                     "--max-num-seqs", "16", "--seed", "42", "--sim-time-scale", "0.02"]
# GPU-speed timing (about 1 s a request), so the load spans several 5 s scrapes: every rate then has two
# differing samples inside both windows, with CPU to spare (the processes mostly sleep).
TIME_SCALE = "1"
ADMIN_TOKEN = "test-only-admin-token"  # through the environment, as a user gives it
RULE_NAME = re.compile(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b")
RAW_NAME = re.compile(r"\b(?:vllm:[a-z0-9_]+|specwatch_[a-z0-9_]+)\b")
Json = dict[str, Any]


def boards() -> dict[str, Json]:
    return dashboards.all_dashboards()


def panels(board: Json) -> Iterator[Json]:
    for panel in board["panels"]:
        yield panel
        yield from panel.get("panels", [])


def queries(board: Json) -> Iterator[tuple[Json, Json]]:
    """(panel, target) for every query of the dashboard."""
    for panel in panels(board):
        for target in panel.get("targets", []):
            yield panel, target


def all_exprs() -> Iterator[tuple[str, str, str]]:
    """(dashboard title, panel or variable title, PromQL) for every query, variables included."""
    for board in boards().values():
        for panel, target in queries(board):
            yield board["title"], panel["title"], target["expr"]
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                yield board["title"], f"variable {var['name']}", var["query"]["query"]


# -- the committed files ------------------------------------------------------------------------


def test_the_committed_json_equals_a_fresh_generation():
    assert dashboards.main(["--check", "--out", str(COMMITTED)]) == 0, "run `python -m specwatch.grafana.dashboards`"
    assert sorted(p.name for p in COMMITTED.glob("*.json")) == sorted(boards())


def test_check_exits_3_on_a_stale_file_and_0_on_a_fresh_one(tmp_path, capsys):
    assert dashboards.main(["--out", str(tmp_path)]) == 0
    assert dashboards.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / "specwatch-canary.json"
    path.write_text(path.read_text().replace("Current verdict", "Verdict"))
    assert dashboards.main(["--check", "--out", str(tmp_path)]) == dashboards.EXIT_STALE
    assert "specwatch-canary.json is not current" in capsys.readouterr().err


def test_uids_are_fixed_and_the_dashboards_read_only():
    loaded = [json.loads(p.read_text()) for p in sorted(COMMITTED.glob("*.json"))]
    assert {b["uid"] for b in loaded} == UIDS and len(loaded) == len(UIDS)
    for board in loaded:
        assert board["editable"] is False and board["schemaVersion"] >= 39, board["uid"]
        ids = [p["id"] for p in panels(board)]
        assert len(ids) == len(set(ids)), board["uid"]


def test_variables():
    for board in boards().values():
        by_name = {v["name"]: v for v in board["templating"]["list"]}
        assert list(by_name) == ["datasource", "variant", "task", "model"]
        assert by_name["datasource"]["type"] == "datasource" and by_name["datasource"]["query"] == "prometheus"
        assert by_name["datasource"]["current"]["value"] == DATASOURCE_UID
        for name in ("variant", "task", "model"):
            var = by_name[name]
            assert (var["multi"], var["includeAll"], var["allValue"]) == (True, True, ".*"), (board["uid"], name)
            assert var["datasource"]["uid"] == "${datasource}"
        for name in ("variant", "task"):
            assert by_name[name]["query"]["query"].startswith("label_values(specwatch_"), (board["uid"], name)
        assert "model_name" in by_name["model"]["query"]["query"]


def test_every_panel_is_described_has_a_unit_and_uses_the_datasource_variable():
    for board in boards().values():
        for panel in panels(board):
            where = f"{board['uid']} / {panel['title']}"
            if panel["type"] == "row":
                continue
            assert len(panel.get("description", "")) > 40, where
            if panel["type"] in NO_QUERY:
                assert not panel.get("targets"), where
                continue
            assert panel["fieldConfig"]["defaults"].get("unit"), where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel["targets"], where
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}", where
    types = {p["type"] for b in boards().values() for p in panels(b)}
    assert {"timeseries", "stat", "barchart", "heatmap", "table", "alertlist"} <= types


def test_every_recording_rule_a_panel_uses_exists():
    rules_doc = yaml.safe_load((resources.RULES / "specwatch-recording.yml").read_text())
    recorded = {r["record"] for g in rules_doc["groups"] for r in g["rules"]}
    used = set()
    for board, title, expr in all_exprs():
        for name in RULE_NAME.findall(expr):
            assert name in recorded, f"{board} / {title}: no recording rule {name}"
            used.add(name)
    assert len(used) > 40


def exposed_names() -> set[str]:
    """Every series name vLLM 0.32.0 or the exporter can expose (counters with _total, histogram parts)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    catalog = json.loads((REPO / "specwatch" / "simulator" / "vllm-0.32.0-families.json").read_text())
    families = [(f["name"], f["type"]) for f in catalog]
    registry = CollectorRegistry()
    ExporterMetrics(registry, ExporterConfig(upstreams={"baseline": "http://127.0.0.1:8000"}))
    families += [(f.name, f.type) for f in registry.collect()]
    return {name + suffix for name, kind in families for suffix in suffixes[kind]}


def test_every_raw_metric_name_exists_in_vllm_or_the_exporter():
    known = exposed_names()
    assert "vllm:cache_config_info" in known and "specwatch_request_acceptance_rate_bucket" in known
    for board, title, expr in all_exprs():
        for name in RAW_NAME.findall(RULE_NAME.sub("", expr)):
            assert name in known, f"{board} / {title}: {name} is neither a vLLM 0.32.0 nor an exporter series"


def test_the_verdict_uses_the_thresholds_of_the_canary_alerts():
    alerts = yaml.safe_load((resources.RULES / "specwatch-alerts.yml").read_text())
    exprs = {r["alert"]: r["expr"] for g in alerts["groups"] for r in g["rules"]}
    settings = MONITORING.alerts
    tpot, itl = from_policy(settings.tpot_regression), from_policy(settings.itl_regression)
    verdict = canary.verdict_expr()
    for setting, metric in ((tpot, "tpot"), (itl, "itl")):
        ratio = f"task_quantile:specwatch_{metric}_seconds:candidate_over_baseline_rate5m"
        assert f"{ratio} > {setting.threshold:g}\n" in exprs[setting.name]
        assert f"{ratio}{{task=~\"$task\"}}) > bool {setting.threshold:g})" in verdict
        # the same traffic guard, the verdict's filtered by the task variable
        guard = f"* 60 >= {settings.min_candidate_requests_per_minute:g}"
        assert '{variant="candidate"}) ' + guard in exprs[setting.name]
        assert verdict.endswith('{variant="candidate",task=~"$task"}) ' + guard + ")")
    # the policy's comparison kinds, alike in the alert and the verdict: ITL decides only where the baseline drafts
    drafts = 'variant_task:specwatch_draft_tokens:rate5m{variant="baseline"'
    assert exprs[settings.itl_regression.name].endswith(drafts + "}) > 0")
    assert f"and on (task) (sum by (task) ({drafts},task=~\"$task\"}}) > 0))" in verdict
    # the ratio panels draw the same thresholds
    board = boards()["specwatch-canary.json"]
    steps = {p["title"]: [s["value"] for s in p["fieldConfig"]["defaults"]["thresholds"]["steps"]]
             for p in panels(board) if p["type"] == "timeseries"}
    assert steps["TPOT p95 ratio"] == [None, tpot.threshold]
    assert steps["ITL p99 ratio"] == [None, itl.threshold]


def test_provisioning_points_at_the_dashboards_and_the_fixed_datasource():
    ds = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert [(d["uid"], d["type"], d["url"], d["isDefault"]) for d in ds] == [
        (DATASOURCE_UID, "prometheus", "http://prometheus:9090", True)]
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "specwatch.yml").read_text())["providers"]
    assert [(p["type"], p["allowUiUpdates"], p["options"]["path"]) for p in providers] == [
        ("file", False, "/var/lib/grafana/dashboards")]


# -- every query against a real Prometheus ----------------------------------------------------


def has_data(result: list[Json]) -> bool:
    """At least one finite value (an instant vector or a matrix): what Grafana would draw."""
    points = [s["value"] for s in result if "value" in s] + [v for s in result for v in s.get("values", [])]
    return any(math.isfinite(float(value)) for _, value in points)


def run(prom: PrometheusServer, expr: str, instant: bool, start: float, end: float) -> list[Json]:
    if instant:
        return prom.query(expr, at=end)
    return prom.query_range(expr, start, end, 5)  # raises PrometheusError naming the query when it fails


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def newest(prom: PrometheusServer, expr: str) -> list[float]:
    return list(prom.values(f"timestamp({expr})").values())


def evaluated_after(prom: PrometheusServer, record: str, ts: float) -> Callable[[], bool]:
    return lambda: min(newest(prom, record), default=0) >= ts


def at_gpu_speed(args: list[str]) -> list[str]:
    i = args.index("--sim-time-scale")
    return [*args[:i + 1], TIME_SCALE, *args[i + 2:]]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("data")
    write_article_workloads(out, lang="en")
    return out


def test_every_panel_query_returns_data(service_factory: Callable[[str, list[str]], Service],
                                        prometheus_factory: Callable[..., PrometheusServer], data: Path,
                                        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    candidate = service_factory("sim", at_gpu_speed(DETAILED_SIM_ARGS))  # the reach panel needs per-step data
    baseline = service_factory("sim", at_gpu_speed(SIM_BASELINE_ARGS))
    # mirror mode: baseline answers, the candidate gets a copy of every request, both are accounted;
    # the admin API on, so that a canary verdict can be pushed as `specwatch canary --push-to` does
    monkeypatch.setenv(DEFAULT_ADMIN_TOKEN_ENV, ADMIN_TOKEN)
    tap = service_factory("exporter", ["--upstream", f"baseline={baseline.url}",
                                       "--upstream", f"candidate={candidate.url}", "--mirror", "candidate",
                                       "--admin-token-env", DEFAULT_ADMIN_TOKEN_ENV])
    # a cost table for the candidate (the best-k panels), loaded as a user does: a file in Prometheus's tuned/
    cost_table = tmp_path / "specwatch-cost.yml"
    write_cost_rules([StepCost("candidate", batch, k, 0.01 * (1 + k * batch / 16)) for batch in (1, 64)
                      for k in range(5)], cost_table)
    prom = prometheus_factory(Targets({"baseline": baseline.url, "candidate": candidate.url}, (tap.url,)),
                              tuned=[cost_table])
    start = time.time()
    wait_for("three targets up", lambda: sorted(prom.values("up").values()) == [1.0, 1.0, 1.0])
    # a verdict pushed before the load, as `specwatch canary --push-to` would, so every scrape in the window has it
    pushed = requests.post(tap.url + "/admin/verdict", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=5,
                           json={"tasks": {"code": {"verdict": "pass", "score": 95.0},
                                           "chat": {"verdict": "fail", "score": 40.0}}})
    assert pushed.status_code == 200, pushed.text
    out = tmp_path / "load"
    code = cli.main(["load", "--target", tap.url, "--task", f"code={data / 'code.jsonl'}",
                     "--task", f"chat={data / 'chat.jsonl'}", "--concurrency", "2", "--requests", "30",
                     "--warmup", "0", "--ignore-eos", "--max-tokens", "64", "--max-seconds", "40", "--out", str(out)])
    assert code == cli.EXIT_OK, (out / "locust.log").read_text()[-2000:]
    # every mirrored copy finished, then a scrape of each target after that, then each rule group after it
    wait_for("the mirrored requests", lambda: len(set(requests_by_variant(tap.url).values())) == 1)
    settled = time.time()
    wait_for("a scrape after the load", lambda: min(newest(prom, "up"), default=0) >= settled)
    last_scrape = max(newest(prom, "up"))
    for record in ("variant_task:specwatch_requests:rate1m", "variant_task:specwatch_requests:rate5m",
                   "variant:vllm_num_requests_running:sum"):
        wait_for(f"{record} evaluated after the last scrape", evaluated_after(prom, record, last_scrape))
    end = time.time()
    assert min(r["start"] for r in map(json.loads, (out / "requests.jsonl").read_text().splitlines())) + 10 < \
        settled, "the load was shorter than two scrape intervals"
    assert end - start < 60, "the load outlasted the 1m window of the live panels"
    empty = []
    count = 0
    for board in boards().values():
        for panel, target in queries(board):
            expr = substitute(target["expr"], math.ceil(end - start))
            count += 1
            if not has_data(run(prom, expr, target["instant"], start, end)):
                empty.append(f"{board['title']} / {panel['title']} [{target['refId']}]: {expr}")
        for var in board["templating"]["list"]:
            if var["type"] == "query":
                found = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
                assert found, var["query"]
                if not prom.values(f"count by ({found[2]}) ({found[1]})"):
                    empty.append(f"{board['title']} / variable {var['name']}")
    assert count > 40
    assert not empty, "no data:\n" + "\n".join(empty)
    # the pushed verdict reads back per task as its index in CANARY_VERDICTS (the panel's value mappings)
    verdicts = prom.values(substitute(canary.pushed_verdict_expr()))
    assert verdicts == {(("task", "code"),): CANARY_VERDICTS.index("pass"),
                        (("task", "chat"),): CANARY_VERDICTS.index("fail")}, verdicts


def test_the_verdict_expression_on_promtool(tmp_path):
    """GO (0) within the thresholds, NO-GO (1) above one, nothing without candidate traffic or numbers. ITL decides
    only where the baseline drafts too (the policy's speculation_vs_speculation): against a baseline that does not
    speculate a longer ITL tail is the bursts speculation delivers."""
    tpot = "task_quantile:specwatch_tpot_seconds:candidate_over_baseline_rate5m"
    itl = "task_quantile:specwatch_itl_seconds:candidate_over_baseline_rate5m"
    requests_rate = "variant_task:specwatch_requests:rate5m"
    drafts = "variant_task:specwatch_draft_tokens:rate5m"
    cases = {"ok": (1.0, 1.19, 1, 0), "slow": (1.11, 1.0, 1, 0), "bursts": (1.0, 1.21, 1, 0),
             "half": ("NaN", 1.0, 1, 0), "quiet": (2.0, 2.0, 0.01, 0), "empty": ("NaN", "NaN", 1, 0),
             "ok-spec": (1.0, 1.19, 1, 5), "stalls-spec": (1.0, 1.21, 1, 5), "half-spec": ("NaN", 1.0, 1, 5)}
    series = []
    for task, (t, i, rps, d) in cases.items():
        series += [{"series": f'{tpot}{{task="{task}",quantile="0.95"}}', "values": f"{t} {t} {t}"},
                   {"series": f'{itl}{{task="{task}",quantile="0.99"}}', "values": f"{i} {i} {i}"},
                   {"series": f'{requests_rate}{{task="{task}",variant="candidate"}}', "values": f"{rps}x2"},
                   {"series": f'{requests_rate}{{task="{task}",variant="baseline"}}', "values": f"{rps}x2"},
                   {"series": f'{drafts}{{task="{task}",variant="baseline"}}', "values": f"{d}x2"}]
    expected = [{"labels": f'{{task="{task}"}}', "value": value}
                for task, value in (("ok", 0), ("slow", 1), ("bursts", 0), ("ok-spec", 0), ("stalls-spec", 1),
                                    ("half-spec", 0))]
    (tmp_path / "empty.yml").write_text("groups: []\n")
    (tmp_path / "verdict.test.yml").write_text(yaml.safe_dump({
        "rule_files": ["empty.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
            {"expr": substitute(canary.verdict_expr(), 60), "eval_time": "1m", "exp_samples": expected}]}]}))
    done = subprocess.run(["promtool", "test", "rules", "verdict.test.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
