"""The key dashboard panels a study report plots over its run, with the queries taken from the dashboards.

A study sends its load straight to each variant's server (no exporter in the path), so the key
panels are the server-side ones: acceptance, drafting, TPOT / ITL quantiles, output throughput and
KV cache usage. Their PromQL is read out of the generated dashboards, never retyped, so the
report's curves are what the Grafana panels show for the same time range; `substitute` fills the
template variables the way Grafana does with every filter on `All`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specwatch.grafana import acceptance, latency
from specwatch.grafana.board import Dashboard

# (dashboard uid, panel title) in the order the report shows them.
KEY_PANELS: tuple[tuple[str, str], ...] = (
    (acceptance.UID, "Server acceptance rate"),
    (acceptance.UID, "Server mean acceptance length"),
    (acceptance.UID, "Draft and accepted tokens per second"),
    (latency.UID, "TPOT p50 / p95 / p99 (server side)"),
    (latency.UID, "ITL p50 / p95 / p99 (server side)"),
    (latency.UID, "Output tokens per second"),
    (latency.UID, "KV cache usage"),
)


@dataclass(frozen=True)
class KeyQuery:
    dashboard: str                          # the dashboard's uid
    panel: str                              # the panel's title
    unit: str                               # Grafana's unit id of the panel
    exprs: tuple[tuple[str, str], ...]      # (PromQL with Grafana's variables, legend format) per target


def substitute(expr: str, range_seconds: int = 300, rate_interval: str = "1m") -> str:
    """Grafana's variables as a dashboard with every filter on `All` sends them."""
    values = {"variant": ".*", "task": ".*", "model": ".*", "__rate_interval": rate_interval, "__interval": "15s",
              "__range": f"{range_seconds}s", "__range_s": str(range_seconds)}
    return re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], expr)


def legend(fmt: str, labels: dict[str, str]) -> str:
    """A series name from Grafana's legend format (`{{variant}} ...`), the way Grafana fills it."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip()


def _boards() -> dict[str, Dashboard]:
    return {board.uid: board for board in (acceptance.dashboard(), latency.dashboard())}


def key_queries() -> list[KeyQuery]:
    """The key panels' queries, exactly as the dashboards carry them; a renamed panel is an error here."""
    boards = _boards()
    found = []
    for uid, title in KEY_PANELS:
        panels = [p for s in boards[uid].sections for p in s.panels if p.get("title") == title]
        if len(panels) != 1:
            raise LookupError(f"dashboard {uid}: expected one panel titled {title!r}, found {len(panels)}")
        panel = panels[0]
        found.append(KeyQuery(uid, title, panel["fieldConfig"]["defaults"]["unit"],
                              tuple((t["expr"], t["legendFormat"]) for t in panel["targets"])))
    return found
