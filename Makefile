.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= $(or $(MIXREG_HOST),127.0.0.1)
PORT ?= $(or $(MIXREG_PORT),8000)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

.PHONY: install
install: $(VENV)/.installed ## create .venv and install the project with test and dev tools

.PHONY: serve
serve: install ## upgrade the database to the newest migration and serve on $(HOST):$(PORT)
	$(BIN)/mixreg db upgrade
	$(BIN)/mixreg serve --host $(HOST) --port $(PORT)

.PHONY: test
# Two processes, a test file in one at a time (its servers and fixtures stay together): most
# end-to-end tests wait on servers they start, so two overlap well even on two cores.
test: install chromium ## run the whole test suite
	$(BIN)/python -m pytest -n 2 --dist loadfile

# The web page's test screenshots it in Debian's headless Chromium.
.PHONY: chromium
chromium: ## install Debian's chromium (for the web page's browser test) when it is missing
	@if [ -x /usr/bin/chromium ]; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's chromium for the web page's browser test (apt-get)"; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium \
			|| echo "could not install chromium: the browser test skips (fails under CI=true)"; \
	else \
		echo "no apt-get: install chromium yourself, or the browser test skips (fails under CI=true)"; \
	fi

.PHONY: bench
bench: install ## run the benchmarks and write bench/RESULTS.md
	$(BIN)/python -m bench.algorithms
	$(MAKE) --no-print-directory bench-peers
	$(MAKE) --no-print-directory bench-scaleout
	$(MAKE) --no-print-directory bench-serving
	$(MAKE) --no-print-directory bench-load
	$(MAKE) --no-print-directory bench-registry

.PHONY: bench-registry
bench-registry: install ## predict by name@alias beside by id; alias switch time seen by clients
	$(BIN)/python -m bench.registry

.PHONY: bench-load
bench-load: install ## 60 s of 32 clients (predicts, fits, listings) on SQLite and PostgreSQL, with keys
	$(BIN)/python -m bench.load --duration 60 --clients 32 --write

.PHONY: bench-scaleout
bench-scaleout: install ## fits per minute: embedded worker, 1 and 2 Procrastinate workers (PostgreSQL)
	$(BIN)/python -m bench.scaleout

.PHONY: bench-serving
bench-serving: install ## predict throughput beside a bare endpoint, batches, big uploads (installs wrk)
	@command -v wrk >/dev/null 2>&1 || { \
		echo "installing Debian's wrk for the serving benchmark (apt-get)"; \
		apt-get update -qq && apt-get install -y -qq wrk \
			|| echo "could not install wrk: the benchmark uses an async httpx loop instead"; }
	$(BIN)/python -m bench.serving

.PHONY: bench-peers
bench-peers: install ## mixreg beside R's flexmix and mixtools (installs R if missing)
	sh bench/peers_r/install_r.sh
	$(BIN)/python -m bench.peers

.PHONY: lint
lint: install ## ruff check and format check
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

.PHONY: format
format: install ## format the code with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

.PHONY: typecheck
typecheck: install ## mypy (strict) over the source packages
	$(BIN)/mypy mixreg service models_store mixreg_client

.PHONY: clean
clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: help
help: ## show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'
