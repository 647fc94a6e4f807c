"""The `specwatch` command's table of verbs: every verb's --help, unknown verbs, verbs that parse their own argv."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch import cli

NESTED = {"vllm-cpu": ("setup", "serve", "capture", "capture-url"), "models": ("build",), "images": ("base", "build")}


@pytest.mark.parametrize("verb", list(cli.VERBS))
def test_every_verb_in_the_table_has_help_exiting_0(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([verb, "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: specwatch {verb}")
    for action in NESTED.get(verb, ()):
        with pytest.raises(SystemExit) as exit_:
            cli.main([verb, action, "--help"])
        assert exit_.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: specwatch {verb} {action}")


@pytest.mark.parametrize("verb", list(cli.VERBS))
def test_every_verb_module_exposes_its_parser_and_run(verb: str) -> None:
    entry = cli.VERBS[verb]
    module = importlib.import_module(entry.module)
    assert module.__doc__ and module.__doc__.strip(), entry.module
    names = ("main",) if entry.own_argv else ("add_arguments", "run")
    assert all(callable(getattr(module, name, None)) for name in names), (verb, entry.module, names)


def test_the_top_level_help_lists_every_verb_with_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name, verb in cli.VERBS.items():
        assert f"  {name} " in out and verb.help in out, name


def test_an_unknown_verb_exits_2_with_a_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--home", "/nonexistent", "frobnicate", "--flag"])
    assert exit_.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "invalid choice: 'frobnicate'" in err and "'experiment'" in err
    with pytest.raises(SystemExit) as exit_:
        cli.main([])
    assert exit_.value.code == cli.EXIT_USAGE and "required: VERB" in capsys.readouterr().err


def test_an_unknown_verb_exits_2_from_the_command_line_too() -> None:
    done = subprocess.run([sys.executable, "-m", "specwatch.cli", "frobnicate"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "specwatch: error: argument VERB: invalid choice: 'frobnicate'" in done.stderr


def test_an_own_argv_verb_gets_every_argument_after_its_name(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    # leading options reach the simulator's own parser, which refuses them as `vllm serve` would
    code = cli.main(["--home", str(tmp_path), "sim", "--per-request-spec-decode-metrics", "summary", "m"])
    assert code == 2
    assert "specwatch sim:" in capsys.readouterr().err


def test_a_usage_error_inside_a_verb_names_the_verb(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--home", str(tmp_path), "load", "--target", "http://127.0.0.1:1"])
    assert exit_.value.code == cli.EXIT_USAGE
    assert "specwatch load: error: the following arguments are required: --task, --out" in capsys.readouterr().err
    assert cli.main(["--home", str(tmp_path), "up", "--backend", "urls", "--url", "nourl"]) == cli.EXIT_USAGE
    assert "specwatch up: --url 'nourl': expected VARIANT=URL" in capsys.readouterr().err


def test_a_runtime_failure_in_a_verb_exits_1_with_its_message(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--home", str(tmp_path), "diff", str(tmp_path / "a.prom"), str(tmp_path / "b.prom")])
    assert code == cli.EXIT_ERROR
    assert capsys.readouterr().err.startswith("specwatch diff: ")
