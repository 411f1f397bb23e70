# Every target installs what it needs first, so a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_out
export XLA_PYTHON_CLIENT_PREALLOCATE = false

.PHONY: install test test-all demo lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

test-all: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	bash scripts/demo.sh $(DEMO_DIR)

lint: $(STAMP)
	$(VENV)/bin/ruff check soma_jax experiments benchmarks tests

bench: $(STAMP)
	mkdir -p bench_out
	$(PY) benchmarks/spsa_step.py --config=experiments/configs/soma.py:n=4,size=cpu --json bench_out/spsa_step.json

clean:
	rm -rf $(VENV) bench_out
