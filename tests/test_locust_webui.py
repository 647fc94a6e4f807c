"""Locust's web UI, driven as a person would in headless Chromium: fill the form, start, watch the table, stop.

Locust runs `loadgen/locustfile.py` without --headless against the simulator. The browser sets the users and
ramp-up, and two custom parameters only the UI sets (--results-file, --warmup), so the run's results file and
the table's warm-up rows prove the form's values reached the locustfile. Needs Debian's `chromium`
(/usr/bin/chromium) and the `playwright` package (its own driver; no browser download).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import requests

from specwatch.net import free_port
from specwatch.workloads import write_article_workloads

if TYPE_CHECKING:
    from playwright.sync_api import Page

REPO = Path(__file__).parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
USERS = 4
WARMUP = 2
MAX_TOKENS = 16
STOP_S = 20.0  # Stop until Locust's runner says "stopped" (worst 0.16 s in 55 stops here, beside CPU and disk load)
BUDGET_S = 55.0  # the whole test, Locust's start and shutdown included
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


def table(page: Page) -> dict[tuple[str, str], dict[str, str]]:
    """The statistics table as {(Type, Name): {column header: cell text}}, read from the DOM."""
    headers: list[str] = page.locator("table thead th").all_inner_texts()
    cells: list[list[str]] = page.locator("table tbody tr").evaluate_all(
        "rows => rows.map(r => Array.from(r.cells, c => c.textContent.trim()))")
    named = [dict(zip([" ".join(h.split()) for h in headers], row, strict=False)) for row in cells]
    return {(row.get("Type", ""), row.get("Name", "")): row for row in named}


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


def test_web_ui_starts_runs_and_stops_a_two_task_load(sim_ngram, tmp_path):
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

    data = tmp_path / "data"
    data.mkdir()
    write_article_workloads(data)
    workloads = f"code={data / 'code.jsonl'},chat={data / 'chat.jsonl'}"
    results = tmp_path / "results.jsonl"
    shot = tmp_path / "locust-webui.png"
    log = tmp_path / "locust.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "locust", "-f", str(REPO / "loadgen" / "locustfile.py"),
           "--web-host", "127.0.0.1", "--web-port", str(port), "--host", sim_ngram.url,
           "--workloads", workloads, "--max-tokens", str(MAX_TOKENS),
           "--loglevel", "DEBUG"]  # the runner's "Stopping Greenlet-N" lines: what a slow stop waited for
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for_locust(proc, url, log, min(deadline, time.monotonic() + 20))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, timeout=15_000)
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.set_default_timeout(15_000)
                page.goto(url)

                # the form: what the command line set is shown, what the UI sets is what runs
                expect(page.locator('input[name="host"]')).to_have_value(sim_ngram.url)
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
                wanted = [(kind, name) for name in ("code", "chat") for kind in ("POST", "TTFT")]
                warmups = [("POST", f"{name} warmup") for name in ("code", "chat")]
                rows = table(page)
                while (any(count(rows.get(key), "# Requests") <= 0 for key in wanted)
                       or any(count(rows.get(key), "# Requests") < WARMUP for key in warmups)):
                    if time.monotonic() > deadline - 10:
                        pytest.fail(f"no running rows for {wanted + warmups} in the UI: {rows}\n"
                                    f"{log.read_text()[-3000:]}")
                    page.wait_for_timeout(250)
                    rows = table(page)
                for key in wanted + warmups:
                    assert count(rows[key], "# Fails") == 0, rows[key]
                for key in warmups:  # exactly the UI's --warmup, never more
                    assert count(rows[key], "# Requests") == WARMUP, rows[key]
                assert count(rows.get(("TPOT", "code")), "# Requests") > 0, sorted(rows)

                page.screenshot(path=str(shot), full_page=True)
                png = shot.read_bytes()
                width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
                assert png.startswith(PNG_MAGIC) and len(png) > 20_000, (shot, len(png))
                assert width >= 1280 and height >= 600, (width, height)

                page.get_by_role("button", name="Stop", exact=True).click()
                # Once (2026-12-03, beside the compose tier's image build) the UI showed "cleanup" for 15 s:
                # Locust's own state, read beside the page, says whether the runner or the page was stuck.
                states = runner_states_until_stopped(url, min(deadline - 5, time.monotonic() + STOP_S))
                if states[-1][1] != "stopped":
                    pytest.fail(f"the runner never stopped after Stop: {states}\n{log.read_text()[-4000:]}")
                expect(status).to_have_text(re.compile("stopped", re.I), timeout=10_000)
            except PlaywrightError as exc:
                pytest.fail(f"web UI: {exc}\n{log.read_text()[-3000:]}")
            finally:
                browser.close()
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    # the UI's custom parameters reached the locustfile: its results file, the UI's warm-up count per task
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    for name in ("code", "chat"):
        mine = [r for r in lines if r["task"] == name]
        assert sum(r["warmup"] for r in mine) == WARMUP and len(mine) > WARMUP, (name, len(mine))
    assert all(r["ok"] and 0 < r["completion_tokens"] <= MAX_TOKENS for r in lines), \
        [r for r in lines if not r["ok"]][:3]
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert time.monotonic() - started < 60
