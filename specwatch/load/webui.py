"""The locustfile's two tabs in Locust's web UI, its reports and its CSVs: LLM latency and Acceptance.

Locust's request statistics hold HTTP requests only; TTFT, TPOT and ITL go to a `LatencyBook` (specwatch/load/
latency.py) and the exporter's figures to an `AcceptanceView` (specwatch/load/acceptance_tab.py). Both reach the
user through Locust's supported extension points (its `extend_web_ui` example): `extended_tabs` / `extended_tables`
/ `extended_csv_files` in the web UI's template arguments, rows added to `GET /stats/requests` as
`extended_stats`, two CSV routes, a section added to the HTML report (`/stats/report`, and the `--html` file once
Locust has written it), and `PREFIX_llm_latency.csv` / `PREFIX_acceptance.csv` beside Locust's own `--csv` files.

Distributed: each worker sends the latencies recorded since its last report with Locust's own report
(`report_to_master`, every 3 s and once more when it stops); the master adds them up (`worker_report`) and is
the one that reads the exporter. Both are cleared when a run starts and when the statistics are reset.
"""

from __future__ import annotations

import csv
import html
import io
import json
from pathlib import Path
from typing import Any

from flask import Blueprint, Response, make_response, request
from locust import events
from locust.env import Environment
from locust.runners import STATE_STOPPED, MasterRunner, WorkerRunner

from specwatch.load.acceptance_tab import COLUMNS as ACCEPTANCE_COLUMNS
from specwatch.load.acceptance_tab import AcceptanceView
from specwatch.load.latency import PERCENTILES, LatencyBook

LATENCY_KEY = "llm-latency"
ACCEPTANCE_KEY = "acceptance"
MESSAGE_KEY = "specwatch_latency"  # our part of a worker's report to its master
LATENCY_COLUMNS = (("metric", "Metric"), ("task", "Task"), ("count", "Count"),
                   *((f"p{p}", f"p{p} ms") for p in PERCENTILES), ("mean", "Mean ms"), ("max", "Max ms"))
TABS = [{"title": "LLM latency", "key": LATENCY_KEY}, {"title": "Acceptance", "key": ACCEPTANCE_KEY}]
CSV_ROUTES = {LATENCY_KEY: "specwatch/llm-latency.csv", ACCEPTANCE_KEY: "specwatch/acceptance.csv"}
CSV_SUFFIX = {LATENCY_KEY: "_llm_latency.csv", ACCEPTANCE_KEY: "_acceptance.csv"}

BOOK = LatencyBook()
VIEW = AcceptanceView(None)
TRACKING = False  # whether this process reads the exporter (master or standalone, with a UI or a report to write)


def record(metric: str, task: str, seconds: float) -> None:
    BOOK.record(metric, task, seconds)


def exporter_metrics_url(option: str, host: str | None) -> str | None:
    """`--exporter-metrics`: a URL, "none", or empty for the target's own `/metrics` (the exporter, as Locust
    runs against it in the stack)."""
    if option.strip().lower() == "none":
        return None
    if option.strip():
        return option.strip()
    return host.rstrip("/") + "/metrics" if host else None


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def latency_rows() -> list[dict[str, str]]:
    return [{key: str(row[key]) if key in ("metric", "task", "count") else _ms(row[key])
             for key, _ in LATENCY_COLUMNS} for row in BOOK.rows()]


def acceptance_rows(environment: Environment) -> list[dict[str, str]]:
    """The tab's rows, the exporter re-read if the last read is old; once the run has stopped, one last read and
    then the figures stay (the page stops polling then, so the last answer it gets must be the run's)."""
    runner = environment.runner
    if runner is not None and runner.state == STATE_STOPPED:
        VIEW.finish()
    else:
        VIEW.refresh()
    return VIEW.rows()


def tables(environment: Environment) -> dict[str, tuple[tuple[tuple[str, str], ...], list[dict[str, str]]]]:
    return {LATENCY_KEY: (LATENCY_COLUMNS, latency_rows()),
            ACCEPTANCE_KEY: (ACCEPTANCE_COLUMNS, acceptance_rows(environment))}


