"""The same dashboards as Perses specs (v0.52 schema): one panel model, two renderers.

The dashboards are described once (`acceptance`, `latency`, `canary`: sections of panels, laid out by
`board`); `board.render` writes them for Grafana, this module for Perses's own libraries (the viewer in
`viewer/`, or a Perses server through `percli apply`). A Grafana panel maps onto the published Perses
plugins: timeseries -> TimeSeriesChart, stat -> StatChart (value mappings kept), barchart -> BarChart
(one bar per series: the query without Grafana's label_join, the legend naming variant, task and the x
label), table -> Table (the label columns), heatmap -> BarChart of the buckets (Perses's heat map wants
native histograms), alertlist -> Table of Prometheus's `ALERTS` series. A section is a Grid layout with
its title; a repeated section repeats over its variable. Units without a Perses equivalent (tok/s,
tok/step, steps/s, ×) become plain decimals with the unit in the panel's name.

`python -m specwatch.grafana.perses` writes `specwatch/data/perses/dashboards/*.json` and an
`index.json` (the viewer's list); `--check` exits 3 when a committed file is not current.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from specwatch import resources
from specwatch.files import EXIT_STALE, write_or_check_folder
from specwatch.grafana import acceptance, canary, latency
from specwatch.grafana.board import Dashboard
from specwatch.grafana.board import render as render_grafana
from specwatch.grafana.panels import Json

PROJECT = "specwatch"
DATASOURCE = "prometheus"
# The stack's Prometheus, as a Perses server would reach it; the viewer replaces it with its own origin,
# where it proxies /api/v1 to whichever Prometheus it was started against.
PROMETHEUS_URL = "http://127.0.0.1:9090"
# Prometheus's scrape interval (specwatch/data/prometheus/prometheus.yml): Perses's smallest query step. Its
# default (1m) would align every range query's end to the minute and hide up to a minute of the newest data.
SCRAPE_INTERVAL = "5s"

# Grafana unit -> (Perses format, the suffix put in the panel's name when Perses has no such unit).
UNITS: dict[str, tuple[Json, str]] = {
    "percentunit": ({"unit": "percent-decimal", "decimalPlaces": 1}, ""),
    "s": ({"unit": "seconds"}, ""),
    "reqps": ({"unit": "requests/sec"}, ""),
    "short": ({"unit": "decimal"}, ""),
    "none": ({"unit": "decimal"}, ""),
    "suffix: tok/s": ({"unit": "decimal"}, "tok/s"),
    "suffix: tok/step": ({"unit": "decimal"}, "tok/step"),
    "suffix: steps/s": ({"unit": "decimal"}, "steps/s"),
    "suffix:×": ({"unit": "decimal"}, "×"),
}
_LABEL_JOIN = re.compile(r'^label_join\((?P<expr>.*), "series", " · ", (?P<labels>"[^)]*")\)$', re.S)
_ALERTS = 'ALERTS{alertstate=~"firing|pending"}'


def _format(panel: Json) -> tuple[Json, str]:
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    fmt, suffix = UNITS[defaults.get("unit", "none")]
    fmt = dict(fmt)
    if "decimals" in defaults:
        fmt["decimalPlaces"] = defaults["decimals"]
    return fmt, suffix


def _query(expr: str, legend: str = "") -> Json:
    spec: Json = {"datasource": {"kind": "PrometheusDatasource", "name": DATASOURCE}, "query": expr}
    if legend and legend != "__auto":
        spec["seriesNameFormat"] = legend
    return {"kind": "TimeSeriesQuery", "spec": {"plugin": {"kind": "PrometheusTimeSeriesQuery", "spec": spec}}}


def _thresholds(defaults: Json) -> Json | None:
    steps = defaults.get("thresholds", {}).get("steps", [])
    if len(steps) < 2:
        return None
    return {"mode": "absolute", "defaultColor": steps[0]["color"],
            "steps": [{"value": s["value"], "color": s["color"]} for s in steps[1:]]}


def _mappings(defaults: Json) -> list[Json]:
    out: list[Json] = []
    for mapping in defaults.get("mappings", []):
        for value, result in sorted(mapping["options"].items(), key=lambda kv: kv[1]["index"]):
            out.append({"kind": "Value", "spec": {"value": value,
                                                  "result": {"value": result["text"], "color": result["color"]}}})
    return out


def _description(panel: Json) -> str:
    """Grafana's description, and what an empty panel means where Grafana would print its `noValue`."""
    text = panel.get("description", "")
    no_value = panel.get("fieldConfig", {}).get("defaults", {}).get("noValue")
    return f"{text} No data: {no_value}." if no_value else text


