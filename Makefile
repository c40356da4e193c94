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

# Seconds since $$1 (a `date +%s.%N` reading), to a tenth.
SINCE := since() { awk -v a="$$1" -v b="$$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# mypy (cold: ~25 s of one CPU) runs beside the other three (~1 s), its report printed after
# theirs; lint fails when any of the four does.
lint: $(STAMP)
	@$(SINCE); start=$$(date +%s.%N); report=$$(mktemp); status=0; \
	$(BIN)/mypy >$$report 2>&1 & mypy=$$!; \
	$(BIN)/ruff check src plugins tests bench examples fuzz || status=1; \
	$(BIN)/ruff format --check src plugins tests bench examples fuzz || status=1; \
	$(BIN)/lint-imports --no-logo || status=1; \
	wait $$mypy || status=1; cat $$report; rm -f $$report; \
	echo "lint: $$(since $$start) s"; exit $$status

# The suite in two phases, each printing its slowest 15 tests. First every test not marked
# `serial`, on WORKERS pytest-xdist workers. worksteal: an idle worker takes half of another's
# queue, so no long file is left running alone at the end. Three workers on two cores: much of
# the suite waits (servers starting, deadlines, sleeps) and a third keeps both CPUs busy. Then
# the `serial` tests alone in one process: they bound a time of a few ms (event-loop stalls,
# deadline overruns, latency ratios), and a second process on two cores broke such a bound
# (2.9 ms against 2 ms). The first phase names the files holding serial tests (tests/
# conftest.py), so the second collects only those (all of tests/ if the list is empty; pytest's
# exit status 5, no test selected, is no failure). Both phases always run, and the last line
# gives each one's wall time. No test uses the pytest plugins of langsmith (a langchain
# dependency) and, in the serial phase, of schemathesis: importing them cost each pytest
# process ~2 s of CPU before its first test.
PYTEST := $(BIN)/python -m pytest -q --durations=15 -p no:langsmith_plugin
WORKERS ?= 3

# The tests write Python's bytecode caches (__pycache__, git-ignored) even where the
# environment says not to (PYTHONDONTWRITEBYTECODE=1 here): else each of the suite's Python
# processes compiles toolrelay and the tests anew (~0.2 s of CPU a start, ~6 s a collection).
test test-fast test-latest: export PYTHONDONTWRITEBYTECODE =

test: $(STAMP)
	@$(SINCE); start=$$(date +%s.%N); $(MAKE) --no-print-directory lint || exit 1; \
	lint=$$(since $$start); bash .ci/install-servers; \
	serial=$$(mktemp); status=0; start=$$(date +%s.%N); set -x; \
	TOOLRELAY_SERIAL_FILES=$$serial $(PYTEST) -n $(WORKERS) --dist worksteal -m "not serial" \
		|| status=1; \
	{ set +x; } 2>/dev/null; parallel=$$(since $$start); start=$$(date +%s.%N); set -x; \
	$(PYTEST) -p no:schemathesis -m serial $$(cat $$serial) || [ $$? -eq 5 ] || status=1; \
	{ set +x; } 2>/dev/null; rm -f $$serial; \
	echo "make test: lint $$lint s, parallel phase ($(WORKERS) workers) $$parallel s," \
		"serial phase $$(since $$start) s"; exit $$status

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