def csv_text(columns: tuple[tuple[str, str], ...], rows: list[dict[str, str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([title for _, title in columns])
    writer.writerows([row.get(key, "") for key, _ in columns] for row in rows)
    return out.getvalue()


def report_section(environment: Environment) -> str:
    """Both tables as plain HTML, for the end of Locust's HTML report."""
    parts = ['<section id="specwatch" style="font-family: sans-serif; margin: 24px; font-size: 14px">']
    for (key, (columns, rows)), tab in zip(tables(environment).items(), TABS, strict=True):
        parts.append(f'<h2 id="specwatch-{key}">{html.escape(tab["title"])}</h2>')
        parts.append(f'<table class="specwatch-{key}" border="1" cellpadding="4" style="border-collapse: collapse">'
                     "<thead><tr>" + "".join(f"<th>{html.escape(t)}</th>" for _, t in columns) + "</tr></thead>"
                     "<tbody>" + "".join("<tr>" + "".join(f"<td>{html.escape(row.get(k, ''))}</td>" for k, _ in columns)
                                         + "</tr>" for row in rows) + "</tbody></table>")
    parts.append("</section>")
    return "".join(parts)


def add_section(page: str, section: str) -> str:
    head, found, tail = page.rpartition("</body>")
    return head + section + found + tail if found else page + section


def _start(environment: Environment) -> None:
    BOOK.clear()
    if TRACKING:
        options = environment.parsed_options
        VIEW.url = exporter_metrics_url(getattr(options, "exporter_metrics", "") or "", environment.host)
        VIEW.start()  # before the first request leaves: the window must hold all of this run's


@events.init.add_listener
def _on_init(environment: Environment, **_: Any) -> None:
    global TRACKING
    runner = environment.runner
    if isinstance(runner, WorkerRunner):
        environment.events.report_to_master.add_listener(lambda data, **_: data.__setitem__(MESSAGE_KEY, BOOK.take()))
        environment.events.test_start.add_listener(lambda **_: BOOK.clear())
        return
    if isinstance(runner, MasterRunner):
        environment.events.worker_report.add_listener(lambda data, **_: BOOK.merge(data.get(MESSAGE_KEY)))
    options = environment.parsed_options
    TRACKING = environment.web_ui is not None or bool(options and (options.csv_prefix or options.html_file))
    environment.events.test_start.add_listener(lambda **_: _start(environment))
    environment.events.reset_stats.add_listener(lambda **_: _start(environment))
    environment.events.test_stop.add_listener(lambda **_: VIEW.finish())
    environment.events.quit.add_listener(lambda **_: _write_files(environment))
    if environment.web_ui is not None:
        _extend_web_ui(environment)


def _extend_web_ui(environment: Environment) -> None:
    web_ui = environment.web_ui
    assert web_ui is not None and web_ui.app is not None
    app = web_ui.app
    web_ui.template_args["extended_tabs"] = TABS
    web_ui.template_args["extended_tables"] = [
        {"key": key, "structure": [{"key": k, "title": t} for k, t in columns]}
        for key, columns in ((LATENCY_KEY, LATENCY_COLUMNS), (ACCEPTANCE_KEY, ACCEPTANCE_COLUMNS))]
    web_ui.template_args["extended_csv_files"] = [
        {"href": "./" + CSV_ROUTES[LATENCY_KEY], "title": "Download LLM latency CSV (TTFT, TPOT, ITL per task)"},
        {"href": "./" + CSV_ROUTES[ACCEPTANCE_KEY], "title": "Download acceptance CSV (the exporter, this run)"}]

    @app.after_request
    def _extend(response: Response) -> Response:
        if request.endpoint == "locust.request_stats" and response.status_code == 200:
            data = response.get_json()
            data["extended_stats"] = [{"key": key, "data": rows} for key, (_, rows) in tables(environment).items()]
            response.set_data(json.dumps(data))
        elif request.endpoint == "locust.stats_report" and response.status_code == 200:
            response.set_data(add_section(response.get_data(as_text=True), report_section(environment)))
        return response

    base = getattr(environment.parsed_options, "web_base_path", None) or None
    blueprint = Blueprint("specwatch", __name__, url_prefix=base)
    for key, route in CSV_ROUTES.items():
        def download(key: str = key) -> Response:
            columns, rows = tables(environment)[key]
            answer = make_response(csv_text(columns, rows))
            answer.headers["Content-Type"] = "text/csv"
            answer.headers["Content-Disposition"] = f"attachment;filename={Path(CSV_ROUTES[key]).name}"
            return answer
        blueprint.add_url_rule("/" + route, f"csv_{key}", web_ui.auth_required_if_enabled(download))
    app.register_blueprint(blueprint)


def _write_files(environment: Environment) -> None:
    """Headless: the CSVs beside Locust's, and the HTML report (written by Locust before `quit`) completed."""
    options = environment.parsed_options
    if options is None or not TRACKING:
        return
    VIEW.finish()
    if options.csv_prefix:
        for key, (columns, rows) in tables(environment).items():
            Path(options.csv_prefix + CSV_SUFFIX[key]).write_text(csv_text(columns, rows))
    if options.html_file and Path(options.html_file).exists():
        page = Path(options.html_file)
        page.write_text(add_section(page.read_text(encoding="utf-8"), report_section(environment)),
                        encoding="utf-8")