def _plugin_and_queries(panel: Json, fmt: Json) -> tuple[Json, list[Json]]:
    kind = panel["type"]
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    tgts = panel.get("targets", [])
    if kind == "timeseries":
        spec: Json = {"legend": {"position": "bottom", "mode": "table", "values": ["last-number", "mean", "max"]},
                      "yAxis": {"format": fmt}, "visual": {"display": "line", "lineWidth": 1, "pointRadius": 0,
                                                           "connectNulls": False}}
        for key in ("min", "max"):
            if key in defaults:
                spec["yAxis"][key] = defaults[key]
        thresholds = _thresholds(defaults)
        if thresholds:
            spec["thresholds"] = thresholds
        return {"kind": "TimeSeriesChart", "spec": spec}, [_query(t["expr"], t["legendFormat"]) for t in tgts]
    if kind == "stat":
        spec = {"calculation": "last-number", "format": fmt, "metricLabel": "", "mappings": _mappings(defaults)}
        thresholds = _thresholds(defaults)
        if thresholds:
            spec["thresholds"] = thresholds
        return {"kind": "StatChart", "spec": spec}, [_query(t["expr"], t["legendFormat"]) for t in tgts]
    if kind == "barchart":
        match = _LABEL_JOIN.match(tgts[0]["expr"])
        assert match, f"{panel['title']}: a bar chart's query is label_join(...) (panels.barchart)"
        x_label = panel["options"]["xField"].split("\\")[0]
        series = [label.strip('"') for label in match["labels"].split(", ")]
        legend = " · ".join(f"{{{{{label}}}}}" for label in series) + f" · {x_label} {{{{{x_label}}}}}"
        spec = {"calculation": "last-number", "format": fmt, "sort": "asc", "mode": "value"}
        return {"kind": "BarChart", "spec": spec}, [_query(match["expr"], legend)]
    if kind == "heatmap":
        spec = {"calculation": "last-number", "format": {"unit": "decimal"}, "sort": "asc", "mode": "value"}
        return {"kind": "BarChart", "spec": spec}, [_query(tgts[0]["expr"], "le {{le}}")]
    if kind == "table":
        organize = panel["transformations"][0]["options"]
        columns = [{"name": label, "header": header} for label, header in organize["renameByName"].items()]
        columns += [{"name": name, "hide": True} for name in ("timestamp", "value")]
        return {"kind": "Table", "spec": {"columnSettings": columns}}, [_query(tgts[0]["expr"])]
    if kind == "alertlist":
        columns = [{"name": "alertname", "header": "Alert"}, {"name": "alertstate", "header": "State"},
                   {"name": "severity", "header": "Severity"}, {"name": "task", "header": "Task"},
                   {"name": "timestamp", "hide": True}, {"name": "value", "hide": True}]
        return {"kind": "Table", "spec": {"columnSettings": columns}}, [_query(_ALERTS)]
    raise ValueError(f"no Perses plugin for a Grafana {kind} panel ({panel['title']})")


