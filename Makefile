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
test: install ## run the whole test suite
	$(BIN)/python -m pytest

.PHONY: bench
bench: install ## run the benchmarks and write bench/RESULTS.md
	$(BIN)/python -m bench.algorithms
	$(MAKE) --no-print-directory bench-peers

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
	$(BIN)/mypy mixreg service models_store

.PHONY: clean
clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: help
help: ## show this help
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  %-10s %s\n", $$1, $$2}'
