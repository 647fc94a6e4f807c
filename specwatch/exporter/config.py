"""The exporter's configuration: flags and YAML in, one validated frozen `ExporterConfig` out.

Flags win over the YAML file (`--upstream` and `--split` add to or replace its entries). Every
setting is checked for its type and range, an unknown YAML key is refused, and each error is a
`ConfigError` that names the flag or key and what was expected.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from specwatch.exporter.labels import NAME_PATTERN

DEFAULT_TASKS = ("code", "chat")
OTHER = "other"
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
    rules: tuple[TaskRule, ...] = field(default_factory=lambda: default_rules())  # DEFAULT_RULES, parsed
    max_body_bytes: int = 16 * 1024 * 1024
    probe_interval_seconds: float = 5.0
    down_after_failures: int = 3  # requests in a row that cannot reach an upstream mark it down (`availability`)
    up_after_seconds: float = 10.0  # a down upstream is back in the split once its probe has answered this long
    up_after_max_seconds: float = 300.0  # the cap of that wait, doubled each time it goes down again soon after
    flap_window_seconds: float = 300.0  # "soon": down again within this long of coming back doubles the wait
    health_path: str | None = "/health"  # what the probe GETs on each upstream; None: no probe (`health`)
    upstream_timeout_seconds: float = 600.0
    event_log: Path | None = None
    event_log_max_bytes: int = 64 * 1024 * 1024
    admin_token_env: str | None = None  # the environment variable holding the admin bearer token; None: no admin
    workers: int = 1  # processes serving the listen address (`specwatch.exporter.workers`); 1: this process alone
    fast_relay: bool = True  # ordinary content chunks over the compiled relay thread where it is built

    @property
    def default_variant(self) -> str:
        return next(iter(self.upstreams))

    @property
    def task_labels(self) -> tuple[str, ...]:
        return (*self.tasks, OTHER)


def _default(name: str) -> Any:
    """An `ExporterConfig` field's default: the one place each default is written (flags and YAML fall back to it)."""
    return next(f.default for f in fields(ExporterConfig) if f.name == name)


def check_split(split: Mapping[str, Any], upstreams: Mapping[str, str], where: str = "split") -> dict[str, float]:
    """The one split rule, for the flags, the YAML file and the admin API alike: each name an upstream, each weight
    a number of percent in 0..100, together at most 100. The weights as floats; ConfigError names the problem."""
    weights: dict[str, float] = {}
    for name, pct in split.items():
        if name not in upstreams:
            raise ConfigError(f"{where} {name!r}: no such upstream; known: {sorted(upstreams)}")
        if isinstance(pct, bool) or not isinstance(pct, int | float) or not 0 <= pct <= 100:
            raise ConfigError(f"{where} {name}={pct!r}: expected a percentage in 0..100")
        weights[name] = float(pct)
    if sum(weights.values()) > 100:
        raise ConfigError(f"{where}: the weights {weights} add up to {sum(weights.values()):g} %, more than 100 %")
    return weights


def default_rules() -> tuple[TaskRule, ...]:
    return tuple(_rule(r, f"the default rules[{i}]") for i, r in enumerate(DEFAULT_RULES))


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


