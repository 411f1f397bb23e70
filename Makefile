# Every target installs what it needs first, so a fresh clone needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_DIR ?= demo_out
# pytest-xdist workers for make test / test-all: one per core of the 2-core machines the
# suite is sized for (1,075 tests on 2026-12-05: 9 min 40 s of pytest at nice -5 with one
# nice-19 job beside it; 986 tests on 2026-12-04 took 18.6 min, and an idle run 19.6 min:
# why this one took half is not measured; make_test.json is older); each test file stays on
# one worker.
TEST_WORKERS ?= 2
# make demo DEVICE=gpu: the CUDA 12 build of JAX, then the GPU-sized quickstart notebook
DEVICE ?= cpu
CUDA_STAMP := $(VENV)/.installed-cuda12
export XLA_PYTHON_CLIENT_PREALLOCATE = false

.PHONY: install test test-all demo lint bench figures clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests

$(CUDA_STAMP): $(STAMP)
	@command -v nvidia-smi >/dev/null || { echo "error: no NVIDIA driver here (nvidia-smi not found); fix: make demo (CPU), or see BUILD.md (GPU)" >&2; exit 2; }
	$(PY) -m pip install -q -e ".[cuda12]"
	touch $(CUDA_STAMP)

ifeq ($(DEVICE),gpu)
demo: $(CUDA_STAMP)
	$(PY) -c "import jax, sys; print(jax.devices()); jax.default_backend() == 'gpu' or sys.exit('error: JAX sees no GPU; fix: see BUILD.md (GPU)')"
	$(PY) -m scripts.run_notebook notebooks/quickstart.ipynb --param SIZE=gpu \
	  --param WORK=$(DEMO_DIR)/gpu --timings $(DEMO_DIR)/gpu/timings.json
else ifeq ($(DEVICE),cpu)
demo: $(STAMP)
	bash scripts/demo.sh $(DEMO_DIR)
else
demo:
	@echo "error: DEVICE=$(DEVICE); fix: make demo (CPU) or make demo DEVICE=gpu" >&2; exit 2
endif

lint: $(STAMP)
	$(VENV)/bin/ruff check soma_jax experiments benchmarks scripts tests

bench: $(STAMP)
	mkdir -p bench_out
	$(PY) -m benchmarks.spsa_step --config=experiments/configs/soma.py:n=4,size=cpu --json=bench_out/spsa_step.json
	$(PY) -m benchmarks.torch_mezo --json=bench_out/torch_mezo.json  # one line and no JSON without PyTorch (.[bench])

# the measured results (README's headline, docs/ pages) as docs/results/NAME.json (+ PNG): the cheap figures by
# default; FIGURES=all adds the hour-long training comparisons.
figures: $(STAMP)
	$(PY) -m scripts.figures $(FIGURES)

clean:
	rm -rf $(VENV) bench_out
