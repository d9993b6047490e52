# conveyor: `make test` and `make demo` set everything up on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test demo lint typecheck bench clean test-gpu

$(STAMP): pyproject.toml scripts/install-pocl.sh
	bash scripts/install-pocl.sh
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench examples

typecheck: $(STAMP)
	$(VENV)/bin/mypy src

test: lint typecheck
	$(PY) -m pytest -q --durations=15 tests

demo: $(STAMP)
	$(VENV)/bin/conveyor demo

bench: $(STAMP)
	$(PY) bench/pools.py
	$(PY) bench/kernel_cache.py
	$(PY) bench/engine.py

# On the lent GPU machine: source scripts/gpu-env.sh first (it installs the carried wheels).
test-gpu:
	bash scripts/test-gpu.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
