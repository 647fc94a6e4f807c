"""promtool on the repository's Prometheus files: config, rules, unit tests, and that those tests bite; the
rule files carry the monitoring settings."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from specwatch import resources
from specwatch.files import EXIT_STALE
from specwatch.monitoring import MONITORING, AlertSetting
from specwatch.promconfig import alerts, rule_tests, rules
from specwatch.promconfig.cost_rules import StepCost, write_cost_rules
from specwatch.promconfig.server import EXPORTER_JOB, VLLM_JOB, Targets, write_layout

REPO = Path(__file__).parents[1]
PROM = resources.PROMETHEUS


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("no promtool on PATH: run the README's test command (`make test`), which installs Debian's "
                    "prometheus package")
    return found


def run(promtool: str, *args: str, cwd: Path = PROM) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_config_and_rules_check(promtool):
    checked = run(promtool, "check", "config", "prometheus.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 rule files found" in checked.stdout
    for path in (PROM / "rules").glob("*.yml"):
        result = run(promtool, "check", "rules", str(path))
        assert result.returncode == 0, result.stdout + result.stderr


def test_the_local_layout_is_the_same_config_with_loopback_targets(promtool, tmp_path):
    config = write_layout(tmp_path, Targets({"baseline": "http://127.0.0.1:8000", "candidate": "http://127.0.0.1:8001"},
                                            ("http://127.0.0.1:9400",)))
    assert config.read_bytes() == (PROM / "prometheus.yml").read_bytes()
    checked = run(promtool, "check", "config", str(config), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    vllm = yaml.safe_load((tmp_path / "targets" / "vllm.yml").read_text())
    assert vllm == [{"targets": ["127.0.0.1:8000"], "labels": {"variant": "baseline"}},
                    {"targets": ["127.0.0.1:8001"], "labels": {"variant": "candidate"}}]


def test_the_local_layout_loads_tuned_rule_files(promtool, tmp_path):
    """A cost table handed to the local layout lands in its tuned/ folder, which prometheus.yml loads."""
    table = tmp_path / "specwatch-cost.yml"
    write_cost_rules([StepCost("candidate", 1, 0, 0.01), StepCost("candidate", 1, 2, 0.012)], table)
    config = write_layout(tmp_path / "config", Targets(), tuned=[table])
    assert (tmp_path / "config" / "tuned" / table.name).read_text() == table.read_text()
    checked = run(promtool, "check", "config", str(config), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "3 rule files found" in checked.stdout
    with pytest.raises(ValueError, match=r"loads only tuned/\*\.yml"):
        write_layout(tmp_path / "other", Targets(), tuned=[tmp_path / "cost.yaml"])


def test_promtool_unit_tests_pass(promtool):
    result = run(promtool, "test", "rules", "tests/recording.test.yml", "tests/alerts.test.yml")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert result.stdout.count("SUCCESS") == 2


def test_generated_files_are_current():
    files = rules.rule_files()
    assert sorted(files) == sorted(p.name for p in (PROM / "rules").glob("*.yml"))
    for name, text in files.items():
        assert (PROM / "rules" / name).read_text() == text, "run `make generate`"
    assert (PROM / "tests" / rule_tests.TESTS_FILE).read_text() == rule_tests.render(), "run `make generate`"


def test_the_rules_generator_writes_and_checks_both_rule_files(tmp_path, capsys):
    assert rules.main(["--out", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [alerts.ALERTS_FILE, rules.RULES_FILE]
    assert rules.main(["--check", "--out", str(tmp_path)]) == 0
    path = tmp_path / alerts.ALERTS_FILE
    path.write_text(path.read_text().replace("for: 15m", "for: 5m"))
    assert rules.main(["--check", "--out", str(tmp_path)]) == EXIT_STALE
    assert f"{alerts.ALERTS_FILE} is not current" in capsys.readouterr().err


def _recording_rules() -> list[dict[str, object]]:
    doc = yaml.safe_load((PROM / "rules" / rules.RULES_FILE).read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _alerts() -> list[dict[str, object]]:
    doc = yaml.safe_load((PROM / "rules" / alerts.ALERTS_FILE).read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_every_recording_rule_has_an_expression_test_and_a_comment():
    tests = yaml.safe_load((PROM / "tests" / rule_tests.TESTS_FILE).read_text())["tests"]
    tested = {re.sub(r"^round\((\S+), .*\)$", r"\1", case["expr"])
              for t in tests for case in t["promql_expr_test"] if case["exp_samples"]}
    records = {str(r["record"]) for r in _recording_rules()}
    assert records - tested == set()
    text = (PROM / "rules" / rules.RULES_FILE).read_text().splitlines()
    for i, line in enumerate(text):
        if line.strip().startswith("- record:"):
            assert text[i - 1].strip().startswith("# "), f"no comment above {line.strip()}"
    # level:metric:operations, no _total after rate()
    for record in records:
        assert re.fullmatch(r"[a-z_]+:[a-z_0-9]+:[a-z_0-9]+", record) and "_total" not in record, record


def _minutes(text: str) -> int:
    match = re.fullmatch(r"(\d+)m", text)
    assert match, text
    return int(match.group(1))


def _runbook_anchors() -> set[str]:
    """GitHub's anchors of the runbook's headings (`### AlertName` -> `alertname`)."""
    path = REPO / MONITORING.alerts.runbook.split("/blob/main/", 1)[1]
    assert path.is_file(), f"no runbook at {path.relative_to(REPO)}, where the alerts' runbook_url points"
    return {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in path.read_text().splitlines() if line.startswith("#")}


def test_every_alert_has_cases_just_before_and_after_its_for_and_links_the_runbook():
    cases: dict[str, list[tuple[int, bool]]] = {}
    for t in yaml.safe_load((PROM / "tests" / "alerts.test.yml").read_text())["tests"]:
        for case in t.get("alert_rule_test", []):
            cases.setdefault(case["alertname"], []).append((_minutes(case["eval_time"]), bool(case["exp_alerts"])))
    anchors = _runbook_anchors()
    for alert in _alerts():
        name = str(alert["alert"])
        for_minutes = _minutes(str(alert["for"]))
        quiet = [t for t, firing in cases.get(name, []) if not firing]
        loud = [t for t, firing in cases.get(name, []) if firing]
        assert quiet and loud, f"{name}: needs a case before its for: and one after"
        # just before and just after: the closest pair is at most two evaluations (the group lag) apart
        assert min(t1 - t0 for t0 in quiet for t1 in loud if t1 > t0) <= 2, name
        assert max(loud) - min(quiet) >= 1 and for_minutes >= 1
        labels = alert["labels"]
        annotations = alert["annotations"]
        assert isinstance(labels, dict) and labels["severity"] in ("warning", "critical"), name
        assert isinstance(annotations, dict) and {"summary", "description", "runbook_url"} <= set(annotations)
        assert annotations["runbook_url"] == \
            f"https://github.com/specwatch/specwatch/blob/main/docs/runbook.md#{name.lower()}", name
        assert name.lower() in anchors, f"docs/runbook.md has no section for {name}"


def _settings() -> list[AlertSetting]:
    return [getattr(MONITORING.alerts, f.name) for f in fields(MONITORING.alerts)
            if isinstance(getattr(MONITORING.alerts, f.name), AlertSetting)]


def test_the_alerts_carry_their_settings():
    """Name, `for:`, severity and threshold of every alert come from specwatch.monitoring, nothing else."""
    by_name = {str(a["alert"]): a for a in _alerts()}
    settings = _settings()
    assert sorted(by_name) == sorted(s.name for s in settings)
    for setting in settings:
        alert = by_name[setting.name]
        assert (alert["for"], alert["labels"]) == (setting.for_, {"severity": setting.severity}), setting.name
        if setting.threshold is not None:
            assert re.search(rf"[<>] {re.escape(f'{setting.threshold:g}')}$", str(alert["expr"]), re.M), setting.name


def test_the_alerts_read_recorded_series_and_the_shared_job_names():
    records = {str(r["record"]) for r in _recording_rules()}
    for alert in _alerts():
        for name in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", str(alert["expr"])):
            assert name in records, f"{alert['alert']}: no recording rule {name}"
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    jobs = MONITORING.jobs
    assert [job["job_name"] for job in config["scrape_configs"]] == [jobs.vllm, jobs.exporter]
    assert (VLLM_JOB, EXPORTER_JOB) == (jobs.vllm, jobs.exporter)
    target_down = next(a for a in _alerts() if a["alert"] == MONITORING.alerts.target_down.name)
    assert f'job=~"{jobs.vllm}|{jobs.exporter}"' in str(target_down["expr"])


def _mutated(tmp_path: Path, file: str, old: str, new: str) -> Path:
    copy = tmp_path / "prometheus"
    shutil.copytree(PROM, copy)
    path = copy / "rules" / file
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))
    return copy


@pytest.mark.parametrize(("file", "old", "new"), [
    # the denominator of the acceptance rate is draft tokens, not drafts
    (rules.RULES_FILE, "variant:vllm_spec_decode_num_accepted_tokens:rate5m\n          /\n"
                       "          (variant:vllm_spec_decode_num_draft_tokens:rate5m > 0)",
     "variant:vllm_spec_decode_num_accepted_tokens:rate5m\n          /\n"
     "          (variant:vllm_spec_decode_num_drafts:rate5m > 0)"),
    # per position over drafts without ignoring(position) matches nothing
    (rules.RULES_FILE, "/ ignoring (position) group_left ()", "/"),
    # a sum over engines forgotten before dividing
    (rules.RULES_FILE, "sum by (variant) (rate(vllm:spec_decode_num_drafts_total[1m]))",
     "max by (variant) (rate(vllm:spec_decode_num_drafts_total[1m]))"),
    # the running batch summed over engines, not per engine: the cost table's row of a bigger batch
    (rules.RULES_FILE, "avg by (variant) (avg_over_time(vllm:num_requests_running[5m]))",
     "sum by (variant) (avg_over_time(vllm:num_requests_running[5m]))"),
    # expected tokens for a k beyond the drafted positions, invented from the positions that exist
    (rules.RULES_FILE, '{position=~"0|1|2|3"}) == 4)', '{position=~"0|1|2|3"}) >= 3)'),
    # an alert that fires before its time
    (alerts.ALERTS_FILE, "for: 15m", "for: 5m"),
    # an alert that ignores the reset-proof recorded ratio and reads lifetime totals
    (alerts.ALERTS_FILE, "variant:vllm_spec_decode_acceptance_rate:ratio_rate5m < 0.1",
     "sum by (variant) (vllm:spec_decode_num_accepted_tokens_total) / sum by (variant) "
     "(vllm:spec_decode_num_draft_tokens_total) < 0.1"),
])
def test_the_unit_tests_catch_a_broken_rule(promtool, tmp_path, file, old, new):
    copy = _mutated(tmp_path, file, old, new)
    result = run(promtool, "test", "rules", "tests/recording.test.yml", "tests/alerts.test.yml", cwd=copy)
    assert result.returncode != 0 and "FAILED" in result.stdout + result.stderr, result.stdout[-2000:]


def test_a_name_no_rule_records_is_refused_where_another_system_would_read_it() -> None:
    """Issue 43: the Argo / Flagger queries name our recording rules through `recorded`, which knows every rule."""
    from specwatch.promconfig.rules import recorded

    assert recorded("variant_task:specwatch_requests:rate5m") == "variant_task:specwatch_requests:rate5m"
    with pytest.raises(KeyError, match="variant_task:specwatch_request:rate5m"):
        recorded("variant_task:specwatch_request:rate5m")
