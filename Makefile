PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

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

test: lint
	bash .ci/install-servers
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
