"""Panel and target builders: one function per Grafana panel type, units and thresholds as constants.

Every target names the datasource through the `${datasource}` variable; every panel carries a
`description` saying how to read it and a unit (`fieldConfig.defaults.unit`). Selectors shared by
all dashboards live here too, so the panels filter by the same variables the same way.
"""

from __future__ import annotations

from typing import Any

Json = dict[str, Any]

DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}

# Label matchers for the template variables (the all value is the regex `.*`).
VT = 'variant=~"$variant",task=~"$task"'
V = 'variant=~"$variant"'
T = 'task=~"$task"'
VM = 'variant=~"$variant",model_name=~"$model"'
BY_VT = "{{variant}} · {{task}}"  # the legend of per-variant-and-task series

# Units (Grafana unit ids; `suffix:` is Grafana's custom-suffix unit).
RATIO = "percentunit"
SECONDS = "s"
TOKENS_PER_S = "suffix: tok/s"
TOKENS_PER_STEP = "suffix: tok/step"
STEPS_PER_S = "suffix: steps/s"
REQ_PER_S = "reqps"
TIMES = "suffix:×"
COUNT = "short"
NONE = "none"

GREEN, ORANGE, RED, BLUE = "green", "orange", "red", "blue"


def thresholds(base: str, *steps: tuple[float, str]) -> Json:
    """Absolute thresholds: `base` colour below the first step, then each (value, colour)."""
    return {"mode": "absolute",
            "steps": [{"color": base, "value": None}, *({"color": c, "value": v} for v, c in steps)]}


def target(expr: str, legend: str = "", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> Json:
    return {"datasource": DATASOURCE, "editorMode": "code", "expr": expr, "format": fmt, "instant": instant,
            "range": not instant, "legendFormat": legend or "__auto", "refId": ref}


def targets(*pairs: tuple[str, str]) -> list[Json]:
    """Range targets from (expr, legend) pairs, refIds A, B, ..."""
    return [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def per_variant_task(record: str) -> list[Json]:
    """The range target of a `variant_task:` recording rule (`record`: the rest of its name), one series per variant
    and task, filtered by both variables."""
    return targets((f"variant_task:{record}{{{VT}}}", BY_VT))


def _base(kind: str, title: str, description: str, tgts: list[Json], unit: str, w: int, h: int) -> Json:
    return {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
            "gridPos": {"h": h, "w": w, "x": 0, "y": 0}, "targets": tgts,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}, "options": {}}


def timeseries(title: str, description: str, tgts: list[Json], unit: str, *, w: int = 12, h: int = 8,
               min_: float | None = None, max_: float | None = None, steps: Json | None = None,
               decimals: int | None = None) -> Json:
    """A time series; thresholds, when given, are drawn as dashed lines."""
    panel = _base("timeseries", title, description, tgts, unit, w, h)
    defaults = panel["fieldConfig"]["defaults"]
    defaults.update({"color": {"mode": "palette-classic"},
                     "custom": {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 0, "showPoints": "never",
                                "spanNulls": False, "axisSoftMin": 0,
                                "thresholdsStyle": {"mode": "dashed" if steps else "off"}},
                     "thresholds": steps or thresholds(GREEN)})
    for key, value in (("min", min_), ("max", max_), ("decimals", decimals)):
        if value is not None:
            defaults[key] = value
    panel["options"] = {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                                   "calcs": ["lastNotNull", "mean", "max"]},
                        "tooltip": {"mode": "multi", "sort": "desc"}}
    return panel


def stat(title: str, description: str, tgts: list[Json], unit: str, *, w: int = 6, h: int = 6,
         steps: Json | None = None, mappings: list[Json] | None = None, no_value: str | None = None,
         decimals: int | None = None) -> Json:
    """The last value of each series, coloured by thresholds (or value mappings)."""
    panel = _base("stat", title, description, tgts, unit, w, h)
    defaults = panel["fieldConfig"]["defaults"]
    defaults.update({"color": {"mode": "thresholds"}, "thresholds": steps or thresholds(BLUE),
                     "mappings": mappings or []})
    if no_value is not None:
        defaults["noValue"] = no_value
    if decimals is not None:
        defaults["decimals"] = decimals
    panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                        "colorMode": "background", "graphMode": "none", "justifyMode": "auto",
                        "orientation": "auto", "textMode": "value_and_name", "wideLayout": True,
                        "showPercentChange": False}
    return panel


