# One virtual environment for everything; torch is installed first from the local CPU wheel.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: run test lint install test-docker bench bench-stale clean

$(STAMP): pyproject.toml clients/python/pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet -e ./clients/python
	touch $(STAMP)

install: $(STAMP)

## run: train a demo model on generated data (once) and serve it on http://127.0.0.1:8000 (PORT=… for another)
run: $(STAMP)
	$(if $(PORT),OVEX_PORT=$(PORT) )$(VENV)/bin/ovex demo

## test: lint, type-check, check the import layers and run the test suite
test: $(STAMP)
	$(VENV)/bin/ruff check trainer service tests bench clients
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache  # its cache once went stale and reported cycles long gone
	$(VENV)/bin/pytest -q -n 2 --dist worksteal  # two workers; an idle one takes tests queued for the other

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

## bench: rerun the full profile (every results file README.md and docs/ cite, but the GPU's own rows; at most
##   45 minutes) on the current code, into bench/results; the records of decisions run on demand with ONLY=name
##   QUICK=1: the small profile of every script (under 10 minutes) into a scratch directory; STALE=1: only
##   stale results; ONLY=a,b: the benchmarks named (`.venv/bin/python bench/suite.py plan [--only a,b]`)
bench: $(STAMP)
	$(PY) bench/suite.py run $(if $(QUICK),--quick )$(if $(STALE),--stale )$(if $(ONLY),--only $(ONLY) )$(if $(RESULTS),--results $(RESULTS))
	$(if $(QUICK),,$(PY) scripts/figures.py --write)

## bench-stale: list the results files older than the code they measure
bench-stale: $(STAMP)
	$(PY) bench/suite.py stale

## test-docker: lint, build and run the docker compose stack end to end (needs a Docker engine)
test-docker:
	scripts/test-docker.sh
