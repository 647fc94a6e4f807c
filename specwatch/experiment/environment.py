"""What a variant ran on: versions, the server's argv and `--help`, model revisions, input digests, KV capacity.

The server's identity beside its speculative config (`server_identity`): its vLLM version (`GET /version`) and,
where its log says so, its model runner. vLLM 0.32 exposes the runner nowhere over HTTP (`/server_info` only in
dev mode, and without it: `use_v2_model_runner` is a property of the config, not a field); its log says it once
per process: "Using V2 Model Runner" (`v1/worker/{cpu,gpu,xpu}_worker.py`) or "... using the V1 model runner
instead." (`config/vllm.py`, when Triton is missing or a feature is unsupported). A log that says neither (an
older vLLM, the simulator, V1 chosen by `VLLM_USE_V2_MODEL_RUNNER=0`) leaves it unknown.
"""

from __future__ import annotations

import json
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import requests

from specwatch import __version__
from specwatch.vllm_metrics import samples

PROVENANCE = "PROVENANCE.json"


def server_version(url: str) -> str | None:
    try:
        response = requests.get(url + "/version", timeout=10)
        value = response.json().get("version") if response.status_code == 200 else None
    except (requests.RequestException, ValueError, AttributeError):
        return None
    return str(value) if value is not None else None


V2_RUNNER = re.compile(r"Using V2 Model Runner")
V1_RUNNER = re.compile(r"using the V1 model runner instead", re.IGNORECASE)


def model_runner(server_log: str) -> str | None:
    """"V2" or "V1" where the server's log says which model runner it uses (vLLM 0.32's own lines); None where not."""
    if V2_RUNNER.search(server_log):
        return "V2"
    if V1_RUNNER.search(server_log):
        return "V1"
    return None


def server_identity(environment_record: Mapping[str, Any]) -> dict[str, str | None]:
    """{"vllm_version", "model_runner"} of one variant's `environment.json` record; None where it was not told."""
    def text(key: str) -> str | None:
        value = environment_record.get(key)
        return str(value) if value not in (None, "") else None

    return {"vllm_version": text("server_version"), "model_runner": text("model_runner")}


def num_gpu_blocks(metrics_text: str) -> int | None:
    """`num_gpu_blocks` label of `vllm:cache_config_info` (summed over engines); None when absent."""
    blocks = [int(dict(labels)["num_gpu_blocks"]) for (name, labels), _ in samples(metrics_text).items()
              if name == "vllm:cache_config_info" and dict(labels).get("num_gpu_blocks", "None").isdigit()]
    return sum(blocks) if blocks else None


def _flag(args: Sequence[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return None


def model_record(model: str, args: Sequence[str], revision_flag: str = "--revision") -> dict[str, Any]:
    """A local folder: its PROVENANCE.json and config.json digest; a hub name: the pinned revision, if any."""
    folder = Path(model)
    if folder.is_dir():
        record: dict[str, Any] = {"model": model, "kind": "folder"}
        provenance = folder / PROVENANCE
        record["provenance"] = json.loads(provenance.read_text()) if provenance.exists() else None
        config = folder / "config.json"
        if config.exists():
            from specwatch.files import sha256_file
            record["config_sha256"] = sha256_file(config)
        return record
    return {"model": model, "kind": "hub", "revision": _flag(args, revision_flag),
            "note": None if _flag(args, revision_flag) else "no --revision: the hub's current main at start-up"}


def environment(*, url: str, command: Sequence[str], args: Sequence[str], model: str,
                speculative_config: Mapping[str, Any] | None, backend: Mapping[str, object],
                inputs: Mapping[str, str], metrics_text: str, startup_seconds: float,
                has_help: bool, server_log: str = "") -> dict[str, Any]:
    """The variant's `environment.json` record (`server_log`: the server's log so far, for its model runner).
    A backend that runs nothing (`url`: a server someone else started) has no `command`, and its `argv` is unknown
    (None): the flags the plan names are kept apart as `argv_not_applied`, never passed off as the server's."""
    argv = list(args) if command else None
    models = [model_record(model, argv or ())]
    draft = (speculative_config or {}).get("model")
    if isinstance(draft, str):
        models.append(model_record(draft, argv or (), "--speculative-config.revision"))
    return {
        "specwatch": __version__, "python": sys.version.split()[0], "platform": platform.platform(),
        "server_version": server_version(url), "model_runner": model_runner(server_log), "url": url,
        "backend": dict(backend),
        "command": list(command), "argv": argv, **({} if command else {"argv_not_applied": list(args)}),
        "startup_seconds": round(startup_seconds, 2),
        "models": models, "inputs_sha256": dict(inputs), "num_gpu_blocks": num_gpu_blocks(metrics_text),
        "server_help": "server-help.txt" if has_help else None,
    }
