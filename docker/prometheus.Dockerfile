# Prometheus from Debian's package (2.42, the version the test suite runs), for a host that cannot
# pull prom/prometheus: compose.offline.yaml builds it on the same BASE_IMAGE as the other images.
# Runs as nobody with its data in /prometheus, as the official image does.
ARG BASE_IMAGE=python:3.11.13-slim-bookworm
FROM ${BASE_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus wget \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o nobody -g nogroup /prometheus
USER nobody
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
