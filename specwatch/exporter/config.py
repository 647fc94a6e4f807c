"""The exporter's configuration: flags and YAML in, one validated frozen `ExporterConfig` out.

Flags win over the YAML file. Errors name the input and what was expected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

DEFAULT_TASKS = ("code", "chat")
OTHER = "other"
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
# The article's workloads: code-edit prompts carry a source with `def`; everything else is chat.
DEFAULT_RULES: tuple[dict[str, str], ...] = (
    {"task": "code", "message_regex": r"(?m)^\s*(def |class |import |from \S+ import |```)"},
    {"task": "chat", "message_regex": r"."},
)


class ConfigError(ValueError):
    """The configuration is invalid; the message names the setting."""


@dataclass(frozen=True)
class TaskRule:
    """Classify a request as `task` when every given condition matches."""

    task: str
    path: str | None = None  # exact request path
    model: str | None = None  # exact `model` field
    header: tuple[str, re.Pattern[str]] | None = None  # (lowercase name, regex on its value)
    message_regex: re.Pattern[str] | None = None  # regex on the first user message (or the prompt)


# The variable compose, `specwatch up` and `specwatch canary --push-to` use for the admin token.
DEFAULT_ADMIN_TOKEN_ENV = "SPECWATCH_ADMIN_TOKEN"


@dataclass(frozen=True)
class ExporterConfig:
    upstreams: dict[str, str]  # variant -> base URL, in order; the first is the default route
    split: dict[str, float] = field(default_factory=dict)  # variant -> percent of traffic
    mirror: str | None = None
    sticky_header: str | None = None
    listen_host: str = "127.0.0.1"
    listen_port: int = 9400
    tasks: tuple[str, ...] = DEFAULT_TASKS
    rules: tuple[TaskRule, ...] = ()
    max_body_bytes: int = 16 * 1024 * 1024
    probe_interval_seconds: float = 5.0
    upstream_timeout_seconds: float = 600.0
    event_log: Path | None = None
    event_log_max_bytes: int = 64 * 1024 * 1024
    admin_token_env: str | None = None  # the environment variable holding the admin bearer token; None: no admin

    @property
    def default_variant(self) -> str:
        return next(iter(self.upstreams))

    @property
    def task_labels(self) -> tuple[str, ...]:
        return (*self.tasks, OTHER)


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--web.listen-address {value!r}: expected HOST:PORT, e.g. 127.0.0.1:9400")
    return host or "127.0.0.1", int(port)


def _pair(value: str, flag: str) -> tuple[str, str]:
    name, sep, rest = value.partition("=")
    if not sep or not name or not rest:
        raise ConfigError(f"{flag} {value!r}: expected NAME=VALUE")
    return name, rest


def _rule(raw: Mapping[str, Any], where: str) -> TaskRule:
    unknown = set(raw) - {"task", "path", "model", "header", "header_regex", "message_regex"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; expected task, path, model, header, "
                          "header_regex, message_regex")
    task = raw.get("task")
    if not isinstance(task, str):
        raise ConfigError(f"{where}: `task` must be a string")
    try:
        message = re.compile(raw["message_regex"]) if raw.get("message_regex") else None
        header = (str(raw["header"]).lower(), re.compile(str(raw.get("header_regex", ".")))) if raw.get(
            "header") else None
    except re.error as exc:
        raise ConfigError(f"{where}: bad regular expression: {exc}") from None
    return TaskRule(task, raw.get("path"), raw.get("model"), header, message)


def load(flags: Mapping[str, Any], file: Path | None) -> ExporterConfig:
    """Build the config from parsed flags (`upstream`, `split`, `mirror`, `listen`, ...) and the YAML file."""
    doc: dict[str, Any] = {}
    if file is not None:
        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"--config.file {file}: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"--config.file {file}: expected a mapping at the top level")
        doc = loaded or {}
    upstreams: dict[str, str] = dict(doc.get("upstreams") or {})
    for item in flags.get("upstream") or ():
        name, url = _pair(item, "--upstream")
        upstreams[name] = url
    if not upstreams:
        raise ConfigError("no upstream: give --upstream NAME=URL (e.g. baseline=http://127.0.0.1:8000)")
    for name, url in upstreams.items():
        if not _NAME.match(name):
            raise ConfigError(f"upstream name {name!r}: expected lowercase letters, digits, '-' or '_' (max 32)")
        parsed = urlparse(str(url))
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"upstream {name}={url!r}: expected an http(s) URL")
        upstreams[name] = str(url).rstrip("/")
    split = {str(k): float(v) for k, v in (doc.get("split") or {}).items()}
    for item in flags.get("split") or ():
        name, weight = _pair(item, "--split")
        try:
            split[name] = float(weight)
        except ValueError:
            raise ConfigError(f"--split {item!r}: the weight must be a number of percent") from None
    for name, pct in split.items():
        if name not in upstreams:
            raise ConfigError(f"split {name}: no such upstream; known: {sorted(upstreams)}")
        if not 0 <= pct <= 100:
            raise ConfigError(f"split {name}={pct}: expected a percentage in 0..100")
    if sum(split.values()) > 100:
        raise ConfigError(f"split weights add up to {sum(split.values())} %: at most 100")
    mirror = flags.get("mirror") or doc.get("mirror")
    if mirror is not None and mirror not in upstreams:
        raise ConfigError(f"--mirror {mirror}: no such upstream; known: {sorted(upstreams)}")
    if mirror is not None and mirror == next(iter(upstreams)):
        raise ConfigError(f"--mirror {mirror}: the mirror must differ from the primary route")
    tasks = tuple(doc.get("tasks") or DEFAULT_TASKS)
    for t in tasks:
        if not isinstance(t, str) or not _NAME.match(t) or t == OTHER:
            raise ConfigError(f"task {t!r}: expected a lowercase name other than {OTHER!r}")
    raw_rules: Sequence[Mapping[str, Any]] = doc.get("rules") or DEFAULT_RULES
    rules = tuple(_rule(r, f"rules[{i}]") for i, r in enumerate(raw_rules))
    for r in rules:
        if r.task not in tasks:
            raise ConfigError(f"rule for task {r.task!r}: not among the configured tasks {list(tasks)}")
    host, port = _listen(flags.get("listen") or doc.get("listen_address") or "127.0.0.1:9400")
    event_log = flags.get("event_log") or doc.get("event_log")
    admin_token_env = flags.get("admin_token_env") or doc.get("admin_token_env")
    if admin_token_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(admin_token_env)):
        raise ConfigError(f"--admin-token-env {admin_token_env!r}: expected an environment variable name")
    return ExporterConfig(
        upstreams=upstreams, split=split, mirror=mirror,
        sticky_header=(flags.get("sticky_header") or doc.get("sticky_header") or None),
        listen_host=host, listen_port=port, tasks=tasks, rules=rules,
        max_body_bytes=int(doc.get("max_body_bytes", 16 * 1024 * 1024)),
        probe_interval_seconds=float(doc.get("probe_interval_seconds", 5.0)),
        upstream_timeout_seconds=float(doc.get("upstream_timeout_seconds", 600.0)),
        event_log=Path(event_log) if event_log else None,
        event_log_max_bytes=int(doc.get("event_log_max_bytes", 64 * 1024 * 1024)),
        admin_token_env=str(admin_token_env) if admin_token_env else None)
