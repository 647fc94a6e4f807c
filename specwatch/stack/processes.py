"""A child process of the local stack: own process group, own log, healthy before use, never left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

import requests


class StackError(RuntimeError):
    """A part of the stack did not start or became unhealthy; the message names it and its log."""


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class ManagedProcess:
    """`argv` in a new session (its own process group), stdout and stderr to `log`."""

    def __init__(self, name: str, argv: list[str], log: Path, health_url: str,
                 env: Mapping[str, str] | None = None) -> None:
        self.name = name
        self.argv = argv
        self.log = log
        self.health_url = health_url
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60) -> ManagedProcess:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            log.write(("+ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise StackError(f"{self.name} exited with {self.proc.returncode} before it was healthy; "
                                 f"log {self.log}:\n{log_tail(self.log)}")
            try:
                if requests.get(self.health_url, timeout=2).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.2)
        self.stop()
        raise StackError(f"{self.name} not healthy at {self.health_url} after {timeout:.0f} s; log {self.log}:\n"
                         + log_tail(self.log))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15) -> None:
        """SIGTERM to the group, SIGKILL after `grace`; the group's stragglers too."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
