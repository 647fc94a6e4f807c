"""The local stack's child processes: supervised (own group, own log, healthy before use), failing as `StackError`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from specwatch.supervisor import Supervisor


class StackError(RuntimeError):
    """A part of the stack did not start or became unhealthy; the message names it and its log."""


def managed(name: str, argv: list[str], log: Path, health_url: str,
            env: Mapping[str, str] | None = None) -> Supervisor:
    """`argv` in its own process group, appending to `log`; stopped with SIGTERM, SIGKILL after 15 s."""
    return Supervisor(name, argv, log, health_url, env=env, grace=15.0, append=True, error=StackError)
