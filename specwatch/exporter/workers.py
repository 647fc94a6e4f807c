"""`--workers N`: N forked worker processes serve one listen address; the parent binds, supervises, cleans up.

The parent binds N listening sockets to the address with `SO_REUSEPORT` (Linux spreads new
connections evenly over them by their address hash; an address in use fails here, once, before
anything forks), creates the run folder, and forks worker i with socket i. A worker runs the
ordinary single-process exporter on its socket, with prometheus_client in multiprocess mode: its
counters and histograms live in mmap files under `<run>/metrics` (written on every increment, so
a worker that dies loses nothing it had counted), and any worker's `/metrics` sums every file
(`MultiProcessCollector`). The split weights, canary verdicts and down set live in `<run>/state`
(`specwatch.exporter.shared`); the event log is shared line by line (`specwatch.exporter.eventlog`).

The parent keeps every socket open, so connections that reach a dead worker's socket wait in its
backlog for the replacement instead of being refused. A worker that exits is replaced in its slot
(`mark_process_dead` for its pid first: its `live*` gauges, `specwatch_upstream_routable`, leave the
merge, while its counter files stay in the sum); more than `MAX_RESTARTS` replacements within
`RESTART_WINDOW_SECONDS` means something is wrong beyond one bad request: the parent stops the others
and exits 1. SIGTERM or SIGINT to the parent stops every worker (SIGTERM: each finishes its requests
as a single exporter does) and removes the run folder; a worker whose parent is gone stops itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from specwatch.exporter import compat
from specwatch.exporter.config import ExporterConfig
from specwatch.exporter.shared import SharedState

log = logging.getLogger("specwatch.exporter")
MAX_RESTARTS = 10
RESTART_WINDOW_SECONDS = 60.0
STOP_GRACE_SECONDS = 30.0  # then SIGKILL: a worker that will not finish its requests
BACKLOG = 1024
_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGCHLD}


@dataclass(frozen=True)
class Worker:
    """What a worker process knows about its place among the others."""

    index: int  # 0..count-1, kept by a replacement; worker 0 runs the upstream probe
    count: int
    run_dir: Path
    parent_pid: int

    @property
    def metrics_dir(self) -> Path:
        return self.run_dir / "metrics"

    @property
    def state_dir(self) -> Path:
        return self.run_dir / "state"


def listen_sockets(host: str, port: int, count: int) -> list[socket.socket]:
    """`count` listening sockets on one address (SO_REUSEPORT); port 0 picks one free port for all."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = infos[0]
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(address)
            address = sock.getsockname()  # port 0: the rest bind the port the first one got
            sock.listen(BACKLOG)
            sock.set_inheritable(True)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


ServeOne = Callable[[Worker, socket.socket], None]


class WorkerPool:
    """The parent of `--workers N`: forks a worker per socket, restarts one that dies (within a budget), and
    passes SIGTERM / SIGINT on."""

    def __init__(self, cfg: ExporterConfig, serve_one: ServeOne, sockets: list[socket.socket]) -> None:
        self.cfg, self.serve_one, self.sockets = cfg, serve_one, sockets
        self.run_dir = Path(tempfile.mkdtemp(prefix="specwatch-exporter-"))
        self.pids: dict[int, int] = {}  # pid -> slot
        self.restarts: deque[float] = deque()

    def run(self) -> int:
        (self.run_dir / "metrics").mkdir()
        SharedState.create(self.run_dir / "state", self.cfg.split).close()
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # taken one by one below, never mid-fork
        code = 0
        try:
            for slot in range(len(self.sockets)):
                self._start(slot)
            log.info("specwatch exporter: %d workers on http://%s:%d (run folder %s)", len(self.sockets),
                     self.cfg.listen_host, self.sockets[0].getsockname()[1], self.run_dir)
            while True:
                info = signal.sigtimedwait(_SIGNALS, 1.0)
                if info is None:
                    continue
                if info.si_signo != signal.SIGCHLD:
                    log.info("specwatch exporter: %s, stopping the workers", signal.Signals(info.si_signo).name)
                    break
                if not self._reap_and_replace():
                    code = 1
                    break
        finally:
            self._stop_all()
            while signal.sigtimedwait(_SIGNALS, 0) is not None:  # a second SIGTERM / SIGINT meanwhile: taken
                pass
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            for sock in self.sockets:
                sock.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return code

    def _start(self, slot: int) -> None:
        worker = Worker(slot, len(self.sockets), self.run_dir, os.getpid())
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the parent's code
            code = 1
            try:
                code = _worker_main(worker, self.sockets, self.serve_one)
            finally:
                os._exit(code)
        self.pids[pid] = slot
        log.info("worker %d started (pid %d)", slot, pid)

    def _reap_and_replace(self) -> bool:
        """Replace every worker that exited; False when they die too often to go on."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return True
            slot = self.pids.pop(pid, None)
            if slot is None:
                continue
            mark_process_dead(pid, str(self.run_dir / "metrics"))  # its counter files stay: nothing is lost
            how = (f"signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}" if os.WIFSIGNALED(status)
                   else f"exit code {os.waitstatus_to_exitcode(status)}")
            now = time.monotonic()
            self.restarts.append(now)
            while self.restarts and self.restarts[0] < now - RESTART_WINDOW_SECONDS:
                self.restarts.popleft()
            if len(self.restarts) > MAX_RESTARTS:
                log.error("worker %d (pid %d) ended (%s): %d restarts within %.0f s, giving up", slot, pid, how,
                          len(self.restarts), RESTART_WINDOW_SECONDS)
                return False
            log.warning("worker %d (pid %d) ended (%s): starting a replacement", slot, pid, how)
            self._start(slot)

    def _stop_all(self) -> None:
        for pid in self.pids:
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        while self.pids:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                self.pids.pop(pid, None)
                continue
            if time.monotonic() > deadline:
                for pid in self.pids:
                    log.error("worker pid %d did not stop within %.0f s: killed", pid, STOP_GRACE_SECONDS)
                    _kill(pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(0.05)


def _kill(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _worker_main(worker: Worker, sockets: list[socket.socket], serve_one: ServeOne) -> int:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)  # the parent's mask is inherited across fork
    mine = sockets[worker.index]
    for sock in sockets:
        if sock is not mine:
            sock.close()
    use_multiprocess_metrics(worker.metrics_dir)
    try:
        serve_one(worker, mine)
    except Exception:  # noqa: BLE001 - said in the log; the parent replaces the worker
        log.exception("worker %d failed", worker.index)
        return 1
    return 0


def use_multiprocess_metrics(folder: Path) -> None:
    """prometheus_client's multiprocess mode for every metric created from here on in this process: values in
    mmap files under `folder` (`compat`: the library reads its folder from the environment)."""
    compat.use_multiprocess_values(folder)


def supervise(cfg: ExporterConfig, serve_one: ServeOne) -> int:
    """Bind, fork `cfg.workers` workers, supervise them until SIGTERM / SIGINT; the exit status."""
    try:
        sockets = listen_sockets(cfg.listen_host, cfg.listen_port, cfg.workers)
    except OSError as exc:
        print(f"specwatch exporter: cannot listen on {cfg.listen_host}:{cfg.listen_port}: {exc}", file=sys.stderr)
        return 1
    return WorkerPool(cfg, serve_one, sockets).run()
