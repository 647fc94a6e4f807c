"""The Perses dashboards: generated from the same panels as the Grafana JSON, committed, and complete.

Every Grafana panel has its Perses panel with the same title (a unit Perses lacks goes into the name), the
same queries (bar charts without Grafana's label_join), and a place in a Grid layout; the variables are
Perses list variables over the same label values. Drawing them is tests/test_viewer_browser.py's job.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specwatch import resources
from specwatch.grafana import dashboards, perses

COMMITTED = resources.PERSES_DASHBOARDS


def test_the_committed_specs_equal_a_fresh_generation() -> None:
    assert perses.main(["--check", "--out", str(COMMITTED)]) == 0, "run `make generate`"


def test_check_exits_3_on_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert perses.main(["--out", str(tmp_path)]) == 0
    path = tmp_path / "specwatch-canary.json"
    path.write_text(path.read_text().replace("Current verdict", "Verdict"))
    assert perses.main(["--check", "--out", str(tmp_path)]) == perses.EXIT_STALE
    assert "specwatch-canary.json is not current" in capsys.readouterr().err


def test_every_grafana_panel_has_its_perses_panel_with_the_same_queries() -> None:
    grafana = dashboards.all_dashboards()
    index = json.loads((COMMITTED / "index.json").read_text())
    assert [d["name"] for d in index] == [name.removesuffix(".json") for name in grafana]
    for file, board in grafana.items():
        spec = json.loads((COMMITTED / file).read_text())["spec"]
        panels = spec["panels"]
        wanted = [p for p in board["panels"] if p["type"] != "row"]
        assert len(panels) == len(wanted), file
        for panel in wanted:
            got = panels[f"panel{panel['id']}"]["spec"]
            assert got["display"]["name"].startswith(panel["title"]), (file, panel["title"])
            queries = [q["spec"]["plugin"]["spec"]["query"] for q in got.get("queries", [])]
            exprs = [t["expr"] for t in panel.get("targets", [])]
            if panel["type"] == "barchart":
                exprs = [re.sub(r'^label_join\((.*), "series", .*\)$', r"\1", e, flags=re.S) for e in exprs]
            if panel["type"] == "alertlist":
                exprs = ['ALERTS{alertstate=~"firing|pending"}']
            assert queries == exprs, (file, panel["title"])
        refs = {item["content"]["$ref"].rsplit("/", 1)[1] for layout in spec["layouts"]
                for item in layout["spec"]["items"]}
        assert refs == set(panels), file
        for layout in spec["layouts"]:
            for item in layout["spec"]["items"]:
                assert 0 <= item["x"] and item["x"] + item["width"] <= 24 and item["y"] >= 0, (file, item)


def test_variables_and_the_one_datasource() -> None:
    for file in dashboards.all_dashboards():
        spec = json.loads((COMMITTED / file).read_text())["spec"]
        names = [v["spec"]["name"] for v in spec["variables"]]
        assert names == ["variant", "task", "model"], file
        for var in spec["variables"]:
            assert var["kind"] == "ListVariable" and var["spec"]["allowMultiple"] and var["spec"]["allowAllValue"]
            assert var["spec"]["plugin"]["kind"] == "PrometheusLabelValuesVariable"
        source = spec["datasources"][perses.DATASOURCE]
        assert source["default"] and source["plugin"]["kind"] == "PrometheusDatasource"


def test_the_scrape_interval_is_prometheus_s() -> None:
    config = resources.PROMETHEUS_CONFIG.read_text()
    assert re.search(rf"scrape_interval:\s*{perses.SCRAPE_INTERVAL}\b", config)
