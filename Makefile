# One command per target. `make test` works on a fresh clone with only
# Python 3.11: it builds .venv, installs the pinned torch and disttest into it,
# then runs the suite.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.disttest-installed

.PHONY: install test examples docs lint backend-suite stress clean test-torch gpu-check pyc

# `make test-torch TORCH=2.8.0`: the suite and the examples on another torch,
# in its own venv (.venv-torch-2.8.0). NB: any torch but the local 2.13.0 CPU
# wheel comes from the package index as a CUDA build (several GB, minutes), so
# this is a manual check, never part of `make test` or CI. TORCH_TESTS picks
# what pytest runs (default: the whole suite).
TORCH ?=
TORCH_TESTS ?= tests
TVENV := .venv-torch-$(TORCH)

install: $(STAMP)

# The CPU build, by its local version label: where no index or wheel
# directory offers it, pip stops at once instead of fetching the default
# (CUDA, several GB) wheel; PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
# names the index that has it.
TORCH_PIN := torch==2.13.0+cpu

$(STAMP): setup.cfg setup.py
	$(PYTHON) -m venv $(VENV) && $(PY) -m pip install -q '$(TORCH_PIN)' && $(PY) -m pip install -q -e '.[dev]' && touch $(STAMP)

# Bytecode for disttest and what runs beside it, brought up to date (only
# files that changed are compiled again). An editable install writes none,
# and where PYTHONDONTWRITEBYTECODE is set no process writes its own, so
# each interpreter that imports disttest (every rank started by spawn, every
# subprocess of the suite) would compile it again: about 0.3 s each.
pyc: $(STAMP)
	@$(PY) -m compileall -q -j0 disttest tests examples benchmarks > /dev/null

# The suite runs on every core (pytest-xdist), a class or module per worker:
# a pool is started once per class, not once per worker.
test: pyc
	$(PY) -m pytest -q -p no:cacheprovider -n auto --dist loadscope tests

# Every GPU test (marked gpu; most live in tests/gpu/), one process, no xdist
# (the xdist test starts its own workers). Where CUDA or enough GPUs are
# absent each skips, saying why (-rs lists the reasons). NB: needs a CUDA
# build of torch to run them: the dev install's torch is the CPU wheel
# (make test-torch TORCH=... builds a venv with a CUDA build).
gpu-check: pyc
	$(PY) -m pytest -q -p no:cacheprovider -rs -m gpu tests

examples: pyc
	$(PY) examples/run_all.py

# The Sphinx site (docs/), warnings as errors; tests/test_docs.py runs its code.
docs: $(STAMP)
	$(PY) -m sphinx -E -W --keep-going -b html docs docs/_build/html

$(TVENV)/.disttest-installed: setup.cfg setup.py
	@test -n "$(TORCH)" || { echo "usage: make test-torch TORCH=2.8.0 [TORCH_TESTS=tests/test_x.py]"; exit 2; }
	$(PYTHON) -m venv $(TVENV) && $(TVENV)/bin/python -m pip install -q torch==$(TORCH) && $(TVENV)/bin/python -m pip install -q -e '.[dev]' && touch $@

test-torch: $(TVENV)/.disttest-installed
	$(TVENV)/bin/python -c 'import torch; print("torch", torch.__version__)' && $(TVENV)/bin/python -m pytest -q -p no:cacheprovider $(TORCH_TESTS) ; s=$$?; $(TVENV)/bin/python examples/run_all.py && exit $$s

# PyTorch's own backend suite (DistributedTest._DistTestBase) on disttest,
# gloo, world sizes 2 and 3. Too slow for every CI run; a subset is in tests/.
backend-suite: $(STAMP)
	for n in 2 3; do BACKEND=gloo WORLD_SIZE=$$n $(PY) benchmarks/distributed_suite.py disttest || exit 1; done

# The runner tests 5 rounds in a row while busy processes load every core
# (timing-dependent behaviour shows here first). About 13 minutes on 2 cores.
stress: $(STAMP)
	$(PY) tests/stress.py --rounds 5

lint: $(STAMP)
	$(PY) -m ruff check disttest tests examples benchmarks docs && $(PY) -m mypy disttest && $(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .venv-torch-* build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
