"""`specwatch images`: the stack's images, built where no registry can be pulled from as well as where one can.

Three steps, each usable alone: stage the build-time inputs (a CA bundle and a wheelhouse, from the host's pip
configuration unless named) into docker/build-inputs/, which only the build stages of the Dockerfiles read;
choose the base (the official Python image when present or pullable, else a Debian bookworm root made by
debootstrap and loaded with `docker import`); then `docker compose build` with that base. Without a registry,
compose.offline.yaml is added: Prometheus from Debian's package, no Grafana.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from specwatch import vllm_pins as pins
from specwatch.compose.docker_cli import DockerError, compose_command, docker_binary, run

LOCAL_BASE = "specwatch/base:bookworm-python3.11"
# What the Dockerfiles need of a base: Python 3.11 with venv (and headers for the vLLM build), CA certificates.
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "ca-certificates")
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
OFFLINE_FILE = "compose.offline.yaml"
TORCH_WHEEL = re.compile(r"^torch-[^-]+\+cpu-.*\.whl$")
GRAFANA_NOTICE = ("Grafana is not part of the offline stack (no offline source of its image): the viewer draws "
                  "the same dashboards on 127.0.0.1:8080, Prometheus is published on 127.0.0.1:9090")


@dataclass(frozen=True)
class BuildInputs:
    """What the build stages get: a CA bundle for pip (or none) and wheel files for its find-links."""

    ca_bundle: Path | None
    wheels: tuple[Path, ...]

    @property
    def has_torch_cpu(self) -> bool:
        return any(TORCH_WHEEL.match(w.name) for w in self.wheels)


@dataclass(frozen=True)
class ImagesConfig:
    root: Path                                # the checkout: compose.yaml, docker/
    env: Mapping[str, str]                    # what docker and compose run with (DOCKER_HOST among it)
    base: str = "auto"                        # auto | official | local | an image name
    profiles: tuple[str, ...] = ("cpu",)
    offline: bool | None = None               # None: offline exactly when the official base cannot be had
    ca_bundle: Path | None = None             # None: pip's configured `cert`
    wheelhouses: tuple[Path, ...] = ()        # empty: pip's configured `find-links` folders
    mirror: str = DEBIAN_MIRROR
    vllm_python: Path | None = None           # the host's vLLM CPU environment, for its source-only wheels
    build_timeout_s: float = 3600.0
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def inputs_dir(self) -> Path:
        return self.root / "docker" / "build-inputs"


def official_base(root: Path) -> str:
    """The official base every Dockerfile names by default (`ARG BASE_IMAGE=...`), read from them: one value."""
    found = {m.group(1) for path in sorted((root / "docker").glob("*.Dockerfile"))
             for m in re.finditer(r"^ARG BASE_IMAGE=(\S+)$", path.read_text(), re.M)}
    if len(found) != 1:
        raise DockerError(f"docker/*.Dockerfile name {len(found)} different BASE_IMAGE defaults: {sorted(found)}")
    return found.pop()


def pip_configured(key: str) -> list[str]:
    """Values of one pip setting (`cert`, `find-links`) as `pip config list` shows them, any scope."""
    done = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                          check=False)
    values: list[str] = []
    for line in done.stdout.splitlines():
        name, _, value = line.partition("=")
        if name.rpartition(".")[2] == key:
            values.extend(value.strip().strip("'\"").split())
    return values


def stage_inputs(cfg: ImagesConfig) -> BuildInputs:
    """Copy the CA bundle and the wheelhouses' wheels into docker/build-inputs/ (replacing what was there)."""
    ca = cfg.ca_bundle or next((Path(p) for p in pip_configured("cert") if Path(p).is_file()), None)
    if cfg.ca_bundle is not None and not cfg.ca_bundle.is_file():
        raise DockerError(f"--ca-bundle {cfg.ca_bundle}: no such file")
    # pip lists a setting once per scope (env, global...): each folder once
    houses = cfg.wheelhouses or tuple(dict.fromkeys(Path(p) for p in pip_configured("find-links") if Path(p).is_dir()))
    for house in houses:
        if not house.is_dir():
            raise DockerError(f"--wheelhouse {house}: not a folder")
    staged_ca = cfg.inputs_dir / "ca-bundle.crt"
    wheels_dir = cfg.inputs_dir / "wheels"
    staged_ca.unlink(missing_ok=True)
    shutil.rmtree(wheels_dir, ignore_errors=True)
    wheels_dir.mkdir(parents=True)
    if ca is not None:
        shutil.copyfile(ca, staged_ca)
    staged: list[Path] = []
    for house in houses:
        for wheel in sorted(house.glob("*.whl")):
            target = wheels_dir / wheel.name
            if target.exists():
                continue  # the same wheel in two wheelhouses
            try:
                os.link(wheel, target)  # same file system: no copy of a 200 MB torch wheel
            except OSError:
                shutil.copyfile(wheel, target)
            staged.append(target)
    if cfg.vllm_python is not None:
        staged += host_built_wheels(cfg.vllm_python, wheels_dir)
    return BuildInputs(staged_ca if ca is not None else None, tuple(staged))


