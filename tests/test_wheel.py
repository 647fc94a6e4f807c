"""The wheel works outside the checkout: built, installed into a fresh venv, run from a folder of its own.

The wheel is built from what the image's build copies (pyproject.toml, README.md, specwatch/) and
installed with its pinned dependencies into a venv without system site-packages; every command runs
from a temporary folder, so nothing of the checkout can be read by accident. The dependencies come
from pip's configured index once, then from a wheelhouse in pytest's cache (`pip install --no-index`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from specwatch import resources
from specwatch.net import free_port

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "specwatch")  # what docker/specwatch.Dockerfile copies


def clean_env() -> dict[str, str]:
    """The environment without anything that would point Python back at the checkout or the test's venv."""
    drop = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def check(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert result.returncode == 0, f"{result.args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def installed_venv(tmp: Path, pytestconfig: pytest.Config, build_env: dict[str, str] | None = None) -> Path:
    """A fresh venv under `tmp` with the wheel built from the checkout's build inputs (in `build_env`) installed."""
    src, dist, env = tmp / "src", tmp / "dist", tmp / "venv"
    src.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(ROOT / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    built = subprocess.run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], cwd=tmp,
                           env={**clean_env(), **(build_env or {})}, capture_output=True, text=True, timeout=600)
    check(built)
    wheel, = dist.glob("specwatch-*.whl")
    check(run([sys.executable, "-m", "venv", "--without-pip", str(env)], cwd=tmp))
    assert pytestconfig.cache is not None
    house = pytestconfig.cache.mkdir("specwatch-wheelhouse")
    install = [*pip, "--python", str(env / "bin" / "python"), "install", "-q", "--no-compile", "--no-index",
               "--find-links", str(house), str(wheel)]
    if run(install, cwd=tmp).returncode != 0:  # a cold cache, or a pin changed: fill it from pip's index
        check(run([*pip, "download", "-q", "-d", str(house), str(wheel)], cwd=tmp))
        for stale in house.glob("specwatch-*.whl"):
            stale.unlink()
        check(run(install, cwd=tmp))
    return env


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config) -> Path:
    """A fresh venv outside the checkout with the freshly built wheel installed."""
    return installed_venv(tmp_path_factory.mktemp("wheel"), pytestconfig)


def specwatch(env: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run([str(env / "bin" / "specwatch"), *args], cwd=cwd, timeout=120)


def installed(env: Path, code: str, cwd: Path) -> object:
    """The JSON printed by `code` run in the installed venv."""
    return json.loads(check(run([str(env / "bin" / "python"), "-c", code], cwd=cwd, timeout=120)).stdout)


def test_every_named_resource_is_installed_from_the_wheel(venv: Path, tmp_path: Path) -> None:
    found = installed(venv, "import json, specwatch.resources as r; print(json.dumps({'root': str(r.ROOT), "
                            "'named': {k: str(v) for k, v in r.RESOURCES.items()}}))", tmp_path)
    assert isinstance(found, dict)
    root = Path(found["root"])
    assert root.is_relative_to(venv), f"specwatch imported from {root}, not from the fresh venv"
    assert found["named"].keys() == resources.RESOURCES.keys()
    for name, path in found["named"].items():
        assert Path(path).is_relative_to(root) and Path(path).exists(), f"{name}: {path} is not installed"
    # and every file of the package data, byte for byte
    shipped = [p for p in resources.ROOT.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert len(shipped) >= 12
    for path in shipped:
        copy = root / path.relative_to(resources.ROOT)
        assert copy.is_file() and copy.read_bytes() == path.read_bytes(), f"{copy}: missing or different"


def test_the_local_stack_finds_its_inputs_in_the_installed_package(venv: Path, tmp_path: Path) -> None:
    """`specwatch up`'s Prometheus layout, Grafana provisioning and locustfile, resolved from the fresh venv."""
    code = ("import json, pathlib\n"
            "from specwatch.promconfig.server import Targets, write_layout\n"
            "from specwatch.stack.grafana import local_provisioning\n"
            "from specwatch.stack.up import LOCUSTFILE\n"
            "out = pathlib.Path('.').resolve()\n"
            "config = write_layout(out / 'prometheus', Targets({'baseline': 'http://127.0.0.1:8000'}))\n"
            "prov = local_provisioning(out / 'grafana', 'http://127.0.0.1:9090')\n"
            "print(json.dumps({'config': str(config), 'rules': str((config.parent / 'rules').resolve()),\n"
            "                  'provisioning': str(prov), 'locustfile': str(LOCUSTFILE)}))\n")
    found = installed(venv, code, tmp_path)
    assert isinstance(found, dict)
    assert Path(found["config"]).read_text() == resources.PROMETHEUS_CONFIG.read_text()
    assert Path(found["rules"]).is_relative_to(venv)
    assert sorted(p.name for p in Path(found["rules"]).glob("*.yml")) == sorted(
        p.name for p in resources.RULES.glob("*.yml"))
    provider = yaml.safe_load((Path(found["provisioning"]) / "dashboards" / "specwatch.yml").read_text())
    dashboards = Path(provider["providers"][0]["options"]["path"])
    assert dashboards.is_relative_to(venv) and len(list(dashboards.glob("*.json"))) == 3
    assert Path(found["locustfile"]).is_relative_to(venv) and Path(found["locustfile"]).is_file()


def test_canary_without_policy_reads_the_packaged_default(venv: Path, tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"variant": v, "task": "code", "ts": time.time(), "outcome": "ok",
                                          "tpot_s": 0.01, "ttft_s": 0.1, "e2e_s": 1.0, "completion_tokens": 10})
                              + "\n" for v in ("baseline", "candidate")))
    result = specwatch(venv, "canary", "--event-log", str(events), cwd=tmp_path)
    need = yaml.safe_load(resources.CANARY_POLICY.read_text())["min_samples"]
    assert result.returncode == 5, result.stdout + result.stderr  # insufficient data: the policy was loaded
    assert f"the policy needs {need} per side" in result.stdout
    assert "verdict: INSUFFICIENT DATA" in result.stdout


