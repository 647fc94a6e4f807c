"""The process supervisor on real processes: healthy waits, early exits, timeouts, and whole-group stops."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from specwatch.net import free_port
from specwatch.supervisor import ProcessError, Supervisor, group_alive, http_ok


class OwnError(RuntimeError):
    """Stands for a caller's exception type (StackError, BackendError, ...)."""


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def http_server(tmp_path: Path) -> tuple[list[str], str]:
    port = free_port()
    argv = [sys.executable, "-u", "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    return argv, f"http://127.0.0.1:{port}/"


def test_start_returns_once_a_real_http_server_answers_and_the_context_stops_it(tmp_path: Path) -> None:
    argv, url = http_server(tmp_path)
    log = tmp_path / "logs" / "http.log"
    with Supervisor("http", argv, log, url, grace=5) as server:
        assert server.alive() and http_ok(url)
        pid = server.pid
        assert pid is not None and running(pid)
    assert not server.alive() and not group_alive(pid) and not running(pid)
    assert server.proc is not None and server.proc.returncode == -signal.SIGTERM
    with pytest.raises(requests.ConnectionError):
        requests.get(url, timeout=2)
    lines = log.read_text().splitlines()
    assert lines[0] == "+ " + " ".join(argv)
    assert '"GET / HTTP/1.1" 200' in server.log_tail()  # the server's own output reached the log


def test_a_process_that_exits_early_fails_fast_with_its_log_tail(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import sys; print('boom: no such model', flush=True); sys.exit(3)"]
    server = Supervisor("tiny", argv, tmp_path / "tiny.log", f"http://127.0.0.1:{free_port()}/", error=OwnError)
    started = time.monotonic()
    with pytest.raises(OwnError) as raised:
        server.start(timeout=60)
    assert time.monotonic() - started < 10  # not the 60 s timeout
    message = str(raised.value)
    assert message.startswith(f"tiny exited with code 3 before it was healthy; log {tmp_path / 'tiny.log'}:\n")
    assert message.endswith("boom: no such model")
    assert server.pid is not None and not group_alive(server.pid)


def test_a_process_that_never_gets_healthy_times_out_with_a_clear_message_and_is_stopped(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", "import time; print('loading weights', flush=True); time.sleep(600)"]
    url = f"http://127.0.0.1:{free_port()}/health"
    server = Supervisor("slow", argv, tmp_path / "slow.log", url)
    started = time.monotonic()
    with pytest.raises(ProcessError) as raised:
        server.start(timeout=1.5)
    assert 1.5 <= time.monotonic() - started < 15
    assert str(raised.value) == (f"slow not healthy at {url} after 1.5 s; log {tmp_path / 'slow.log'}:\n"
                                 f"+ {' '.join(argv)}\nloading weights")
    assert server.pid is not None and not group_alive(server.pid) and not server.alive()


def test_stop_kills_the_whole_group_including_a_child_that_ignores_sigterm_after_the_grace(tmp_path: Path) -> None:
    child_pid = tmp_path / "child.pid"
    ignores_term = ("import os, signal, time, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                    "open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)")
    leader = ("import subprocess, sys, time; "
              f"subprocess.Popen([sys.executable, '-c', {ignores_term!r}, {str(child_pid)!r}]); time.sleep(600)")
    server = Supervisor("group", [sys.executable, "-c", leader], tmp_path / "group.log", "http://127.0.0.1:9/")
    pgid = server.spawn().pid
    assert pgid is not None
    try:
        deadline = time.monotonic() + 30
        while not (child_pid.exists() and child_pid.read_text()):
            assert time.monotonic() < deadline, server.log_tail()
            time.sleep(0.05)
        child = int(child_pid.read_text())
        assert running(child) and group_alive(pgid)
    finally:
        started = time.monotonic()
        code = server.stop(grace=1.0)
    took = time.monotonic() - started
    assert code == -signal.SIGTERM  # the leader went at SIGTERM ...
    assert 1.0 <= took < 8  # ... the child only at SIGKILL, after the grace
    assert not running(child) and not group_alive(pgid)
    assert server.stop() == code  # stopping again is harmless


def test_a_command_that_cannot_run_is_an_error_of_the_callers_type(tmp_path: Path) -> None:
    server = Supervisor("nothing", [str(tmp_path / "no-such-binary")], tmp_path / "n.log", "http://127.0.0.1:9/",
                        error=OwnError)
    with pytest.raises(OwnError, match="cannot run .*no-such-binary"):
        server.start(timeout=1)
    assert server.proc is None and server.stop() is None


def test_a_zombie_leader_is_not_a_live_group() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    deadline = time.monotonic() + 30
    while running(proc.pid):  # exited, not yet reaped: a zombie that kill(0) still finds
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not group_alive(proc.pid)
    proc.wait()
    assert not group_alive(proc.pid)