def host_built_wheels(vllm_python: Path, wheels_dir: Path) -> list[Path]:
    """The vLLM environment's source-only packages as wheels, from the host's pip (its wheel cache: no compile
    when that environment was installed here). Built for this host's CPU and libc: for images built here."""
    before = set(wheels_dir.glob("*.whl"))
    done = subprocess.run([str(vllm_python), "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir",
                           str(wheels_dir), *pins.SOURCE_ONLY], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"== no host-built wheel of {', '.join(pins.SOURCE_ONLY)} (the image build compiles it): "
              f"{done.stderr.strip()[-300:]}", flush=True)
    return sorted(set(wheels_dir.glob("*.whl")) - before)


def image_present(image: str, env: Mapping[str, str]) -> bool:
    return run([docker_binary(), "image", "inspect", image], env, timeout=60, check=False).returncode == 0


def pullable(image: str, env: Mapping[str, str]) -> bool:
    """Present, or pulled now; False (fast) where no registry answers."""
    if image_present(image, env):
        return True
    return run([docker_binary(), "pull", "-q", image], env, timeout=600, check=False).returncode == 0


def build_local_base(cfg: ImagesConfig, *, force: bool = False) -> str:
    """A Debian bookworm root with Python 3.11, venv, headers and CA certificates, made by debootstrap
    (root needed) and loaded with `docker import` as LOCAL_BASE; kept when it exists unless `force`."""
    if not force and image_present(LOCAL_BASE, cfg.env):
        return LOCAL_BASE
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise DockerError("no `debootstrap`: apt-get install --no-install-recommends debootstrap (as root)")
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="specwatch-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        print(f"== debootstrap {DEBIAN_SUITE} ({', '.join(BASE_PACKAGES)}) from {cfg.mirror}", flush=True)
        run([debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", DEBIAN_SUITE,
             str(rootfs), cfg.mirror], cfg.env, timeout=1800)
        for leftover in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(
            [docker_binary(), "import", "--change", "ENV LANG=C.UTF-8", "--change", 'CMD ["python3"]',
             "-", LOCAL_BASE], stdin=tar.stdout, env=dict(cfg.env), capture_output=True, text=True, check=False)
        if tar.stdout is not None:
            tar.stdout.close()
        if tar.wait() != 0 or imported.returncode != 0:
            raise DockerError(f"docker import of the debootstrap root failed: {imported.stderr.strip()}")
    print(f"== {LOCAL_BASE} built in {time.monotonic() - start:.0f} s", flush=True)
    return LOCAL_BASE


def choose_base(cfg: ImagesConfig) -> tuple[str, bool]:
    """(base image, offline): the official base where it can be had, else the local one."""
    official = official_base(cfg.root)
    if cfg.base == "official":
        if not pullable(official, cfg.env):
            raise DockerError(f"{official} cannot be pulled here: use --base local (or auto)")
        return official, bool(cfg.offline)
    if cfg.base == "local":
        return build_local_base(cfg), True if cfg.offline is None else cfg.offline
    if cfg.base != "auto":
        if not image_present(cfg.base, cfg.env):
            raise DockerError(f"--base {cfg.base}: no such image on this engine")
        return cfg.base, bool(cfg.offline)
    if pullable(official, cfg.env):
        return official, bool(cfg.offline)
    print(f"== {official} cannot be pulled here: building on a local base", flush=True)
    return build_local_base(cfg), True if cfg.offline is None else cfg.offline


