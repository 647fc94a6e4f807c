"""The server backends: process groups (the simulator's command in place of `vllm serve`) and the docker SDK.

The docker backend runs against a stub Docker Engine API on loopback that records every call,
so the SDK's real request building (create body, DeviceRequests, PortBindings, stop, remove)
is what is checked.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from specwatch.backends import BackendError, BackendSpec, Launch, make_backend
from specwatch.backends.base import port_open
from specwatch.backends.docker import IMAGE, DockerBackend, DockerSettings
from specwatch.backends.process import ProcessBackend
from specwatch.backends.sim import COMMAND as SIM_COMMAND
from specwatch.config import Home
from specwatch.net import free_port
from specwatch.supervisor import group_alive
from tests.test_supervisor import running

SIM_ARGS = ("Qwen/Qwen3-8B", "--served-model-name", "spec-demo", "--max-model-len", "4096", "--seed", "42")


def test_process_backend_runs_the_simulator_command_and_confirms_it_is_gone(tmp_path: Path) -> None:
    backend = ProcessBackend(SIM_COMMAND, extra_args=("--sim-time-scale", "0.02"))
    launch = Launch("baseline", SIM_ARGS, free_port(), tmp_path / "server.log", timeout=60)
    server = backend.start(launch)
    try:
        assert server.url == f"http://127.0.0.1:{launch.port}"
        models = requests.get(server.url + "/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["spec-demo"]
        assert backend.command_line(launch)[len(SIM_COMMAND):len(SIM_COMMAND) + 5] == [
            "Qwen/Qwen3-8B", "--host", "127.0.0.1", "--port", str(launch.port)]
    finally:
        confirmed = server.stop()
    assert confirmed["process_group_gone"] and confirmed["port_closed"]
    assert not port_open(launch.port) and not group_alive(int(str(confirmed["process_group"])))
    assert (tmp_path / "server.log").read_text().startswith("+ " + " ".join(SIM_COMMAND))
    assert "--speculative-config" in (backend.help_text() or "")


def test_a_server_that_exits_early_is_reported_with_its_log(tmp_path: Path) -> None:
    backend = ProcessBackend(SIM_COMMAND)
    launch = Launch("bad", ("Qwen/Qwen3-8B", "--per-request-spec-decode-metrics", "summary"), free_port(),
                    tmp_path / "server.log", timeout=60)
    with pytest.raises(BackendError, match=r"(?s)exited with code 2 .*requires speculative decoding"):
        backend.start(launch)


def test_a_server_that_never_gets_healthy_is_stopped_with_its_group(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import pathlib, subprocess, sys, time\nchild = subprocess.Popen([sys.executable, '-c', "
                      "'import time; time.sleep(600)'])\npathlib.Path(sys.argv[-1]).write_text(str(child.pid))\n"
                      "time.sleep(600)\n")
    backend = ProcessBackend((sys.executable, str(script)), extra_args=(str(tmp_path / "child.pid"),))
    with pytest.raises(BackendError, match="not healthy"):
        backend.start(Launch("hang", ("model",), free_port(), tmp_path / "server.log", timeout=1.5))
    assert not running(int((tmp_path / "child.pid").read_text()))  # the group's straggler went with its leader


def test_make_backend_builds_the_simulator_backend(tmp_path: Path) -> None:
    backend = make_backend(BackendSpec("sim", ("--sim-time-scale", "0.02")), Home(tmp_path), {"PATH": "/usr/bin"})
    assert backend.kind == "sim"
    assert backend.command_line(Launch("x", ("m",), 1234, tmp_path / "l"))[-2:] == ["--sim-time-scale", "0.02"]
    with pytest.raises(BackendError, match="no vLLM CPU environment"):
        make_backend(BackendSpec("vllm_cpu"), Home(tmp_path), {}).start(
            Launch("x", ("m",), free_port(), tmp_path / "l"))


# -- docker, against a stub Docker Engine API ---------------------------------------------------

LOG_LINE = b"INFO: Started server process\n"
ID = "c0ffee" * 10 + "abcd"


def _frame(stream: int, data: bytes) -> bytes:
    return bytes([stream, 0, 0, 0]) + len(data).to_bytes(4, "big") + data


@dataclass
class Engine:
    """The recorded calls and the containers the stub knows."""

    calls: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    containers: dict[str, dict[str, Any]] = field(default_factory=dict)
    exit_on_start: bool = False
    url: str = ""


def _handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, body: Any = None, raw: bytes | None = None, ctype: str = "application/json") -> None:
            data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method: str) -> None:
            url = urlsplit(self.path)
            path = re.sub(r"^/v[0-9.]+", "", url.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"null") if length else None
            engine.calls.append((method, path, {"query": parse_qs(url.query), "body": body}))
            match = re.fullmatch(r"/containers/([^/]+)(?:/(\w+))?", path)
            if path == "/version":
                return self._send(200, {"ApiVersion": "1.45", "Version": "27.0.0", "MinAPIVersion": "1.24"})
            if path == "/containers/create" and method == "POST":
                cid = ID if not engine.containers else ID[:-1] + str(len(engine.containers))
                engine.containers[cid] = {"status": "created", "create": body}
                return self._send(201, {"Id": cid, "Warnings": []})
            if path.startswith("/images/"):
                return self._send(200, {"Id": "sha256:feed", "RepoDigests": ["vllm/vllm-openai@sha256:feed"]})
            if not match or match.group(1) not in engine.containers:
                return self._send(404, {"message": "No such container"})
            cid, action = match.groups()
            state = engine.containers[cid]
            if method == "GET" and action == "json":
                return self._send(200, {"Id": cid, "Name": "/x", "State": {"Status": state["status"]},
                                        "Config": {"Tty": False}, "HostConfig": {"LogConfig": {"Type": "json-file"}}})
            if action == "start":
                state["status"] = "exited" if engine.exit_on_start else "running"
                return self._send(204)
            if action == "stop":
                state["status"] = "exited"
                return self._send(204)
            if action == "wait":
                return self._send(200, {"StatusCode": 0})
            if action == "logs":
                return self._send(200, raw=_frame(1, LOG_LINE), ctype="application/vnd.docker.raw-stream")
            if method == "DELETE" and action is None:
                del engine.containers[cid]
                return self._send(204)
            return self._send(404, {"message": f"stub: {method} {path}"})

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

    return Handler


@pytest.fixture
def engine() -> Iterator[Engine]:
    state = Engine()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    state.url = f"tcp://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


def _calls(engine: Engine) -> list[tuple[str, str]]:
    return [(m, re.sub(r"[0-9a-f]{64}", "ID", p)) for m, p, _ in engine.calls if p != "/version"]


def test_docker_backend_runs_the_vllm_image_with_a_gpu_and_removes_it(engine: Engine, tmp_path: Path) -> None:
    checked: list[str] = []

    def healthy(url: str, deadline: float, died: Any) -> None:
        assert died() is None  # the container is running
        checked.append(url)

    model_dir = tmp_path / "draft"
    model_dir.mkdir()
    settings = DockerSettings(base_url=engine.url, hf_cache=tmp_path / "hf", environment={"HF_TOKEN": "t"})
    backend = DockerBackend(settings, health=healthy)
    spec = json.dumps({"method": "draft_model", "model": str(model_dir), "num_speculative_tokens": 4})
    port = free_port()
    launch = Launch("draft", ("Qwen/Qwen3-8B", "--speculative-config", spec), port, tmp_path / "v" / "server.log")
    server = backend.start(launch)
    assert checked == [f"http://127.0.0.1:{port}"] and server.url == checked[0]

    create = next(c for m, p, c in engine.calls if p == "/containers/create")
    body = create["body"]
    assert body["Image"] == IMAGE == "vllm/vllm-openai:v0.32.0"
    assert body["Cmd"] == ["Qwen/Qwen3-8B", "--host", "0.0.0.0", "--port", "8000", "--speculative-config", spec]
    host = body["HostConfig"]
    assert host["DeviceRequests"] == [{"Driver": "", "Count": -1, "DeviceIDs": [],
                                       "Capabilities": [["gpu"]], "Options": {}}]
    assert host["PortBindings"] == {"8000/tcp": [{"HostIp": "127.0.0.1", "HostPort": str(port)}]}
    assert sorted(host["Binds"]) == sorted([f"{tmp_path / 'hf'}:/root/.cache/huggingface:rw",
                                            f"{model_dir}:{model_dir}:ro"])
    assert host["IpcMode"] == "host" and "HF_TOKEN=t" in body["Env"]
    assert body["Labels"] == {"specwatch.variant": "draft"}

    confirmed = server.stop()
    assert confirmed["container_removed"] and confirmed["port_closed"] and not engine.containers
    calls = _calls(engine)
    assert calls[calls.index(("POST", "/containers/create")):] == [
        ("POST", "/containers/create"), ("GET", "/containers/ID/json"), ("POST", "/containers/ID/start"),
        ("GET", "/containers/ID/json"),  # the health wait's liveness probe
        ("POST", "/containers/ID/stop"), ("GET", "/containers/ID/logs"),
        ("GET", "/containers/ID/json"),  # the SDK reads the container's Tty setting to demultiplex the log
        ("DELETE", "/containers/ID"), ("GET", "/containers/ID/json")]
    stop = next(c for m, p, c in engine.calls if p.endswith("/stop"))
    assert stop["query"]["t"] == ["30"]
    assert (tmp_path / "v" / "server.log").read_bytes().endswith(LOG_LINE)


def test_docker_backend_picks_devices_and_reports_a_container_that_exits(engine: Engine, tmp_path: Path) -> None:
    engine.exit_on_start = True
    backend = DockerBackend(DockerSettings(base_url=engine.url, gpus=("0", "1")))
    with pytest.raises(BackendError, match="exited before it was healthy"):
        backend.start(Launch("x", ("Qwen/Qwen3-8B",), free_port(), tmp_path / "server.log", timeout=30))
    create = next(c for m, p, c in engine.calls if p == "/containers/create")["body"]
    assert create["HostConfig"]["DeviceRequests"][0]["DeviceIDs"] == ["0", "1"]
    assert not engine.containers  # removed after the failed start
    assert LOG_LINE.decode() in (tmp_path / "server.log").read_text()


def test_docker_backend_help_text_and_description(engine: Engine) -> None:
    backend = DockerBackend(DockerSettings(base_url=engine.url))
    assert backend.help_text() == LOG_LINE.decode()
    assert not engine.containers
    assert backend.describe()["image_id"] == "sha256:feed"


def test_docker_backend_without_an_engine_is_a_clear_error(tmp_path: Path) -> None:
    backend = DockerBackend(DockerSettings(base_url=f"tcp://127.0.0.1:{free_port()}"))
    with pytest.raises(BackendError, match="no Docker engine"):
        backend.start(Launch("x", ("m",), free_port(), tmp_path / "server.log"))
