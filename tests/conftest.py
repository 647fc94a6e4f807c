"""Shared fixtures: the specwatch home and one real vLLM 0.32.0 CPU server (n-gram) per test run."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specwatch.config import Home, resolve_home
from specwatch.models import build as models
from specwatch.net import free_port
from specwatch.vllm_cpu.server import NGRAM_CONFIG, VllmServer, serve_argv
from specwatch.vllm_cpu.setup import is_installed


@pytest.fixture(scope="session")
def home() -> Home:
    resolved = resolve_home(None)
    if not is_installed(resolved):
        pytest.fail(f"no vLLM CPU environment at {resolved.vllm_env}: run the README's test command "
                    "(`make test`), which installs it first")
    return resolved


@pytest.fixture(scope="session")
def model_folders(home: Home) -> models.ModelFolders:
    return models.build(home)


@pytest.fixture(scope="session")
def ngram_server(home: Home, model_folders: models.ModelFolders,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The real server with the article's n-gram config and per-request metrics, started once."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "ngram.log"
    argv = serve_argv(model_folders.target, port=port, speculative_config=NGRAM_CONFIG,
                      extra=["--max-num-seqs", "8"])
    with VllmServer(home, argv, port, log).start() as server:
        yield server
