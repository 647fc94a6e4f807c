"""The monitoring settings: the helpers that turn them into PromQL and prose, and that they reach the outputs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.families import FAMILIES
from specwatch.exporter.metrics import ExporterMetrics
from specwatch.monitoring import MONITORING, AlertSetting, Window, in_words, percent
from specwatch.promconfig import alerts, rules


def test_windows_name_the_recording_rules():
    assert [w.rate for w in MONITORING.windows] == ["rate1m", "rate5m"]
    assert Window("30m").rate == "rate30m"
    groups = [g.name for g in rules.recording_groups()]
    assert groups == ["specwatch.gauges", "specwatch.rate1m", "specwatch.rate5m"]


def test_durations_and_fractions_in_words():
    assert (in_words("1m"), in_words("10m")) == ("a minute", "10 minutes")
    assert (percent(0.1), percent(0.9), percent(0.05)) == ("10 %", "90 %", "5 %")
    with pytest.raises(ValueError, match="duration '90s': expected whole minutes"):
        in_words("90s")


def test_alert_settings():
    collapsed = MONITORING.alerts.acceptance_collapsed
    assert collapsed.level == 0.1
    assert MONITORING.alerts.runbook_url(collapsed) == \
        "https://github.com/specwatch/specwatch/blob/main/docs/runbook.md#specdecodeacceptancecollapsed"
    with pytest.raises(ValueError, match="SpecwatchTargetDown has no threshold"):
        _ = MONITORING.alerts.target_down.level
    with pytest.raises(dataclasses.FrozenInstanceError):
        MONITORING.alerts.kv_cache_full.for_ = "1m"  # type: ignore[misc]


def test_every_alert_setting_is_rendered_once_in_order():
    settings = [v for v in vars(MONITORING.alerts).values() if isinstance(v, AlertSetting)]
    # the canary alerts with the policy's levels (`from_policy`), every other setting as it is
    expected = [alerts.from_policy(s) if s.name in alerts.POLICY_METRICS else s for s in settings]
    assert [rule.setting for rule in alerts.alerting_rules()] == expected
    assert len({s.name for s in settings}) == len(settings)


def test_a_changed_setting_reaches_the_alerts(monkeypatch: pytest.MonkeyPatch) -> None:
    changed = dataclasses.replace(MONITORING.alerts, kv_cache_full=AlertSetting("VLLMKVCacheNearFull", 0.8, "7m",
                                                                                "critical"))
    monkeypatch.setattr(alerts, "A", changed)
    text = alerts.render()
    assert "variant:vllm_kv_cache_usage_perc:max > 0.8\n        for: 7m\n        labels:\n" \
           "          severity: critical\n" in text
    assert "above 80 %." in text


def test_every_exporter_family_is_named_once_and_emitted_by_that_name() -> None:
    """Issue 43: the exporter's family names live in `specwatch.exporter.families`; the emitter declares each family
    from there and every reader takes its name from there. What the emitter exposes is exactly that list (a family
    spelled anew in the emitter, or a name in the list no family carries, fails here)."""
    registry = CollectorRegistry()
    ExporterMetrics(registry, ExporterConfig(upstreams={"baseline": "http://127.0.0.1:8000"}))
    exposed = {f.name + ("_total" if f.type == "counter" else "") for f in registry.collect()}
    assert exposed == set(FAMILIES.names()), (exposed ^ set(FAMILIES.names()))
    assert MONITORING.exporter is not None and MONITORING.exporter.names() == FAMILIES.names()
    # and no module of the package spells one but the list itself (the generators of rule tests excepted: their
    # fixtures are expositions written out, a reader's view of the wire)
    package = Path(__file__).resolve().parents[1] / "specwatch"
    spelled = {str(p.relative_to(package)) for p in package.rglob("*.py")
               if p.name != "families.py" and any(f'"{name}"' in p.read_text() for name in FAMILIES.names())}
    assert spelled <= {"promconfig/rule_tests.py"}, spelled
