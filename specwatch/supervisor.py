"""One server process: its own process group and log file, healthy before use, stopped with its whole group.

Everything specwatch starts as a server (the stack's parts, the experiment backends, the vLLM CPU
launcher, Prometheus) runs through `Supervisor`: `argv` in a new session, so the leader's pid is
the group id and every engine worker or helper it forks is stopped with it; stdout and stderr go to
one log file that starts with the command line (`+ argv`); `start` returns once `health_url`
answers 200 and fails fast, with the log's tail, when the process exits first; `stop` sends
`stop_signal` to the group, SIGKILL to whatever is left after `grace`, and returns once no member
of the group is running. Failures raise `error` (each caller's own exception type).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import requests

POLL_SECONDS = 0.2
KILL_WAIT_SECONDS = 10.0
TAIL_LINES = 40


class ProcessError(RuntimeError):
    """A supervised process could not start, died before it was healthy, or never became healthy."""


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _group_of(stat: str) -> tuple[str, int]:
    """(state, process group) from a /proc/PID/stat line; the command name may hold spaces and parentheses."""
    state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
    return state, int(pgrp)


def group_alive(pgid: int) -> bool:
    """Whether process group `pgid` has a running member (zombies waiting for a reaper do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    proc = Path("/proc")
    if not proc.is_dir():
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, pgrp = _group_of((entry / "stat").read_text())
        except (OSError, ValueError):
            continue  # gone meanwhile
        if pgrp == pgid and state not in ("Z", "X"):
            return True
    return False


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """GET `url` answers 200; a refusal or a timeout is False (a server binds its port before it is ready)."""
    try:
        return requests.get(url, timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def wait_http(url: str, deadline: float, died: Callable[[], str | None],
              error: Callable[[str], Exception] = ProcessError) -> bool:
    """Poll `url` until it answers 200 (True) or `deadline`, a `time.monotonic()`, passes (False).

    `died` returns why the server is gone, or None while it lives; a reason raises `error(reason)` at once.
    """
    while True:
        reason = died()
        if reason is not None:
            raise error(reason)
        if http_ok(url):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_SECONDS)


class Supervisor:
    """`argv` as its own process group with its output in `log`; `start` waits for `health_url`; a context manager.

    `append` keeps an existing log (a folder reused across runs); otherwise each start begins a new one.
    """

    def __init__(self, name: str, argv: Sequence[str], log: Path, health_url: str, *,
                 env: Mapping[str, str] | None = None, stop_signal: int = signal.SIGTERM, grace: float = 15.0,
                 append: bool = False, error: Callable[[str], Exception] = ProcessError) -> None:
        self.name = name
        self.argv = [str(a) for a in argv]
        self.log = log
        self.health_url = health_url
        self.env = dict(env) if env is not None else None
        self.stop_signal = stop_signal
        self.grace = grace
        self.append = append
        self.error = error
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The leader's pid, which is also the group id (None before `spawn`)."""
        return self.proc.pid if self.proc is not None else None

    def spawn(self) -> Supervisor:
        """Start the process without waiting for it: the log gets the command line, then its output."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab" if self.append else "wb") as log:
            log.write(("+ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=self.env, start_new_session=True)
            except OSError as exc:
                raise self.error(f"cannot run {self.argv[0]!r}: {exc}") from exc
        return self

    def start(self, timeout: float = 60.0) -> Supervisor:
        """`spawn`, then `wait_healthy`; on any failure (or Ctrl+C) the group is stopped before the error rises."""
        self.spawn()
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float) -> None:
        if not wait_http(self.health_url, time.monotonic() + timeout, self.died, self.error):
            raise self.error(f"{self.name} not healthy at {self.health_url} after {timeout:g} s; "
                             f"log {self.log}:\n{self.log_tail()}")

    def died(self) -> str | None:
        """Why the process is gone (its exit code and log tail), or None while it runs."""
        if self.proc is None or self.proc.poll() is None:
            return None
        return (f"{self.name} exited with code {self.proc.returncode} before it was healthy; "
                f"log {self.log}:\n{self.log_tail()}")

    def log_tail(self, lines: int = TAIL_LINES) -> str:
        return log_tail(self.log, lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float | None = None) -> int | None:
        """`stop_signal` to the group, SIGKILL after `grace` seconds; returns the leader's exit code.

        Returns once no member of the group runs (or SIGKILL's wait has passed: `group_alive` tells).
        Safe to call more than once, and on a process that has already exited.
        """
        proc = self.proc
        if proc is None:
            return None
        waits = ((self.stop_signal, self.grace if grace is None else grace), (signal.SIGKILL, KILL_WAIT_SECONDS))
        for sig, seconds in waits:
            proc.poll()  # reap the leader, so that a zombie leader does not count as alive
            if not group_alive(proc.pid):
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            if self._wait_gone(seconds):
                break
        return proc.poll()

    def _wait_gone(self, seconds: float) -> bool:
        assert self.proc is not None
        deadline = time.monotonic() + seconds
        while True:
            self.proc.poll()
            if not group_alive(self.proc.pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> Supervisor:
        return self if self.proc is not None else self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
