# syntax=docker/dockerfile:1
# The specwatch image: `specwatch exporter`, `specwatch sim` and Locust with loadgen/locustfile.py,
# plus the article's workloads (/opt/specwatch/data/en and /zh, written by `specwatch workloads`).
# Build context: the repository root (see .dockerignore). Every Python version comes from
# pyproject.toml, read here with tomllib, so nothing is pinned twice.
FROM python:3.11.13-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/specwatch

# The pinned dependencies first, so a source edit does not reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

COPY README.md ./
COPY specwatch/ specwatch/
COPY loadgen/ loadgen/
RUN pip install --no-deps . \
 && specwatch workloads --out data/en --lang en \
 && specwatch workloads --out data/zh --lang zh \
 && useradd --system --uid 10001 --create-home --home-dir /home/specwatch specwatch \
 && install -d -o specwatch -g specwatch /var/lib/specwatch

USER specwatch
# exporter 9400, simulator 8000, Locust web UI 8089 (and 5557 for its workers)
EXPOSE 9400 8000 8089 5557
ENTRYPOINT ["specwatch"]
CMD ["--help"]
