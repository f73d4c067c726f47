# One entry point for people and CI. `make demo` and `make test` set everything up themselves.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint typecheck bench check clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not gpu and not slow" tests

lint: $(STAMP)
	$(BIN)/ruff check packtool tests scripts
	$(BIN)/ruff format --check packtool

typecheck: $(STAMP)
	$(BIN)/mypy packtool

bench: $(STAMP)
	@for s in scripts/bench_*.py; do echo "== $$s"; $(BIN)/python $$s || exit 1; done

check: lint typecheck test

clean:
	rm -rf $(VENV) build *.egg-info demo_out
