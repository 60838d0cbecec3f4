# make demo / make test bootstrap a local virtualenv on first use.
# CPU machines get torch==2.13.0 first: an unpinned torch would pull a multi-GB CUDA build.
#
# Test tiers (tests/conftest.py):
#   make test              the CPU suite (pytest's default selection) in TEST_WORKERS processes, a few minutes
#   make test-slow         zoo targets over all dev prompts, the wheel check
#   make test-interpreter  the Triton kernels through TRITON_INTERPRET=1 on the CPU
#   make test-examples     every example script and the tour notebook
#   make test-gpu          every gpu-marked test, on a CUDA machine, within a time budget
#                          (GPU_PY=python3 runs it with an interpreter that already has CUDA PyTorch)
VENV ?= .venv
TRANSFORMERS ?=
PY := $(VENV)/bin/python
PIN_TORCH ?= torch==2.13.0
ifeq ($(TRANSFORMERS),)
EXTRA_PINS :=
else
EXTRA_PINS := transformers==$(TRANSFORMERS) triton==3.6.0 "numpy<2.4"
endif
GPU_PY ?= $(PY)
GPU_TEST_BUDGET ?= 120
GPU_SUITE_BUDGET ?= 720
GPU_WORKERS ?= 4
# pytest-xdist processes for make test (each test file stays in one process)
TEST_WORKERS ?= 2

.PHONY: demo test test-slow test-interpreter test-examples test-gpu lint

$(VENV)/.installed: pyproject.toml setup.py
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(PIN_TORCH)
	$(VENV)/bin/pip install -q -e ".[dev]" $(EXTRA_PINS)
	touch $@

demo: $(VENV)/.installed
	$(PY) -m specdec target=dense drafter=dflash tree=ddtree tree.budget=32 tree.topk=8 prompts.limit=3 max_new_tokens=64

test: $(VENV)/.installed
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile

test-slow: $(VENV)/.installed
	$(PY) -m pytest -m slow

test-interpreter: $(VENV)/.installed
	$(PY) -m pytest -m interpreter $(INTERPRETER_ARGS)

test-examples: $(VENV)/.installed
	$(PY) -m pytest -m examples tests/test_examples.py

# Each test's setup and call within GPU_TEST_BUDGET seconds, the whole run within GPU_SUITE_BUDGET (SIGINT: pytest
# stops and reports). GPU_WORKERS processes share the GPU (pytest-xdist; most of the suite is Triton and
# torch.compile compiling on the host's cores, so tests overlap well); GPU_WORKERS=0 runs them in one process.
# The zoo's hybrid tests need SPECDEC_ZOO (or ../shared/zoo); without it they are skipped.
test-gpu: $(if $(filter $(PY),$(GPU_PY)),$(VENV)/.installed)
	timeout --signal=INT $(GPU_SUITE_BUDGET) $(GPU_PY) -m pytest -m gpu -n $(GPU_WORKERS) --dist load \
		--test-budget=$(GPU_TEST_BUDGET) --durations=40

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check specdec tests examples benchmarks
