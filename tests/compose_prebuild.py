"""The compose tier's images, built while the rest of the suite runs.

Building the images cold takes about 12 minutes on 2 cores, most of it pip and layer writes, and the rest of
the suite spends much of its time waiting on servers. So when a compose test is selected, the engine is
obtained and `specwatch images build` (the command a user runs) starts in the background at collection, at a
lower CPU priority (a private dockerd is started under `nice`, and its builds inherit it), and the compose
tests move to the end of the run, where the `built` fixture waits for that build and checks its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwatch.compose import engine as engine_mod
from specwatch.config import resolve_home
from tests.compose_stack import ROOT

BUILD_NICENESS = 10
BUILD_TIMEOUT_S = 3600


@dataclass
class Prebuild:
    """The engine (or why there is none) and the background `specwatch images build`, with its log."""

    engine: engine_mod.DockerEngine | None
    error: str
    proc: subprocess.Popen[bytes] | None
    log: Path
    started: float  # monotonic, for the timeout
    started_wall: float  # wall clock, against the log's modification time

    def wait(self) -> tuple[int, str, float]:
        """(exit status, output, seconds the build took: from its start to its log's last write); fails the test
        when there is no engine."""
        if self.engine is None or self.proc is None:
            pytest.fail(f"no Docker engine for the compose tier: {self.error}")
        try:
            code = self.proc.wait(max(1.0, BUILD_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        return code, self.log.read_text(errors="replace"), self.log.stat().st_mtime - self.started_wall

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)
        if self.engine is not None:
            self.engine.stop()


PREBUILD = pytest.StashKey[Prebuild]()


def start(config: pytest.Config) -> Prebuild:
    home = resolve_home(None)
    log = home.root / "compose-tier-images-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started, started_wall = time.monotonic(), time.time()
    try:
        engine = engine_mod.obtain(home.root / "docker", os.environ, niceness=BUILD_NICENESS)
    except engine_mod.DockerError as exc:
        return Prebuild(None, str(exc), None, log, started, started_wall)
    cmd = ["nice", "-n", str(BUILD_NICENESS), sys.executable, "-m", "specwatch.cli", "images", "build",
           "--root", str(ROOT), "--profile", "sim", "--profile", "cpu"]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=engine.env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    return Prebuild(engine, "", proc, log, started, started_wall)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    compose = [item for item in items if item.get_closest_marker("compose") is not None]
    if not compose or config.option.collectonly:
        return
    items[:] = [item for item in items if item.get_closest_marker("compose") is None] + compose
    config.stash[PREBUILD] = start(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    prebuild = config.stash.get(PREBUILD, None)
    if prebuild is not None:
        prebuild.stop()


@pytest.fixture(scope="session")
def prebuild(request: pytest.FixtureRequest) -> Prebuild:
    found = request.config.stash.get(PREBUILD, None)
    if found is None:  # a compose fixture used by a test without the marker
        found = request.config.stash[PREBUILD] = start(request.config)
    return found
