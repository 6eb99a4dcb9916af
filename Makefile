# The README's two commands: `make demo` and `make test`.
# Both create .venv if needed and install the project with pins from constraints.txt.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
BASE_STAMP := $(VENV)/.installed-base
DEV_STAMP := $(VENV)/.installed-dev
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(BASE_STAMP): pyproject.toml constraints.txt simstore/_moments.c simstore/_rows.c | $(BIN)/python
	$(PIP) install -q -c constraints.txt -e '.[torch,adapters]'
	touch $@

$(DEV_STAMP): pyproject.toml constraints.txt simstore/_moments.c simstore/_rows.c | $(BIN)/python
	$(PIP) install -q -c constraints.txt -e '.[dev]'
	touch $@ $(BASE_STAMP)

demo: $(BASE_STAMP)
	$(BIN)/python examples/demo.py

test: $(DEV_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff check simstore formats loaders cli tests
	PATH=$(abspath $(BIN)):$$PATH .ci/typecheck

bench: $(DEV_STAMP)
	$(BIN)/python -m benchmarks --quick

clean:
	rm -rf $(VENV) .simstore .simstore-demo demo-data
