"""The sanitizer tier: the compiled relay built again with AddressSanitizer and UndefinedBehaviorSanitizer,
and the relay's tests run against that build (the thread on its own, the differential fuzz, the cancel
race, the allocation failures, and the exporter's fast path and hostile cases, whose exporter processes
load the same build).

The package is copied to a temporary folder with the sanitized extension in place of the normal one
and put first on `PYTHONPATH`; the sanitizer runtimes are preloaded into every process (Python itself is
not built with them). Any report stops the process (`halt_on_error`, `abort_on_error`), so a memory
error or undefined behaviour fails the tier. Leak checking is off: CPython's own allocations at exit
would drown the relay's.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from specwatch.exporter import fastrelay

ROOT = Path(__file__).resolve().parents[1]
RELAY_TESTS = ["tests/test_fastrelay.py", "tests/test_fastrelay_fuzz.py", "tests/test_exporter_fastpath.py",
               "tests/test_exporter_hostile.py"]
SANITIZERS = ("address", "undefined")
# 3.2 ms a case under the sanitizers here (the preloaded allocator slows the Python side too), against 0.44 ms in
# the plain tier's 100,000: 50,000 took 159 of the tier's 206 s (issue 43's budget); 15,000 fresh cases a run
# still drive every chunk shape, split and mutation the fuzz draws through the C paths many times over
SANITIZED_FUZZ_CASES = 15_000

pytestmark = [pytest.mark.skipif(not fastrelay.AVAILABLE, reason="the compiled relay is not built (no C compiler)"),
              pytest.mark.servers]


def sanitized_copy(folder: Path) -> Path:
    """A copy of the checkout's package, tests and pytest settings, whose `_fastrelay` is built with the
    sanitizers (run from there, nothing can import the checkout's own build)."""
    skip = shutil.ignore_patterns("__pycache__", "*.so")
    for name in ("specwatch", "tests"):
        shutil.copytree(ROOT / name, folder / name, ignore=skip)
    shutil.copy2(ROOT / "pyproject.toml", folder / "pyproject.toml")
    built = folder / "specwatch" / "exporter" / "_fastrelay.abi3.so"
    argv = ["gcc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer",
            f"-fsanitize={','.join(SANITIZERS)}", "-fno-sanitize-recover=all", "-Wall", "-Werror",
            f"-I{sysconfig.get_paths()['include']}", str(ROOT / "specwatch" / "exporter" / "_fastrelay.c"),
            "-o", str(built), "-lpthread"]
    compiled = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert compiled.returncode == 0, compiled.stderr
    return folder


def runtime(name: str) -> str:
    found = subprocess.run(["gcc", f"-print-file-name=lib{name}.so"], capture_output=True, text=True).stdout.strip()
    assert os.path.isabs(found) and os.path.exists(found), f"gcc has no lib{name}.so: {found!r}"
    return found


def test_the_relay_tests_pass_with_the_relay_built_under_asan_and_ubsan(tmp_path: Path) -> None:
    assert shutil.which("gcc"), "gcc built the relay at install; the sanitizer tier needs it too"
    src = sanitized_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(src), "LD_PRELOAD": f"{runtime('asan')} {runtime('ubsan')}",
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1",
           "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1", "SPECWATCH_SANITIZED": "1",
           # a fresh seed each run: the sanitizers watch the same C paths as the plain tier's 100,000
           "SPECWATCH_FUZZ_CASES": str(SANITIZED_FUZZ_CASES),
           # the outer run's options (`-k`, `-p some_plugin`) are not the inner run's: it runs RELAY_TESTS as named
           "PYTEST_ADDOPTS": ""}
    which = "from specwatch.exporter import _fastrelay; print(_fastrelay.__file__)"
    loaded = subprocess.run([sys.executable, "-c", which], env=env, cwd=src, capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0 and loaded.stdout.strip().startswith(str(src)), (loaded.stdout, loaded.stderr)
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", *RELAY_TESTS],
                         env=env, cwd=src, capture_output=True, text=True, timeout=1500)
    tail = run.stdout[-6000:] + run.stderr[-6000:]
    assert run.returncode == 0, tail
    assert "ERROR: AddressSanitizer" not in run.stderr and "runtime error:" not in run.stderr, tail
    fuzz = re.search(r"fuzz: (\d+) cases, seed (\d+), .* relay (\S+)", run.stdout)
    assert fuzz and int(fuzz[1]) == SANITIZED_FUZZ_CASES and fuzz[3].startswith(str(src)), tail
    passed = re.search(r"(\d+) passed", run.stdout)
    assert passed and int(passed[1]) >= 100 and " skipped" not in run.stdout.splitlines()[-1], tail
    print(f"sanitizer tier: {passed[1]} relay tests passed under {'+'.join(SANITIZERS)}; "
          f"fuzz {fuzz[1]} cases, seed {fuzz[2]}")
