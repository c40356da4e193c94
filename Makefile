PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-latest lint bench dist clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,cli]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/toolrelay demo

lint: $(STAMP)
	$(BIN)/ruff check src plugins tests bench examples fuzz
	$(BIN)/ruff format --check src plugins tests bench examples fuzz
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo

# The whole suite runs on one worker: several tests bound event-loop stalls and deadline
# overruns to a few ms, and a second worker on a 2-core machine breaks those bounds (seen:
# 2.9 ms against 2 ms). The slowest 15 tests are printed at the end of every run.
PYTEST := $(BIN)/python -m pytest -q --durations=15

test: lint
	bash .ci/install-servers
	$(PYTEST)

# The inner loop: no real servers, no soak, two workers (timing bounds may be loose here).
test-fast: $(STAMP)
	$(PYTEST) -n 2 --dist loadfile -m "not servers and not soak and not slow"

# The whole suite on the newest releases our upper bounds refuse (the bounds mark the libraries
# whose internals toolrelay._compat uses): a separate venv, pyproject's requirements with their
# `<X` bounds removed, upgraded, then the project itself without its pinned dependencies.
LATEST := .venv-latest

test-latest:
	$(PY) -m venv $(LATEST)
	$(LATEST)/bin/pip install --quiet --upgrade pip
	$(PY) .ci/unbounded-requirements dev cli > $(LATEST)/requirements.txt
	$(LATEST)/bin/pip install --quiet --upgrade -r $(LATEST)/requirements.txt
	$(LATEST)/bin/pip install --quiet --no-deps -e .
	$(LATEST)/bin/pip list --format=freeze | grep -iE '^(mcp|mcp-types|httpx|httpcore|prometheus.client|starlette|uvicorn|anyio)=='
	bash .ci/install-servers
	$(LATEST)/bin/python -m pytest $(PYTEST_ARGS)

# The wheel and the sdist in dist/, built offline by hatchling (a dev dependency), for
# `pip install 'dist/toolrelay-<version>-py3-none-any.whl[langchain]'` elsewhere.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m hatchling build -d dist

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) $(LATEST) dist .pytest_cache .mypy_cache .ruff_cache
