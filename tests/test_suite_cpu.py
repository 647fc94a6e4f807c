"""bench/suite_cpu.py, the plugin that measures the suite's budget per tier (docs/tests.md), run as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"

TESTS = '''
import time
import pytest

def test_burns_half_a_second():
    end = time.process_time() + 0.5
    while time.process_time() < end:
        pass

@pytest.mark.servers
def test_waits_half_a_second():
    time.sleep(0.5)
'''


def test_each_test_gets_its_tier_its_wall_and_the_machines_busy_cpu(tmp_path: Path) -> None:
    (tmp_path / "test_two.py").write_text(TESTS)
    out = tmp_path / "suite"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_cpu",
                          f"--suite-cpu={out}", "test_two.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(BENCH), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stdout + run.stderr
    got = json.loads(out.with_suffix(".json").read_text())
    rows = {r["nodeid"].split("::")[1]: r for r in got["tests"]}
    burn, wait = rows["test_burns_half_a_second"], rows["test_waits_half_a_second"]
    assert (burn["tier"], wait["tier"]) == ("unit", "servers")
    assert burn["wall_s"] >= 0.5 and wait["wall_s"] >= 0.5
    assert burn["busy_cpu_s"] >= 0.45  # its own half second at least, whatever else the machine did
    assert got["busy_cpu_s"] >= burn["busy_cpu_s"] + wait["busy_cpu_s"] - 0.02  # the session holds its tests
    md = out.with_suffix(".md").read_text()
    assert "| unit | 1 |" in md and "| servers | 1 |" in md and "takes at least" in md
