"""A dashboard from its panels: template variables, grid layout, links between the specwatch dashboards.

Panels come in sections (a row title and its panels); the layout flows each section's panels
left to right in Grafana's 24-column grid. Dashboards are read-only (`editable: false`) and
provisioned with fixed uids; the datasource is a variable defaulting to the provisioned one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specwatch.grafana.panels import DATASOURCE, Json, row

SCHEMA_VERSION = 39  # Grafana 11
DATASOURCE_UID = "specwatch-prometheus"  # specwatch/data/grafana/provisioning/datasources/prometheus.yml
TAG = "specwatch"
GRID_COLUMNS = 24


@dataclass(frozen=True)
class Section:
    title: str
    panels: list[Json]
    repeat: str | None = None  # a template variable: one copy of the section per selected value


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    sections: list[Section] = field(default_factory=list)


def _query_variable(name: str, label: str, query: str, description: str) -> Json:
    return {"type": "query", "name": name, "label": label, "description": description, "datasource": DATASOURCE,
            "definition": query,
            "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "refresh": 2, "regex": "", "sort": 1, "multi": True, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "hide": 0}


def variables() -> list[Json]:
    """datasource, variant, task (from the exporter's series) and model (vLLM's model_name)."""
    return [
        {"type": "datasource", "name": "datasource", "label": "Datasource", "query": "prometheus", "regex": "",
         "current": {"selected": False, "text": "Prometheus", "value": DATASOURCE_UID}, "options": [], "hide": 0,
         "refresh": 1, "description": "The Prometheus that scrapes the exporter and the vLLM servers."},
        _query_variable("variant", "Variant", "label_values(specwatch_requests_total, variant)",
                        "The exporter's routes (baseline, candidate, ...); vLLM targets carry the same label."),
        _query_variable("task", "Task", "label_values(specwatch_requests_total, task)",
                        "Task labels of the exporter (X-Specwatch-Task or its classification rules)."),
        _query_variable("model", "Model", "label_values(vllm:num_requests_running, model_name)",
                        "vLLM's served model name; filters the panels that read raw vLLM series "
                        "(the recorded per-variant figures are summed over models)."),
    ]


def _layout(sections: list[Section]) -> list[Json]:
    panels: list[Json] = []
    y = 0
    next_id = 1
    for section in sections:
        header = row(section.title, section.repeat)
        header["gridPos"]["y"] = y
        header["id"] = next_id
        next_id += 1
        panels.append(header)
        y += 1
        x, line_height = 0, 0
        for panel in section.panels:
            w, h = panel["gridPos"]["w"], panel["gridPos"]["h"]
            if x + w > GRID_COLUMNS:
                x, y, line_height = 0, y + line_height, 0
            panels.append({"id": next_id, **panel, "gridPos": {"h": h, "w": w, "x": x, "y": y}})
            next_id += 1
            x += w
            line_height = max(line_height, h)
        y += line_height
    return panels


def render(dashboard: Dashboard) -> Json:
    """The dashboard JSON Grafana 11 provisions."""
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": [TAG],
        "editable": False,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "weekStart": "",
        "liveNow": False,
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"type": "dashboards", "tags": [TAG], "asDropdown": False, "includeVars": True, "keepTime": True,
                   "title": "specwatch", "icon": "external link", "targetBlank": False, "tooltip": "", "url": ""}],
        "templating": {"list": variables()},
        "panels": _layout(dashboard.sections),
    }
