"""The SmolLM2 model folders that `specwatch models build` leaves: readable by a server that runs as another user;
the EAGLE-3 trainer refuses what it cannot train, and a head its time cap cut is never cached as complete."""

from __future__ import annotations

import json
import shutil
import stat
import subprocess

import pytest

from specwatch.config import Home
from specwatch.models.build import (
    EAGLE3_TRAINER,
    PROVENANCE,
    Eagle3Size,
    ModelBuildError,
    ModelFolders,
    build_eagle3,
    eagle3_dir,
)
from specwatch.models.dtype import host_cpu_dtype
from specwatch.models.eagle3 import MIN_PROMPTS


def test_every_model_file_is_readable_by_every_user(model_folders: ModelFolders) -> None:
    # the vllm-cpu image builds them as root and serves as `vllm`: a -rw------- safetensors crash-looped it
    folders = [model_folders.target, *model_folders.drafts.values()]
    files = [p for folder in folders for p in folder.rglob("*") if p.is_file()]
    assert any(p.suffix == ".safetensors" for p in files), files
    unreadable = [str(p) for p in files if not p.stat().st_mode & stat.S_IROTH]
    assert not unreadable, unreadable


def test_the_eagle3_trainer_refuses_too_few_prompts_before_it_loads_anything(home: Home) -> None:
    """Issue 43: `--prompts 0` looped forever (no row, no step, epoch after epoch); the trainer says what it needs."""
    done = subprocess.run([str(home.vllm_python), str(EAGLE3_TRAINER), "train", "no-target", "no-out",
                           "--prompts", "0"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "--prompts 0" in done.stderr and f"at least {MIN_PROMPTS} prompts" in done.stderr, done.stderr[-2000:]


def test_an_eagle3_head_cut_by_its_time_cap_is_never_marked_complete(home: Home,
                                                                     model_folders: ModelFolders) -> None:
    """Issue 43: a head the trainer's time cap cut (here to no step at all: a one-second cap) was cached as complete
    for good. Now the build fails, says how far it got, and leaves no PROVENANCE.json, so the next build trains
    again; the trainer's own record says it was cut."""
    size = Eagle3Size("eagle3-cut-test", prompts=MIN_PROMPTS, new_tokens=8, steps=50, seconds=1)
    folder = eagle3_dir(home, size)
    shutil.rmtree(folder, ignore_errors=True)
    try:
        with pytest.raises(ModelBuildError, match="trained 0 of 50 steps"):
            build_eagle3(home, model_folders.target, size=size)
        assert not (folder / PROVENANCE).exists()
        training = json.loads((folder / "TRAINING.json").read_text())
        assert training["cut_short_by_seconds"] is True and training["steps"] == 0, training
        assert training["threads"] == 2 and training["held_out_prompts"] == 2, training
        # the data in the server's dtype (float32 here, no native bfloat16: this test 33 s instead of 96 s)
        assert training["data_dtype"] == host_cpu_dtype(), training
    finally:
        shutil.rmtree(folder, ignore_errors=True)