def panel_spec(panel: Json) -> Json:
    fmt, suffix = _format(panel)
    plugin, queries = _plugin_and_queries(panel, fmt)
    name = f"{panel['title']} ({suffix})" if suffix else panel["title"]
    spec: Json = {"display": {"name": name, "description": _description(panel)}, "plugin": plugin}
    if queries:
        spec["queries"] = queries
    return {"kind": "Panel", "spec": spec}


def _variables(grafana: Json) -> list[Json]:
    """variant, task and model as Perses list variables (multi; All is every value, so a section repeated over
    `task` repeats over each task); the datasource is fixed."""
    out = []
    for var in grafana["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((?P<metric>[^,]+), (?P<label>\w+)\)", var["definition"])
        assert match, var["definition"]
        out.append({"kind": "ListVariable", "spec": {
            "name": var["name"],
            "display": {"name": var["label"], "description": var["description"], "hidden": False},
            "allowAllValue": True, "allowMultiple": True,
            "defaultValue": "$__all", "sort": "alphabetical-asc",
            "plugin": {"kind": "PrometheusLabelValuesVariable", "spec": {
                "datasource": {"kind": "PrometheusDatasource", "name": DATASOURCE},
                "labelName": match["label"], "matchers": [match["metric"]]}}}})
    return out


def render(dashboard: Dashboard) -> Json:
    """The Perses Dashboard resource of `dashboard`, laid out as Grafana lays it out (24 columns)."""
    grafana = render_grafana(dashboard)
    panels: dict[str, Json] = {}
    layouts: list[Json] = []
    top = 0
    for panel in grafana["panels"]:
        if panel["type"] == "row":
            grid: Json = {"display": {"title": panel["title"], "collapse": {"open": True}}, "items": []}
            if panel.get("repeat"):
                grid["repeatVariable"] = panel["repeat"]
            layouts.append({"kind": "Grid", "spec": grid})
            top = panel["gridPos"]["y"] + 1
            continue
        key = f"panel{panel['id']}"
        panels[key] = panel_spec(panel)
        pos = panel["gridPos"]
        layouts[-1]["spec"]["items"].append({"x": pos["x"], "y": pos["y"] - top, "width": pos["w"],
                                             "height": pos["h"], "content": {"$ref": f"#/spec/panels/{key}"}})
    return {
        "kind": "Dashboard",
        "metadata": {"name": dashboard.uid, "project": PROJECT, "version": 0},
        "spec": {
            "display": {"name": dashboard.title, "description": dashboard.description},
            "duration": grafana["time"]["from"].removeprefix("now-"),
            "refreshInterval": grafana["refresh"],
            "datasources": {DATASOURCE: {"default": True, "plugin": {"kind": "PrometheusDatasource", "spec": {
                "directUrl": PROMETHEUS_URL, "scrapeInterval": SCRAPE_INTERVAL}}}},
            "variables": _variables(grafana),
            "panels": panels,
            "layouts": layouts,
        },
    }


def all_dashboards() -> dict[str, Json]:
    """Dashboard name -> its Perses resource, in the viewer's order."""
    boards = [acceptance.dashboard(), latency.dashboard(), canary.dashboard()]
    return {board.uid: render(board) for board in boards}


def dumps(doc: object) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def files() -> dict[str, str]:
    """File name -> text: one file per dashboard and `index.json`, the viewer's tabs (name, title)."""
    boards = all_dashboards()
    out = {f"{name}.json": dumps(board) for name, board in boards.items()}
    out["index.json"] = dumps([{"name": name, "title": board["spec"]["display"]["name"]}
                               for name, board in boards.items()])
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specwatch.grafana.perses", description=__doc__)
    parser.add_argument("--out", type=Path, default=resources.PERSES_DASHBOARDS, help="folder for the JSON files")
    parser.add_argument("--check", action="store_true", help=f"exit {EXIT_STALE} when a committed file is not current")
    args = parser.parse_args(argv)
    how = f"python -m specwatch.grafana.perses --out {args.out}"
    return write_or_check_folder(args.out, files(), args.check, how)


if __name__ == "__main__":
    sys.exit(main())
