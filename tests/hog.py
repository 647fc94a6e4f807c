"""A planted CPU hog for the drift tests: one busy process per core, bounded in time, stopped on exit.

Each process spins in pure Python until its deadline (at most `seconds`), so a test that forgets it, or
dies, still leaves nothing running for long. `Hog.start()` returns at once; `stop()` ends them early.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import TracebackType

SPIN = "import time, sys\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end:\n    pass\n"


class Hog:
    def __init__(self, seconds: float, processes: int | None = None) -> None:
        self.seconds = seconds
        self.processes = processes or os.cpu_count() or 1
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started: float | None = None

    def start(self) -> Hog:
        self.started = time.time()
        self.procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(self.seconds)])
                      for _ in range(self.processes)]
        return self

    @property
    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()

    def __enter__(self) -> Hog:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
