"""The `sim` backend: `python -m specwatch.cli sim ...`, the vLLM 0.32.0 simulator, as a process group."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from specwatch.backends.base import HealthCheck, wait_http_health
from specwatch.backends.process import ProcessBackend

COMMAND: tuple[str, ...] = (sys.executable, "-m", "specwatch.cli", "sim")


def sim_backend(extra_args: Sequence[str] = (), environ: Mapping[str, str] | None = None,
                health: HealthCheck = wait_http_health) -> ProcessBackend:
    """`extra_args` go after every server's argv: the simulator's own `--sim-*` knobs live there."""
    return ProcessBackend(COMMAND, dict(os.environ if environ is None else environ), tuple(extra_args), health,
                          kind="sim", help_timeout=60.0, help_flags=("--help",))
