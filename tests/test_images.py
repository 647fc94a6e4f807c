"""`specwatch images`: what reaches the build stages, and the environment compose builds with (no engine needed;
the compose tier in tests/test_compose_stack.py runs the whole command against a real one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.compose import images
from specwatch.compose.docker_cli import DockerError

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def config(tmp_path: Path, **kw: object) -> images.ImagesConfig:
    return images.ImagesConfig(root=tmp_path, env={}, **kw)  # type: ignore[arg-type]


def test_the_ca_bundle_and_every_wheel_are_staged_once_and_stale_ones_dropped(tmp_path: Path) -> None:
    ca = tmp_path / "corp-ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    first, second = tmp_path / "house1", tmp_path / "house2"
    for house, names in ((first, [TORCH, "a-1.0-py3-none-any.whl"]), (second, ["a-1.0-py3-none-any.whl"])):
        house.mkdir()
        for name in names:
            (house / name).write_bytes(name.encode())
    stale = tmp_path / "docker" / "build-inputs" / "wheels" / "old-0.1-py3-none-any.whl"
    stale.parent.mkdir(parents=True)
    stale.write_text("from an earlier build")
    staged = images.stage_inputs(config(tmp_path, ca_bundle=ca, wheelhouses=(first, second)))
    assert staged.ca_bundle is not None and staged.ca_bundle.read_text() == ca.read_text()
    assert sorted(w.name for w in staged.wheels) == ["a-1.0-py3-none-any.whl", TORCH]
    assert sorted(p.name for p in stale.parent.iterdir()) == ["a-1.0-py3-none-any.whl", TORCH]
    assert staged.has_torch_cpu
    env = images.build_env(config(tmp_path), "specwatch/base:x", staged)
    assert env["SPECWATCH_BASE_IMAGE"] == "specwatch/base:x" and env["SPECWATCH_TORCH_INDEX"] == ""


def test_without_a_torch_wheel_the_pytorch_index_stays(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    (house / "b-2.0-py3-none-any.whl").write_text("b")
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    staged = images.stage_inputs(config(tmp_path, ca_bundle=ca, wheelhouses=(house,)))
    assert not staged.has_torch_cpu
    assert "SPECWATCH_TORCH_INDEX" not in images.build_env(config(tmp_path), images.LOCAL_BASE, staged)
    # offline, the compose files' own defaults (local base, no index) are what the build used: nothing to add
    env = images.build_env(config(tmp_path), images.LOCAL_BASE, staged, offline=True)
    settings = {k: env[k] for k in images.expected_settings(ROOT, offline=True)}
    assert settings == images.expected_settings(ROOT, offline=True)


def test_a_missing_ca_bundle_or_wheelhouse_is_named(tmp_path: Path) -> None:
    with pytest.raises(DockerError, match="--ca-bundle .*nope.pem"):
        images.stage_inputs(config(tmp_path, ca_bundle=tmp_path / "nope.pem"))
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    with pytest.raises(DockerError, match="--wheelhouse .*missing"):
        images.stage_inputs(config(tmp_path, ca_bundle=ca, wheelhouses=(tmp_path / "missing",)))


def test_the_official_base_is_the_one_default_of_every_dockerfile() -> None:
    assert images.official_base(ROOT) == "python:3.11.13-slim-bookworm"


def test_offline_adds_the_override_file() -> None:
    assert images.compose_files(ROOT, offline=False) == ["-f", str(ROOT / "compose.yaml")]
    assert images.compose_files(ROOT, offline=True)[-1] == str(ROOT / images.OFFLINE_FILE)
    assert (ROOT / images.OFFLINE_FILE).is_file()
