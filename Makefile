# Two entry points on a fresh machine: `make demo` and `make test`.
# Both create ./.venv and install kvtier into it first.
#
# TORCH_SPEC: the torch wheel to install before kvtier. The default is the CPU build that
# machines without a GPU should use; on a CUDA machine set e.g. TORCH_SPEC=torch.

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.kvtier-installed

.PHONY: demo test bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet "$(TORCH_SPEC)"
	$(PIP) install --quiet -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/kvtier demo

test: $(STAMP)
	scripts/system-deps.sh
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/ingest.py --json

clean:
	rm -rf $(VENV) kvtier-out .pytest_cache