def test_up_help(venv: Path, tmp_path: Path) -> None:
    result = specwatch(venv, "up", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "usage: specwatch up" in result.stdout and "--backend" in result.stdout


@contextlib.contextmanager
def installed_exporter(env: Path, upstream: str, folder: Path) -> Iterator[str]:
    """`specwatch exporter` of the venv `env` in front of `upstream`, healthy; its URL. Its log: folder/exporter.log."""
    port = free_port()
    log_path = folder / "exporter.log"
    with log_path.open("wb") as log:
        argv = [str(env / "bin" / "specwatch"), "exporter", f"--upstream=baseline={upstream}",
                f"--web.listen-address=127.0.0.1:{port}"]
        proc = subprocess.Popen(argv, cwd=folder, env=clean_env(), stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log_path.read_text()
                try:
                    if requests.get(url + "/healthz", timeout=2).status_code == 200:
                        break
                except requests.ConnectionError:
                    pass
                assert time.monotonic() < deadline, "the exporter never answered /healthz"
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture
def exporter(venv: Path, tmp_path: Path) -> Iterator[str]:
    with installed_exporter(venv, f"http://127.0.0.1:{free_port()}", tmp_path) as url:
        yield url


def test_the_installed_exporter_serves_health_and_metrics(exporter: str) -> None:
    health = requests.get(exporter + "/healthz", timeout=5)
    assert health.status_code == 200 and health.text == "ok\n"
    families = {f.name: f for f in text_string_to_metric_families(requests.get(exporter + "/metrics", timeout=5).text)}
    assert "specwatch_upstream_up" in families
    requests_family = families["specwatch_requests"]
    assert {s.labels["variant"] for s in requests_family.samples} == {"baseline"}
    assert all(s.value == 0 for s in requests_family.samples)


def test_the_wheel_carries_the_compiled_relay(venv: Path, tmp_path: Path) -> None:
    """Built from the C source by the wheel's own build (not copied from the checkout): the exporter uses it."""
    code = ("import json; from specwatch.exporter import fastrelay; "
            "print(json.dumps([fastrelay.AVAILABLE, fastrelay._fastrelay.__file__]))")
    found = installed(venv, code, tmp_path)
    assert isinstance(found, list) and len(found) == 2, found
    available, path = found
    assert available and str(path).startswith(str(venv)) and str(path).endswith(".abi3.so"), path


def test_a_build_without_a_c_compiler_installs_and_relays_in_python(
        tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config, sim_baseline: Any) -> None:
    """No compiler where the wheel is built (`CC` runs nothing): the wheel still builds and installs, the exporter
    says at start and on /metrics that it relays in Python, and a streamed request through it is counted."""
    tmp = tmp_path_factory.mktemp("wheel-no-cc")
    env = installed_venv(tmp, pytestconfig, {"CC": "/bin/false", "LDSHARED": "/bin/false"})
    code = "import json; from specwatch.exporter import fastrelay; print(json.dumps(fastrelay.AVAILABLE))"
    assert installed(env, code, tmp) is False
    with installed_exporter(env, sim_baseline.url, tmp) as url:
        body = {"model": "spec-demo", "stream": True, "max_tokens": 24, "temperature": 0,
                "messages": [{"role": "user", "content": "def fib(n):"}]}
        streamed = requests.post(url + "/v1/chat/completions", json=body, timeout=60,
                                 headers={"X-Specwatch-Task": "code"})
        assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text[-300:]
        exposition = requests.get(url + "/metrics", timeout=5).text
    families = {f.name: f for f in text_string_to_metric_families(exposition)}
    relays = {s.labels["relay"]: s.value for s in families["specwatch_relay"].samples}
    assert relays.get("python") == 1 and not relays.get("compiled"), relays
    ok = [s for s in families["specwatch_requests"].samples
          if s.name == "specwatch_requests_total" and s.labels.get("outcome") == "ok" and s.value]
    assert [(s.labels["variant"], s.labels["task"], s.value) for s in ok] == [("baseline", "code", 1.0)], ok
    assert "content chunks relayed by the python relay (the compiled relay is not built" in \
        (tmp / "exporter.log").read_text()
