# make demo / make test bootstrap a local virtualenv on first use.
# CPU machines get torch==2.13.0 first: an unpinned torch would pull a multi-GB CUDA build.
VENV ?= .venv
TRANSFORMERS ?=
PY := $(VENV)/bin/python
PIN_TORCH ?= torch==2.13.0
ifeq ($(TRANSFORMERS),)
EXTRA_PINS :=
else
EXTRA_PINS := transformers==$(TRANSFORMERS) triton==3.6.0 "numpy<2.4"
endif

.PHONY: demo test test-slow test-examples lint

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q $(PIN_TORCH)
	$(VENV)/bin/pip install -q -e ".[dev]" $(EXTRA_PINS)
	touch $@

demo: $(VENV)/.installed
	$(PY) -m specdec target=dense drafter=dflash tree=ddtree tree.budget=32 tree.topk=8 prompts.limit=3 max_new_tokens=64

test: $(VENV)/.installed
	$(PY) -m pytest

test-slow: $(VENV)/.installed
	$(PY) -m pytest -m slow

test-examples: $(VENV)/.installed
	$(PY) -m pytest -m examples tests/test_examples.py

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check specdec tests examples benchmarks
