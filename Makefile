PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

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

# Two workers (one per core); a file's tests stay on one worker, so a module's shared server
# starts once. The slowest 15 tests are printed at the end of every run.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile --durations=15

test: lint
	bash .ci/install-servers
	$(PYTEST)

# The inner loop: no real servers, no soak.
test-fast: $(STAMP)
	$(PYTEST) -m "not servers and not soak"

bench: $(STAMP)
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
