# lartpc: `make install`, `make test`, `make demo`. See README.md.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The torch installed when the venv has none; on a GPU host install the CUDA build of
# torch into $(VENV) first (see README) and it is kept as it is. Which build pip takes
# is the package index's choice: an index that serves torch's CUDA build on Linux (the
# public one does) pulls it onto a CPU host too; there, point pip at PyTorch's CPU-only
# wheel index (its install page gives the address): TORCH_PIP_ARGS="--index-url URL".
TORCH_VERSION ?= 2.13.0
TORCH_PIP_ARGS ?=
# spconv build: "auto" = spconv-cu12x matching torch's CUDA, or the CPU build `spconv`.
SPCONV ?= auto
PYTEST_ARGS ?=
# pytest-xdist workers for `make test`: one per core, at most 4 (a test is mostly one
# training subprocess on one thread); a file's tests stay on one worker (tests/conftest.py).
# TEST_WORKERS=0 runs the suite in this one process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 4 ? n : 4 )))
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: install test test-fast demo bench-gpu gpu-bundle lint clean-venv

# `make install` always installs; the targets that need an installed venv install only
# when the venv lacks it or the files that define it changed since (INSTALLED, a stamp):
# an installed venv then runs `make test` or `make demo` without a package index.
INSTALLED := $(VENV)/.lartpc-installed
INSTALL_INPUTS := Makefile pyproject.toml $(wildcard jobs/env/install_*.sh)

install:
	@rm -f $(INSTALLED)
	@$(MAKE) --no-print-directory $(INSTALLED)

$(INSTALLED): $(INSTALL_INPUTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip --version >/dev/null 2>&1 || $(PY) -m ensurepip -q >/dev/null 2>&1 || { \
	  echo "make install: $(VENV) has no pip (was python3-venv missing when it was made?):" \
	       "install it, remove $(VENV) and run make install again" >&2; exit 1; }
	@$(PY) -c 'import torch' 2>/dev/null || $(PY) -m pip install -q $(TORCH_PIP_ARGS) "torch==$(TORCH_VERSION)"
	@$(PY) -m pip install -q -e '.[test,horovod]'
	@bash jobs/env/install_spconv.sh $(PY) $(SPCONV)
	@bash jobs/env/install_horovod.sh $(PY)
	@bash jobs/env/install_larcv.sh $(PY)
	@$(VENV)/bin/lartpc env
	@touch $@

# The venv's bin first: tests call lartpc, horovodrun, torchrun and shellcheck from it.
RUN_IN_VENV := PATH="$(abspath $(VENV))/bin:$$PATH"

test: $(INSTALLED)
	$(RUN_IN_VENV) $(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

test-fast: $(INSTALLED)
	$(RUN_IN_VENV) $(PY) -m pytest $(XDIST) -m "not slow and not slurm" $(PYTEST_ARGS)

demo: $(INSTALLED)
	$(RUN_IN_VENV) $(PY) -m lartpc.jobs.local.study --out demo

# Every GPU speed measurement on this host's GPU, into GPU_BENCH_OUT; run it in
# parts with e.g. GPU_BENCH_ARGS="--only 'model-*'" (python -m lartpc.jobs.local.gpu_bench --help).
GPU_BENCH_OUT ?= gpu-bench
GPU_BENCH_ARGS ?=
bench-gpu: $(INSTALLED)
	$(RUN_IN_VENV) $(PY) -m lartpc.jobs.local.gpu_bench --out $(GPU_BENCH_OUT) $(GPU_BENCH_ARGS)

# The packages an offline GPU host lacks (spconv-cu126, blosc2, ...), repacked to travel
# under 64 MiB with the working tree; on the host: bash gpu-bundle/install.sh (README).
gpu-bundle: $(INSTALLED)
	$(PY) -m lartpc.jobs.gpu_bundle --out gpu-bundle

lint: $(INSTALLED)
	$(VENV)/bin/ruff check lartpc analysis jobs tests

clean-venv:
	rm -rf $(VENV)
