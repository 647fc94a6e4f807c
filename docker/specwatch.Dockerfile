# The specwatch image: `specwatch exporter`, `specwatch sim`, `specwatch viewer` (the dashboards drawn by Perses's
# libraries, bundled into /opt/specwatch/viewer) and Locust with loadgen/locustfile.py, plus the article's
# workloads (/opt/specwatch/data/en and /zh, written by `specwatch workloads`).
# The defaults the package reads at run time (the canary policy, the Prometheus and Grafana files)
# are its package data (specwatch/data/), installed with it: nothing else of the checkout is copied.
# Build context: the repository root (see .dockerignore). Every Python version comes from
# pyproject.toml, read here with tomllib, so nothing is pinned twice.
#
# BASE_IMAGE: any Debian bookworm with Python 3.11 and venv; `specwatch images base` builds one
# without a registry. docker/build-inputs/ (a CA bundle, a wheelhouse; see its README) is used by the
# build stage only: the final stage copies the finished virtual environment, nothing else.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm

# The viewer's front end, as `make viewer` builds it: Debian's node and npm, `npm ci` from viewer/package-lock.json,
# esbuild's one bundle. Only viewer/dist reaches the final stage (no node, no node_modules).
FROM ${BASE_IMAGE} AS viewer
RUN apt-get update \
 && apt-get install -y --no-install-recommends nodejs npm \
 && rm -rf /var/lib/apt/lists/*
COPY docker/build-inputs/ /tmp/build-inputs/
WORKDIR /opt/viewer
COPY viewer/package.json viewer/package-lock.json viewer/build.mjs ./
RUN . /tmp/build-inputs/pip-env.sh \
 && npm ci --no-audit --no-fund --loglevel=error
COPY viewer/src/ src/
RUN npm run --silent build && test -s dist/viewer.js

FROM ${BASE_IMAGE} AS build
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_FIND_LINKS=/tmp/build-inputs/wheels
# gcc builds the exporter's compiled relay (specwatch/exporter/_fastrelay.c) against the Python headers;
# in the build stage only: the final stage gets the built module in the venv.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && { python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(sysconfig.get_paths()['include'] + '/Python.h'))" \
      || apt-get install -y --no-install-recommends python3-dev; } \
 && rm -rf /var/lib/apt/lists/*
COPY docker/build-inputs/ /tmp/build-inputs/
WORKDIR /opt/specwatch
# The pinned dependencies first, so a source edit does not reinstall them.
COPY pyproject.toml ./
RUN . /tmp/build-inputs/pip-env.sh \
 && python3 -m venv /opt/specwatch/venv \
 && venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && venv/bin/pip install -r /tmp/requirements.txt
COPY README.md ./
COPY specwatch/ specwatch/
RUN . /tmp/build-inputs/pip-env.sh \
 && venv/bin/pip install --no-deps . \
 && venv/bin/python -P -c "from specwatch.exporter import fastrelay; assert fastrelay.AVAILABLE, 'the compiled relay was not built'" \
 && venv/bin/specwatch workloads --out data/en --lang en \
 && venv/bin/specwatch workloads --out data/zh --lang zh \
 && rm -rf specwatch README.md pyproject.toml
COPY loadgen/ loadgen/

FROM ${BASE_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/specwatch/venv/bin:${PATH}
COPY --from=build /opt/specwatch /opt/specwatch
COPY --from=viewer /opt/viewer/dist /opt/specwatch/viewer
RUN useradd --system --uid 10001 --create-home --home-dir /home/specwatch specwatch \
 && install -d -o specwatch -g specwatch /var/lib/specwatch
WORKDIR /opt/specwatch
USER specwatch
# exporter 9400, simulator 8000, viewer 8080, Locust web UI 8089 (and 5557 for its workers)
EXPOSE 9400 8000 8080 8089 5557
ENTRYPOINT ["specwatch"]
CMD ["--help"]
