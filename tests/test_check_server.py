"""`specwatch check-server` as the built-in one-variant plan it is, and the `url` backend it runs on: a server
already running, measured as it is, never started or stopped (the real CPU server's case is in test_real_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from specwatch import cli
from specwatch.config import Home
from specwatch.experiment.plan import PlanError, parse_plan
from tests.conftest import SimServer

PLAN = """
model: m
backend: {backend}
tasks: {{code: article}}
variants: {{ngram: {{speculative_config: {{method: ngram, num_speculative_tokens: 4}}}}}}
"""


def _sums(run: Path, task: str) -> tuple[int, int, int, int]:
    """C, D, R and the output tokens of one task's acceptance pass, summed straight from the saved responses."""
    records = [json.loads(line) for line in (run / "variants" / "ngram" / "acceptance" / f"{task}.jsonl")
               .read_text().splitlines()]
    fields = [r["response"]["metrics"]["speculative_decoding"] for r in records]
    return (sum(f["num_accepted_draft_tokens"] for f in fields), sum(f["num_draft_tokens"] for f in fields),
            sum(f["num_spec_steps"] for f in fields), sum(r["response"]["usage"]["completion_tokens"] for r in records))


def test_check_server_on_a_running_server_is_a_one_variant_study_the_report_reads(
        sim_ngram: SimServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "check"
    code = cli.main(["--home", str(tmp_path / "home"), "check-server", "--url", sim_ngram.url + "/", "--rows", "3",
                     "--max-tokens", "32", "--out", str(run), "--json"])
    out = capsys.readouterr().out
    assert code == cli.EXIT_OK, out
    assert "reconciliation with /metrics counter deltas" in out and "all equal" in out, out
    printed = json.loads(out.strip().splitlines()[-1])
    for task in ("code", "chat"):
        c, d, r, tokens = _sums(run, task)
        assert printed[task]["requests"] == 3 and (printed[task]["C"], printed[task]["D"], printed[task]["R"]) == (
            c, d, r), (task, printed[task])
        assert d > 0 and printed[task]["drafted_token_share"] == c / tokens
    # a study's run folder: its plan (the url backend, one variant, no performance pass) parses as `experiment` would
    plan = parse_plan((run / "plan.yaml").read_text(), run, Home(tmp_path / "home"))
    assert [v.name for v in plan.variants] == ["ngram"] and plan.performance is None
    assert plan.variants[0].backend.kind == "url" and plan.variants[0].backend.url == sim_ngram.url
    reconciliation = json.loads((run / "variants" / "ngram" / "reconciliation.json").read_text())
    assert reconciliation["ok"] and {c["counter"] for c in reconciliation["checks"]} >= {"C", "D", "R"}
    status = json.loads((run / "variants" / "ngram" / "status.json").read_text())
    assert status["state"] == "done" and status["stopped"] == {"external": True, "left_running": sim_ngram.url}
    record = json.loads((run / "run.json").read_text())
    assert "started elsewhere" in record["recovery"]["not_watched"], record["recovery"]
    environment = json.loads((run / "variants" / "ngram" / "environment.json").read_text())
    assert environment["backend"] == {"kind": "url", "url": sim_ngram.url}
    # the flags the plan would pass never reached a server someone else started: not recorded as its argv
    assert environment["command"] == [] and environment["argv"] is None, environment
    assert "--speculative-config" in environment["argv_not_applied"], environment
    # never stopped: the server answers after the check, and the report renders the folder
    assert requests.get(sim_ngram.url + "/health", timeout=5).status_code == 200
    assert cli.main(["--home", str(tmp_path / "home"), "report", str(run)]) == cli.EXIT_OK
    md = (run / "report" / "report.md").read_text()
    assert "One variant, `ngram`: no baseline to compare it with, so no verdict." in md
    assert f"| ngram | code | 3 | {_sums(run, 'code')[0]} |" in md, md


def test_a_server_that_does_not_answer_fails_the_check_and_says_where(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from specwatch.net import free_port

    url = f"http://127.0.0.1:{free_port()}"
    code = cli.main(["--home", str(tmp_path / "home"), "check-server", "--url", url, "--out", str(tmp_path / "c")])
    assert code == cli.EXIT_ERROR
    out = capsys.readouterr().out
    assert "the check did not finish" in out and f"nothing listens at {url}" in out, out


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8000", "http://user:secret@127.0.0.1:8000", "http://h:0",
                                 "http://127.0.0.1:8000/?q=1"])
def test_check_server_refuses_a_url_it_cannot_use(url: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--home", str(tmp_path), "check-server", "--url", url]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--url" in err and "secret" not in err, err


@pytest.mark.parametrize(("backend", "design", "message"), [
    ("{kind: url}", "", "backend.url: the running server's address"),
    ("{kind: sim, url: 'http://127.0.0.1:8000'}", "", "backend.url: the running server's address"),
    ("{kind: url, url: 'http://a:b@127.0.0.1:8000'}", "", "credentials"),
    ("{kind: url, url: 'http://127.0.0.1:8000'}", "design: bracketed", "ngram run on servers already running"),
])
def test_a_plan_on_a_running_server_is_checked_at_parse(backend: str, design: str, message: str,
                                                        tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=message):
        parse_plan(PLAN.format(backend=backend) + design + "\n", tmp_path, Home(tmp_path))


def test_servers_already_running_can_be_measured_in_interleaved_rounds(tmp_path: Path) -> None:
    plan = parse_plan(PLAN.format(backend="{kind: url, url: 'http://127.0.0.1:8000'}"), tmp_path, Home(tmp_path))
    assert plan.design == "interleaved" and plan.variants[0].backend.url == "http://127.0.0.1:8000"