def compose_files(root: Path, offline: bool) -> list[str]:
    files = ["-f", str(root / "compose.yaml")]
    return [*files, "-f", str(root / OFFLINE_FILE)] if offline else files


def build_env(cfg: ImagesConfig, base: str, inputs: BuildInputs, offline: bool = False) -> dict[str, str]:
    """The environment compose builds with: the base, and no PyTorch index where the wheelhouse has torch or
    no registry answers."""
    env = {**cfg.env, **cfg.extra_env, "SPECWATCH_BASE_IMAGE": base}
    # compose interpolates every service, Grafana's required password included, even to build others
    env.setdefault("GRAFANA_ADMIN_PASSWORD", "unused-by-the-build")
    if inputs.has_torch_cpu or offline:
        env["SPECWATCH_TORCH_INDEX"] = ""
    return env


def build_side_by_side(commands: list[list[str]], names: list[str], env: Mapping[str, str],
                       timeout: float) -> None:
    """One `compose build SERVICE` per image at once (compose alone builds an image after the images of the
    services it depends on), each output line prefixed with its service; the first failure raises."""
    failures: list[str] = []

    def one(cmd: list[str], name: str) -> None:
        began = time.monotonic()
        proc = subprocess.Popen(cmd, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        tail: list[str] = []
        for line in proc.stdout:
            line = line.rstrip()
            if line and not line.startswith("Sending build context"):
                print(f"[{name}] {line}", flush=True)
                tail = [*tail[-29:], line]
        try:
            code = proc.wait(max(1.0, timeout - (time.monotonic() - began)))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = -9
        if code != 0:
            failures.append(f"`{' '.join(cmd)}` exited {code}:\n" + "\n".join(tail))
        else:
            print(f"== {name}: built in {time.monotonic() - began:.0f} s", flush=True)

    threads = [threading.Thread(target=one, args=(cmd, name)) for cmd, name in zip(commands, names, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise DockerError("\n".join(failures))


def expected_settings(root: Path, offline: bool) -> dict[str, str]:
    """What the compose files build with when .env sets nothing: the settings `build` need not print."""
    if offline:
        return {"SPECWATCH_BASE_IMAGE": LOCAL_BASE, "SPECWATCH_TORCH_INDEX": ""}
    return {"SPECWATCH_BASE_IMAGE": official_base(root)}


def build(cfg: ImagesConfig) -> tuple[str, bool]:
    """Stage the inputs, choose the base, `docker compose build` every image of the profiles; (base, offline)."""
    inputs = stage_inputs(cfg)
    print(f"== build inputs: CA bundle {'staged' if inputs.ca_bundle else 'none'}, "
          f"{len(inputs.wheels)} wheel(s) in {cfg.inputs_dir / 'wheels'}", flush=True)
    base, offline = choose_base(cfg)
    env = build_env(cfg, base, inputs, offline)
    cmd = [*compose_command(), "--project-directory", str(cfg.root), *compose_files(cfg.root, offline)]
    for profile in cfg.profiles:
        cmd += ["--profile", profile]
    config = json.loads(run([*cmd, "config", "--format", "json"], env, timeout=120).stdout)
    services = sorted(name for name, service in config["services"].items() if "build" in service)
    print(f"== {' '.join(cmd)} build {' '.join(services)} (BASE_IMAGE={base}), side by side", flush=True)
    start = time.monotonic()
    build_side_by_side([[*cmd, "build", name] for name in services], services, env, cfg.build_timeout_s)
    print(f"== images built in {time.monotonic() - start:.0f} s on {base}", flush=True)
    settings = {k: env[k] for k in ("SPECWATCH_BASE_IMAGE", "SPECWATCH_TORCH_INDEX") if k in env}
    if settings != expected_settings(cfg.root, offline):
        # `up` rebuilds (pull_policy: build): with other arguments it would miss every cached layer
        print("== for `docker compose up` to reuse these layers, put in .env: "
              + " ".join(f"{k}={v}" for k, v in settings.items()), flush=True)
    if offline:
        print(f"== offline: start with `docker compose -f compose.yaml -f {OFFLINE_FILE} up`. {GRAFANA_NOTICE}",
              flush=True)
    return base, offline