def _rule(raw: Any, where: str) -> TaskRule:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping (task, path, model, header, header_regex, message_regex)")
    unknown = set(raw) - {"task", "path", "model", "header", "header_regex", "message_regex"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(map(str, unknown))}; expected task, path, model, header, "
                          "header_regex, message_regex")
    task = raw.get("task")
    if not isinstance(task, str):
        raise ConfigError(f"{where}: `task` must be a string")
    for key in ("path", "model", "header", "header_regex", "message_regex"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{where}: `{key}` must be a string, got {raw[key]!r}")
    try:
        message = re.compile(raw["message_regex"]) if raw.get("message_regex") else None
        header = (str(raw["header"]).lower(), re.compile(str(raw.get("header_regex", ".")))) if raw.get(
            "header") else None
    except re.error as exc:
        raise ConfigError(f"{where}: bad regular expression: {exc}") from None
    return TaskRule(task, raw.get("path"), raw.get("model"), header, message)


# The keys of the YAML file (examples/exporter.yaml shows each); any other key is an error.
YAML_KEYS = ("upstreams", "split", "mirror", "sticky_header", "listen_address", "tasks", "rules", "event_log",
             "event_log_max_bytes", "max_body_bytes", "probe_interval_seconds", "upstream_timeout_seconds",
             "admin_token_env", "workers", "down_after_failures", "up_after_seconds", "up_after_max_seconds",
             "flap_window_seconds", "health_path")
HEALTH_OFF = ("off", "")  # `health_path` values that turn the probe off
MAX_WORKERS = 256


class _Yaml:
    """The YAML file's settings, read with their types checked; errors name the file and the key."""

    def __init__(self, file: Path | None) -> None:
        self.where = f"--config.file {file}"
        self.doc: dict[Any, Any] = {}
        if file is None:
            return
        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"{self.where}: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{self.where}: expected a mapping at the top level")
        self.doc = loaded or {}
        unknown = sorted(str(k) for k in self.doc if k not in YAML_KEYS)
        if unknown:
            raise ConfigError(f"{self.where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                              f"known keys: {', '.join(YAML_KEYS)}")

    def _fail(self, key: str, expected: str) -> ConfigError:
        return ConfigError(f"{self.where}: {key}: expected {expected}, got {self.doc[key]!r}")

    def text(self, key: str) -> str | None:
        value = self.doc.get(key)
        if value is not None and not isinstance(value, str):
            raise self._fail(key, "a string")
        return value or None

    def mapping(self, key: str) -> dict[Any, Any]:
        value = self.doc.get(key)
        if value is not None and not isinstance(value, dict):
            raise self._fail(key, "a mapping of NAME: VALUE")
        return dict(value or {})

    def sequence(self, key: str) -> list[Any] | None:
        value = self.doc.get(key)
        if value is not None and not isinstance(value, list):
            raise self._fail(key, "a list")
        return value or None

    def number(self, key: str, default: float, *, integer: bool = False) -> float:
        """A positive number (an integer where `integer`), or `default` where the key is absent."""
        if key not in self.doc:
            return default
        value = self.doc[key]
        valid = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not valid or not math.isfinite(value) or value <= 0:
            raise self._fail(key, "a positive integer" if integer else "a positive number")
        return value

    def percent(self, key: str, name: Any, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{self.where}: {key}.{name}: expected a number of percent, got {value!r}")
        return float(value)


def _health_path(flag: Any, doc: _Yaml) -> str | None:
    """The probe's path: the flag over the YAML key over `/health`; `off` or empty: None (no probe)."""
    where, value = "--health-path", flag
    if value is None:
        where, value = f"{doc.where}: health_path", doc.doc.get("health_path", _default("health_path"))
        if value is None or value is False:  # `health_path: off` reads as false in YAML 1.1
            return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a path such as /health, or off, got {value!r}")
    if value.strip().lower() in HEALTH_OFF:
        return None
    if not value.startswith("/") or any(c.isspace() for c in value) or "#" in value:
        raise ConfigError(f"{where} {value!r}: expected a path starting with / (e.g. /health), or off")
    return value


def plain_http(url: str) -> tuple[str, int, str] | None:
    """(host, port, path prefix) of an `http://` upstream URL; None for anything the tap's client does not speak."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.query or parts.fragment or parts.username:
        return None
    try:
        port = parts.port or 80
    except ValueError:
        return None
    return parts.hostname, port, parts.path.rstrip("/")


def _without_credentials(url: str) -> str:
    """The URL as a message may show it: any user and password replaced by `***`."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]).geturl()


def load(flags: Mapping[str, Any], file: Path | None) -> ExporterConfig:
    """Build the config from parsed flags (`upstream`, `split`, `mirror`, `listen`, ...) and the YAML file."""
    doc = _Yaml(file)
    upstreams: dict[str, str] = {}
    for name, url in doc.mapping("upstreams").items():
        if not isinstance(name, str) or not isinstance(url, str):
            raise ConfigError(f"{doc.where}: upstreams.{name}: expected NAME: URL strings, got {url!r}")
        upstreams[name] = url
    for item in flags.get("upstream") or ():
        name, url = _pair(item, "--upstream")
        upstreams[name] = url
    if not upstreams:
        raise ConfigError("no upstream: give --upstream NAME=URL (e.g. baseline=http://127.0.0.1:8000)")
    for name, url in upstreams.items():
        if not NAME_PATTERN.match(name):
            raise ConfigError(f"upstream name {name!r}: expected lowercase letters, digits, '-' or '_' (max 32)")
        if plain_http(str(url)) is None:
            raise ConfigError(f"upstream {name}={_without_credentials(str(url))!r}: expected http://HOST[:PORT][/PATH] "
                              "(the tap speaks plain HTTP/1.1 to its upstreams: no https, credentials, query or "
                              "fragment; put the exporter beside the server, or end TLS in front of it)")
        upstreams[name] = str(url).rstrip("/")
    split = {str(k): doc.percent("split", k, v) for k, v in doc.mapping("split").items()}
    for item in flags.get("split") or ():
        name, weight = _pair(item, "--split")
        try:
            split[name] = float(weight)
        except ValueError:
            raise ConfigError(f"--split {item!r}: the weight must be a number of percent") from None
    split = check_split(split, upstreams)
    mirror = flags.get("mirror") or doc.text("mirror")
    if mirror is not None and mirror not in upstreams:
        raise ConfigError(f"--mirror {mirror}: no such upstream; known: {sorted(upstreams)}")
    if mirror is not None and mirror == next(iter(upstreams)):
        raise ConfigError(f"--mirror {mirror}: the mirror must differ from the primary route")
    tasks = tuple(doc.sequence("tasks") or DEFAULT_TASKS)
    for t in tasks:
        if not isinstance(t, str) or not NAME_PATTERN.match(t) or t == OTHER:
            raise ConfigError(f"task {t!r}: expected a lowercase name other than {OTHER!r}")
    raw_rules = doc.sequence("rules")
    rules = tuple(_rule(r, f"rules[{i}]") for i, r in enumerate(raw_rules)) if raw_rules else default_rules()
    for r in rules:
        if r.task not in tasks:
            raise ConfigError(f"rule for task {r.task!r}: not among the configured tasks {list(tasks)}")
    host, port = _listen(flags.get("listen") or doc.text("listen_address")
                         or f"{_default('listen_host')}:{_default('listen_port')}")
    event_log = flags.get("event_log") or doc.text("event_log")
    admin_token_env = flags.get("admin_token_env") or doc.text("admin_token_env")
    if admin_token_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(admin_token_env)):
        raise ConfigError(f"--admin-token-env {admin_token_env!r}: expected an environment variable name")
    workers = flags.get("workers")
    if workers is None:
        workers = int(doc.number("workers", _default("workers"), integer=True))
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers {workers!r}: expected a positive integer")
    if workers > MAX_WORKERS:
        raise ConfigError(f"workers {workers}: at most {MAX_WORKERS} (one per core is the useful most)")
    up_after = float(doc.number("up_after_seconds", _default("up_after_seconds")))
    up_after_max = float(doc.number("up_after_max_seconds", max(_default("up_after_max_seconds"), up_after)))
    if up_after_max < up_after:
        raise ConfigError(f"{doc.where}: up_after_max_seconds {up_after_max:g} is below up_after_seconds "
                          f"{up_after:g}: the cap of the wait cannot be shorter than the wait")
    return ExporterConfig(
        upstreams=upstreams, split=split, mirror=mirror,
        sticky_header=(flags.get("sticky_header") or doc.text("sticky_header")),
        listen_host=host, listen_port=port, tasks=tasks, rules=rules,
        max_body_bytes=int(doc.number("max_body_bytes", _default("max_body_bytes"), integer=True)),
        probe_interval_seconds=float(doc.number("probe_interval_seconds", _default("probe_interval_seconds"))),
        down_after_failures=int(doc.number("down_after_failures", _default("down_after_failures"), integer=True)),
        up_after_seconds=up_after, up_after_max_seconds=up_after_max,
        flap_window_seconds=float(doc.number("flap_window_seconds", _default("flap_window_seconds"))),
        health_path=_health_path(flags.get("health_path"), doc),
        upstream_timeout_seconds=float(doc.number("upstream_timeout_seconds", _default("upstream_timeout_seconds"))),
        event_log=Path(event_log) if event_log else None,
        event_log_max_bytes=int(doc.number("event_log_max_bytes", _default("event_log_max_bytes"), integer=True)),
        admin_token_env=str(admin_token_env) if admin_token_env else None, workers=workers,
        fast_relay=not flags.get("no_fast_relay"))
