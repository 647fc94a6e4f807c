"""Locust's web UI, driven as a person would in headless Chromium: fill the form, start, watch the tabs, stop.

Locust runs `loadgen/locustfile.py` without --headless against the real exporter in front of the simulator (vLLM's
detailed per-request metrics). The browser sets the users and ramp-up, and two custom parameters only the UI sets
(--results-file, --warmup), so the run's results file and the table's warm-up rows prove the form's values reached
the locustfile. After Stop, what the page shows is checked against the exporter's /metrics at that moment: the
Statistics tab's requests (and nothing else) against the exporter's request count, the LLM latency tab's counts
against the requests, the Acceptance tab's figures against the exporter's counters. A screenshot of each tab is kept
in test-artifacts/locust-webui/ (docs/load.md shows them). Needs Debian's `chromium` (/usr/bin/chromium) and the
`playwright` package (its own driver; no browser download).
"""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

from specwatch import snapshot
from specwatch.net import free_port
from specwatch.workloads import write_article_workloads
from tests.conftest import DETAILED_SIM_ARGS

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = pytest.mark.browser

REPO = Path(__file__).parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
USERS = 4
WARMUP = 2
MAX_TOKENS = 16
STOP_S = 20.0  # Stop until Locust's runner says "stopped" (worst 0.16 s in 55 stops here, beside CPU and disk load)
BUDGET_S = 80.0  # the whole test, Locust's start and shutdown included
ARTIFACTS = REPO / "test-artifacts" / "locust-webui"
TABS = {"Statistics": "statistics.png", "LLM latency": "llm-latency.png", "Acceptance": "acceptance.png"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def runner_states_until_stopped(url: str, until: float) -> list[tuple[float, str]]:
    """(seconds since the call, Locust's state) from its /stats/requests, each change, until "stopped" or
    `until`: a request that got no answer is a state of its own."""
    t0, seen = time.monotonic(), [(0.0, "clicked")]
    while seen[-1][1] != "stopped" and time.monotonic() < until:
        try:
            state = requests.get(url + "/stats/requests", timeout=2).json()["state"]
        except (requests.RequestException, ValueError, KeyError) as exc:
            state = f"no answer ({type(exc).__name__})"
        if state != seen[-1][1]:
            seen.append((round(time.monotonic() - t0, 2), state))
        time.sleep(0.2)
    return seen


def cells(page: Page) -> list[dict[str, str]]:
    """The visible table's rows as {column header: cell text}, read from the DOM."""
    headers: list[str] = page.locator("table thead th").all_inner_texts()
    rows: list[list[str]] = page.locator("table tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells, c => c.textContent.trim()))")
    return [dict(zip([" ".join(h.split()) for h in headers], row, strict=False)) for row in rows]


def table(page: Page) -> dict[tuple[str, str], dict[str, str]]:
    """The statistics table as {(Type, Name): {column header: cell text}}."""
    return {(row.get("Type", ""), row.get("Name", "")): row for row in cells(page)}


def open_tab(page: Page, name: str) -> dict[tuple[str, str], dict[str, str]]:
    """Click the tab, wait for its table to have rows, return them keyed by their first two columns."""
    page.get_by_role("tab", name=name, exact=True).click()
    page.locator("table tbody tr").first.wait_for()
    rows = cells(page)
    first, second = list(rows[0])[:2]
    return {(row[first], row[second]): row for row in rows}


def shoot(page: Page, tab: str) -> None:
    """The tab as the user sees it, kept as a test artefact; a real picture, not an empty page."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / TABS[tab]
    page.screenshot(path=str(shot), full_page=True)
    png = shot.read_bytes()
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert png.startswith(PNG_MAGIC) and len(png) > 20_000, (shot, len(png))
    assert width >= 1280 and height >= 600, (width, height)


def count(row: dict[str, str] | None, column: str) -> int:
    text = (row or {}).get(column, "")
    return int(text) if text.isdigit() else -1


def wait_for_locust(proc: subprocess.Popen[bytes], url: str, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"locust exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(url + "/", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    pytest.fail(f"locust's web UI not up at {url}:\n{log.read_text()[-3000:]}")


def test_web_ui_shows_requests_latencies_and_acceptance_each_where_it_belongs(sim_factory, service_factory,
                                                                              tmp_path):
    started = time.monotonic()
    deadline = started + BUDGET_S
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's browser with "
                    "`apt-get install -y --no-install-recommends chromium` (`make test` does it when absent)")
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import expect, sync_playwright
    except ImportError as exc:
        pytest.fail(f"playwright is not installed ({exc}): `pip install -e '.[dev]'` (pinned in pyproject.toml)")

    sim = sim_factory(DETAILED_SIM_ARGS)
    tap = service_factory("exporter", ["--upstream", f"baseline={sim.url}"])
    data = tmp_path / "data"
    data.mkdir()
    write_article_workloads(data)
    workloads = f"code={data / 'code.jsonl'},chat={data / 'chat.jsonl'}"
    results = tmp_path / "results.jsonl"
    log = tmp_path / "locust.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "locust", "-f", str(REPO / "loadgen" / "locustfile.py"),
           "--web-host", "127.0.0.1", "--web-port", str(port), "--host", tap.url,
           "--workloads", workloads, "--max-tokens", str(MAX_TOKENS),
           "--stop-timeout", "10",  # Stop lets the requests in flight finish (tests/test_finish.py: a cut)
           "--loglevel", "DEBUG"]  # the runner's "Stopping Greenlet-N" lines: what a slow stop waited for
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_locust(proc, url, log, min(deadline, time.monotonic() + 20))
        before = snapshot.take(tap.url)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=15_000)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(15_000)
                page.goto(url)

                # the form: what the command line set is shown, what the UI sets is what runs
                expect(page.locator('input[name="host"]')).to_have_value(tap.url)
                page.locator('input[name="userCount"]').fill(str(USERS))
                page.locator('input[name="spawnRate"]').fill(str(USERS))
                page.get_by_role("button", name="Custom parameters").click()
                expect(page.locator('input[name="workloads"]')).to_have_value(workloads)
                expect(page.locator('input[name="maxTokens"]')).to_have_value(str(MAX_TOKENS))
                page.locator('input[name="resultsFile"]').fill(str(results))
                page.locator('input[name="warmup"]').fill(str(WARMUP))
                page.get_by_role("button", name="Start", exact=True).click()

                status = page.get_by_text("Status", exact=True).locator("..")
                expect(status).to_have_text(re.compile("running", re.I), timeout=15_000)
                expect(page.get_by_role("tab", name="Statistics")).to_be_visible()
                wanted = [("POST", name) for name in ("code", "chat")]
                warmups = [("POST", f"{name} warmup") for name in ("code", "chat")]
                rows = table(page)
                while (any(count(rows.get(key), "# Requests") <= 0 for key in wanted)
                       or any(count(rows.get(key), "# Requests") < WARMUP for key in warmups)):
                    if time.monotonic() > deadline - 25:
                        pytest.fail(f"no running rows for {wanted + warmups} in the UI: {rows}\n"
                                    f"{log.read_text()[-3000:]}")
                    page.wait_for_timeout(250)
                    rows = table(page)
                for key in wanted + warmups:
                    assert count(rows[key], "# Fails") == 0, rows[key]
                for key in warmups:  # exactly the UI's --warmup, never more
                    assert count(rows[key], "# Requests") == WARMUP, rows[key]
                # requests are requests: no TTFT / TPOT / ITL row among them
                assert {kind for kind, _ in rows} == {"POST", ""}, sorted(rows)
                # while it runs, the other two tabs fill in too
                assert {("TTFT", "code"), ("ITL", "chat")} <= set(open_tab(page, "LLM latency"))
                live = open_tab(page, "Acceptance")
                assert {("baseline", "code"), ("baseline", "chat")} <= set(live), live
                assert "s old" in live[("baseline", "code")]["Source"], live

                page.get_by_role("tab", name="Statistics", exact=True).click()
                page.get_by_role("button", name="Stop", exact=True).click()
                # Once (2026-12-03, beside the compose tier's image build) the UI showed "cleanup" for 15 s:
                # Locust's own state, read beside the page, says whether the runner or the page was stuck.
                states = runner_states_until_stopped(url, min(deadline - 5, time.monotonic() + STOP_S))
                if states[-1][1] != "stopped":
                    pytest.fail(f"the runner never stopped after Stop: {states}\n{log.read_text()[-4000:]}")
                expect(status).to_have_text(re.compile("stopped", re.I), timeout=10_000)
                after = snapshot.take(tap.url)  # the exporter when the run has stopped; nothing is sent after

                # what the page shows now, each tab against the exporter at the same moment
                requests_tab = table(page)
                shoot(page, "Statistics")
                latency_tab = open_tab(page, "LLM latency")
                shoot(page, "LLM latency")
                acceptance_tab = open_tab(page, "Acceptance")
                shoot(page, "Acceptance")
            except PlaywrightError as exc:
                pytest.fail(f"web UI: {exc}\n{log.read_text()[-3000:]}")
            finally:
                browser.close()
        # the downloads say the same: the report's section and the two CSVs the Download Data tab links to
        report = requests.get(url + "/stats/report", timeout=10).text
        assert report.count('<section id="specwatch"') == 1 and "specwatch-acceptance" in report, report[-2000:]
        csvs = {key: list(csv.DictReader(io.StringIO(requests.get(f"{url}/specwatch/{key}.csv", timeout=10).text)))
                for key in ("llm-latency", "acceptance")}
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    window = snapshot.diff(before, after)

    def counted(name: str, **labels: str) -> int:
        return round(window.increase(name, **labels))

    lines = [json.loads(line) for line in results.read_text().splitlines()]
    # Statistics: the Aggregated row is the requests, as many as the exporter counted, as many as were sent
    aggregated = count(requests_tab[("", "Aggregated")], "# Requests")
    assert aggregated == counted("specwatch_requests_total") == len(lines) > 2 * WARMUP, (requests_tab, len(lines))
    assert count(requests_tab[("", "Aggregated")], "# Fails") == 0 == counted("specwatch_requests_total") - counted(
        "specwatch_requests_total", outcome="ok")
    for name in ("code", "chat"):
        mine = [r for r in lines if r["task"] == name]
        measured = [r for r in mine if not r["warmup"]]
        # the UI's custom parameters reached the locustfile: its results file, the UI's warm-up count per task
        assert sum(r["warmup"] for r in mine) == WARMUP and len(mine) > WARMUP, (name, len(mine))
        assert count(requests_tab[("POST", name)], "# Requests") == len(measured)
        # LLM latency: one TTFT and one TPOT per measured request, every gap between text chunks
        assert count(latency_tab[("TTFT", name)], "Count") == len(measured), latency_tab
        assert count(latency_tab[("TPOT", name)], "Count") == len([r for r in measured if r["tpot_s"] is not None])
        assert count(latency_tab[("ITL", name)], "Count") == sum(len(r["itl_s"]) for r in measured)
        ttfts = sorted(r["ttft_s"] * 1000 for r in measured)
        assert float(latency_tab[("TTFT", name)]["p50 ms"]) == pytest.approx(
            ttfts[(len(ttfts) + 1) // 2 - 1], rel=0.006)  # nearest rank, in 1 % buckets
        # Acceptance: the exporter's counters over the run, read beside the page
        row = acceptance_tab[("baseline", name)]
        sel = {"variant": "baseline", "task": name}
        c, d, r = (counted(f"specwatch_{f}_total", **sel) for f in ("accepted_tokens", "draft_tokens", "spec_steps"))
        assert (row["Requests ok"], row["Requests failed"]) == (str(len(mine)), "0"), row
        assert (row["C"], row["D"], row["R"]) == (str(c), str(d), str(r)), row
        assert c == sum(x["spec"]["num_accepted_draft_tokens"] for x in mine if x["spec"])  # and the bodies agree
        assert row["Acceptance rate C/D"] == f"{c / d:.3f}"
        assert row["Mean acceptance length 1+C/R"] == f"{1 + c / r:.2f}"
        decode = counted("specwatch_decode_steps_total", **sel)
        assert row["Drafted share of decode steps"] == f"{r / decode:.3f}"
        per_pos = [counted("specwatch_accepted_tokens_per_pos_total", **sel, position=str(i)) for i in range(4)]
        reaching = [counted("specwatch_drafts_reaching_pos_total", **sel, position=str(i)) for i in range(4)]
        assert row["By position, per draft"] == " · ".join(f"{p / r:.3f}" for p in per_pos)
        assert row["By position, of drafts that reached it"] == " · ".join(
            f"{p / n:.3f}" if n else "—" for p, n in zip(per_pos, reaching, strict=True))
        assert tap.url + "/metrics" in row["Source"] and "final" in row["Source"], row
    assert {(r["Metric"], r["Task"]): r["Count"] for r in csvs["llm-latency"]} == {
        key: row["Count"] for key, row in latency_tab.items()}
    assert {(r["Variant"], r["Task"]): r["C"] for r in csvs["acceptance"]} == {
        key: row["C"] for key, row in acceptance_tab.items()}
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert time.monotonic() - started < BUDGET_S + 10