def barchart(title: str, description: str, expr: str, x_label: str, series_labels: tuple[str, ...], unit: str,
             *, w: int = 12, h: int = 8, max_: float | None = None) -> Json:
    """Bars by `x_label` (position, accepted ...), one bar colour per series.

    An instant table query; the series labels are joined into one `series` label and
    `groupingToMatrix` turns the rows into one column per series, keyed by `x_label`.
    """
    labels = ", ".join(f'"{label}"' for label in series_labels)
    joined = f'label_join({expr}, "series", " · ", {labels})'
    panel = _base("barchart", title, description, [target(joined, instant=True, fmt="table")], unit, w, h)
    defaults = panel["fieldConfig"]["defaults"]
    defaults.update({"color": {"mode": "palette-classic"}, "min": 0, "thresholds": thresholds(GREEN),
                     "custom": {"fillOpacity": 80, "lineWidth": 1, "gradientMode": "none"}})
    if max_ is not None:
        defaults["max"] = max_
    x_field = f"{x_label}\\series"
    panel["transformations"] = [
        {"id": "groupingToMatrix", "options": {"columnField": "series", "rowField": x_label, "valueField": "Value",
                                               "emptyValue": "null"}},
        {"id": "sortBy", "options": {"sort": [{"field": x_field, "desc": False}]}},
    ]
    panel["options"] = {"xField": x_field, "orientation": "vertical", "showValue": "auto", "stacking": "none",
                        "groupWidth": 0.7, "barWidth": 0.9, "xTickLabelRotation": 0,
                        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                        "tooltip": {"mode": "multi", "sort": "none"}}
    return panel


def heatmap(title: str, description: str, expr: str, y_unit: str, *, w: int = 12, h: int = 8) -> Json:
    """A pre-bucketed heatmap from a histogram's `_bucket` series (`le` rows)."""
    panel = _base("heatmap", title, description, [target(expr, "{{le}}", fmt="heatmap")], COUNT, w, h)
    panel["options"] = {"calculate": False, "cellGap": 1, "rowsFrame": {"layout": "le"},
                        "yAxis": {"axisPlacement": "left", "unit": y_unit, "reverse": False},
                        "color": {"mode": "scheme", "scheme": "Oranges", "fill": "dark-orange", "scale": "exponential",
                                  "exponent": 0.5, "steps": 64, "reverse": False},
                        "cellValues": {"unit": COUNT}, "filterValues": {"le": 1e-9}, "showValue": "never",
                        "legend": {"show": True},
                        "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False}}
    return panel


def table(title: str, description: str, expr: str, columns: dict[str, str], *, w: int = 12, h: int = 8) -> Json:
    """An instant query's labels as a table: `columns` maps label -> header, in order; the rest is hidden."""
    panel = _base("table", title, description, [target(expr, instant=True, fmt="table")], NONE, w, h)
    order = {label: i for i, label in enumerate(columns)}
    panel["transformations"] = [{"id": "organize", "options": {
        "excludeByName": {"Time": True, "Value": True}, "indexByName": order, "renameByName": columns}}]
    panel["options"] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    return panel


def alertlist(title: str, description: str, *, w: int = 12, h: int = 8) -> Json:
    """Grafana's alert list (needs no query): firing and pending rules, the datasource's included."""
    panel = {"type": "alertlist", "title": title, "description": description,
             "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
             "options": {"viewMode": "list", "groupMode": "default", "groupBy": [], "maxItems": 20, "sortOrder": 1,
                         "dashboardAlerts": False, "alertName": "", "alertInstanceLabelFilter": "", "folder": None,
                         "showInstances": True,
                         "stateFilter": {"firing": True, "pending": True, "noData": False, "normal": False,
                                         "error": True}}}
    return panel


def row(title: str, repeat: str | None = None) -> Json:
    panel: Json = {"type": "row", "title": title, "collapsed": False, "panels": [],
                   "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0}}
    if repeat:
        panel["repeat"] = repeat
    return panel
