# One entry point for people and CI. `make demo` and `make test` set everything up themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test interop llamafactory lint typecheck bench check clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP)
	@echo "make test: the default suite (not gpu, slow or interop) takes ~10 min on 2 cores (9.5 measured on 2026-12-07);"
	@echo "           one file: $(BIN)/python -m pytest -q tests/test_tokenize.py"
	$(BIN)/python -m pytest -q -m "not gpu and not slow and not interop" tests

# The trainers' own readers (TRL, OLMo-core, Megatron-Bridge) in their own pinned venv: docs/EXPORT.md.
# Tests marked interop outside tests/interop (they need TRL) are listed by file.
INTEROP := .venv-interop
$(INTEROP)/.installed: pyproject.toml
	$(PY) -m venv $(INTEROP)
	$(INTEROP)/bin/pip install --quiet --upgrade pip
	$(INTEROP)/bin/pip install --quiet -e ".[interop]"
	$(INTEROP)/bin/pip install --quiet --no-deps --ignore-requires-python megatron-bridge==0.6.2
	$(INTEROP)/bin/pip install --quiet --no-deps --only-binary=:all: --python-version 3.12 \
		--target $(INTEROP)/megatron-core megatron-core==0.19.2
	touch $@

interop: $(INTEROP)/.installed
	$(INTEROP)/bin/python -m pytest -q -m interop -p no:cacheprovider -W ignore::UserWarning tests/interop \
		tests/test_hf_combinations.py tests/test_hostile_pairs_blend.py

# LLaMA-Factory 0.9.5 in its own venv: the baseline of `scripts/bench_vision.py tokenize` (skipped without it)
LF := .venv-llamafactory
$(LF)/.installed:
	$(PY) -m venv $(LF)
	$(LF)/bin/pip install --quiet --upgrade pip
	$(LF)/bin/pip install --quiet torch==2.13.0 llamafactory==0.9.5
	touch $@

llamafactory: $(LF)/.installed

lint: $(STAMP)
	$(BIN)/ruff check packtool tests scripts
	$(BIN)/ruff format --check packtool

typecheck: $(STAMP)
	$(BIN)/mypy packtool

bench: $(STAMP)
	@for s in scripts/bench_*.py; do echo "== $$s"; $(BIN)/python $$s || exit 1; done

check: lint typecheck test

clean:
	rm -rf $(VENV) $(INTEROP) $(LF) build *.egg-info demo_out
