"""The SmolLM2 model folders that `specwatch models build` leaves: readable by a server that runs as another user."""

from __future__ import annotations

import stat

from specwatch.models.build import ModelFolders


def test_every_model_file_is_readable_by_every_user(model_folders: ModelFolders) -> None:
    # the vllm-cpu image builds them as root and serves as `vllm`: a -rw------- safetensors crash-looped it
    folders = [model_folders.target, *model_folders.drafts.values()]
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files), files
    unreadable = [str(p) for p in files if not p.stat().st_mode & stat.S_IROTH]
    assert not unreadable, unreadable
