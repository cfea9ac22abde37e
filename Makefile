# pipeserve: `make serve` sets everything up and serves the imagenet example; `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
INSTALLED := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PYTEST_ARGS ?=

IRIS := examples/iris/models/iris.onnx
IMAGENET := examples/imagenet/models/efficientnet_lite0.onnx
IRIS_ENSEMBLE := examples/iris_ensemble/models/svc.onnx

.PHONY: all install examples serve serve-iris up test test-fast lint typecheck bench bench-batching bench-recovery bench-request-cost bench-shape-switch bench-trial-noise bench-split bench-gateway bench-jobs peers proto redis clean

all: install examples

$(PY):
	$(PYTHON) -m venv $(VENV)

# torch==2.13.0 first: a CPU build from this machine's disk; any other spec pulls a multi-GB CUDA build.
$(INSTALLED): pyproject.toml | $(PY)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[all,examples,dev,bench]'
	touch $@

install: $(INSTALLED)

$(IRIS): examples/iris/build_iris.py $(INSTALLED)
	$(PY) examples/iris/build_iris.py

$(IMAGENET): examples/imagenet/build_imagenet.py $(INSTALLED)
	$(PY) examples/imagenet/build_imagenet.py

$(IRIS_ENSEMBLE): examples/iris_ensemble/build_iris_ensemble.py $(INSTALLED)
	$(PY) examples/iris_ensemble/build_iris_ensemble.py

cat.jpg: $(IMAGENET)

examples: $(IRIS) $(IMAGENET) $(IRIS_ENSEMBLE)

serve: install examples
	$(VENV)/bin/pipeserve serve examples/imagenet --host $(HOST) --port $(PORT)

serve-iris: install examples
	$(VENV)/bin/pipeserve serve examples/iris --host $(HOST) --port $(PORT)

# The preprocessing-inference split: inference server(s) on 8012/50051, the preprocessing server on 8011.
up: install examples
	$(VENV)/bin/pipeserve up examples/imagenet --pattern prep-pred --host $(HOST)

lint: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: install
	$(VENV)/bin/mypy

# The queue tests need a redis-server: the one on 127.0.0.1:6379, or one they start (installed here if missing).
redis:
	@command -v redis-server >/dev/null || redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || \
		(apt-get install -y -q redis-server >/dev/null || sudo apt-get install -y -q redis-server >/dev/null)

# The whole suite, slow tests included (CI runs this); `make test-fast` skips the slow ones.
test: install examples redis lint typecheck
	$(VENV)/bin/pytest -m "not gpu" --cov --cov-report=term:skip-covered --cov-fail-under=85 $(PYTEST_ARGS)

test-fast: install examples
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: install examples
	@command -v wrk >/dev/null || (apt-get install -y -q wrk >/dev/null || sudo apt-get install -y -q wrk)
	$(PY) -m bench.run $(BENCH_ARGS)

# The batching benchmark also runs LitServe, BentoML and MLServer, each in its own venv under bench/peers/.
peers:
	bench/peers/setup.sh litserve bentoml mlserver

bench-batching: install examples peers
	@command -v wrk >/dev/null || (apt-get install -y -q wrk >/dev/null || sudo apt-get install -y -q wrk)
	$(PY) -m bench.batching $(BENCH_ARGS)

# Concurrency 1 before and after a burst at 32, for each batching server: does a lone request's latency come back?
bench-recovery: install examples peers
	$(PY) -m bench.recovery $(BENCH_ARGS)

# Where a saturated imagenet server's time goes per image (engine vs the rest), next to the in-process loop;
# BENCH_ARGS="--contenders on,fixed2,fixed4,bare8 --loop-sizes 1,2,4" compares batch sizes in one server.
bench-request-cost: install examples
	$(PY) -m bench.request_cost $(BENCH_ARGS)

# Split benchmark: preprocessing -> gRPC -> inference vs web-single vs in-process; the inference server alone.
# What adaptive batching's size trials see: an engine's first run after a change of shape, and the trial rule in noise.
bench-shape-switch: install examples
	$(PY) -m bench.shape_switch $(BENCH_ARGS)

bench-trial-noise: install
	$(PY) -m bench.trial_noise $(BENCH_ARGS)

bench-split: install examples
	@command -v wrk >/dev/null || (apt-get install -y -q wrk >/dev/null || sudo apt-get install -y -q wrk)
	$(PY) -m bench.split $(BENCH_ARGS)

# Gateway benchmark: the iris ensemble in one process vs a gateway calling 1 or 2 remote nodes over gRPC.
bench-gateway: install examples
	@command -v wrk >/dev/null || (apt-get install -y -q wrk >/dev/null || sudo apt-get install -y -q wrk)
	$(PY) -m bench.gateway $(BENCH_ARGS)

# Queue and offline benchmark: pipeserve batch and jobs through 1-2 workers on Redis vs the in-process limit.
bench-jobs: install examples redis
	$(PY) -m bench.jobs $(BENCH_ARGS)

# Regenerate the gRPC messages from pipeserve/v2/_proto/inference.proto.
proto: install
	$(PY) -m grpc_tools.protoc -I. --python_out=. --pyi_out=. pipeserve/v2/_proto/inference.proto

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache cat.jpg examples/*/models examples/*/golden.json \
		examples/imagenet/labels.txt examples/imagenet/samples
