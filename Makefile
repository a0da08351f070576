.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= $(or $(MIXREG_HOST),127.0.0.1)
PORT ?= $(or $(MIXREG_PORT),8000)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# requirements.lock pins every dependency (the image installs with it too).
$(VENV)/.installed: pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/python -m pip install --quiet --constraint requirements.lock -e '.[dev]'
	touch $@

# Serving needs only the runtime (the `server` extra); `make install` adds the test and dev tools.
$(VENV)/.installed-server: pyproject.toml requirements.lock | $(BIN)/python
	$(BIN)/python -m pip install --quiet --constraint requirements.lock -e '.[server]'
	touch $@

.PHONY: install
install: $(VENV)/.installed ## create .venv and install the project with test and dev tools

.PHONY: install-server
install-server: $(VENV)/.installed-server ## create .venv and install the server's runtime only

.PHONY: serve
serve: install-server ## upgrade the database to the newest migration and serve on $(HOST):$(PORT)
	$(BIN)/mixreg db upgrade
	$(BIN)/mixreg serve --host $(HOST) --port $(PORT)

.PHONY: lock
lock: ## pin every dependency anew in requirements.lock (from a fresh virtual environment)
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e '.[dev]'
	{ sed -n '1,/^[^#]/{/^#/p}' requirements.lock; \
	  .lock-venv/bin/python -m pip freeze --exclude-editable; } > requirements.lock.new
	mv requirements.lock.new requirements.lock
	rm -rf .lock-venv
	$(MAKE) --no-print-directory lock-image

# The image's platform: CPython 3.11 on x86-64 glibc Linux (python:3.11-slim).
IMAGE_WHEELS := --only-binary :all: --python-version 3.11 --implementation cp \
	--abi cp311 --abi abi3 --abi none --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform linux_x86_64

.PHONY: lock-image
lock-image: ## hash the image's wheels (requirements.lock's versions) into requirements-image.lock
	rm -rf .lock-wheels
	$(PYTHON) -m pip download --quiet $(IMAGE_WHEELS) --constraint requirements.lock \
		--dest .lock-wheels '.[server]' 'setuptools>=68'
	$(PYTHON) deploy/image_lock.py .lock-wheels requirements.lock > requirements-image.lock.new
	mv requirements-image.lock.new requirements-image.lock
	rm -rf .lock-wheels

.PHONY: image-digests
image-digests: ## print the digests the base images' tags point at now (to move the pins)
	@for image in python:3.11-slim postgres:16 caddy:2; do \
		printf '%s@' "$$image"; \
		docker buildx imagetools inspect "$$image" --format '{{json .Manifest.Digest}}' | tr -d '"'; \
	done

.PHONY: test
# Two processes, a test file in one at a time (its servers and fixtures stay together): most
# end-to-end tests wait on servers they start, so two overlap well even on two cores. Files go
# out in collection order (tests/e2e early), not xdist's default of most tests first, which
# sent the long end-to-end files (few tests each) last and left one process running them
# alone at the end of the run.
test: install chromium docker-compose ## run the whole test suite
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder

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

# The deployment test validates docker-compose.yml with Debian's docker-compose, which needs no
# container engine for `config`.
.PHONY: docker-compose
docker-compose: ## install Debian's docker-compose (to validate docker-compose.yml) when missing
	@if command -v docker-compose >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
		echo "installing Debian's docker-compose to validate docker-compose.yml (apt-get)"; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-compose \
			|| echo "could not install docker-compose: the deployment test skips (fails under CI=true)"; \
	else \
		echo "no apt-get: install docker-compose yourself, or the deployment test skips (fails under CI=true)"; \
	fi

.PHONY: bench
bench: install ## run the benchmarks and write bench/RESULTS.md
	$(BIN)/python -m bench.algorithms
	$(MAKE) --no-print-directory bench-awkward
	$(MAKE) --no-print-directory bench-hard
	$(MAKE) --no-print-directory bench-peers
	$(MAKE) --no-print-directory bench-likelihood
	$(MAKE) --no-print-directory bench-scaleout
	$(MAKE) --no-print-directory bench-keyed
	$(MAKE) --no-print-directory bench-serving
	$(MAKE) --no-print-directory bench-load
	$(MAKE) --no-print-directory bench-registry
	$(MAKE) --no-print-directory bench-hostile

.PHONY: bench-hostile
bench-hostile: install ## small hostile requests (npz and JSON predict bodies, kept texts, long keys, killed parsers) and alias hot swaps
	$(BIN)/python -m bench.hostile

.PHONY: bench-registry
bench-registry: install wrk ## predict by name@alias beside by id; alias switch time seen by clients (installs wrk)
	$(BIN)/python -m bench.registry

.PHONY: bench-awkward
bench-awkward: install ## offsets, mixed scales, wide data (p up to 1,000) and a dozen rows
	$(BIN)/python -m bench.awkward
.PHONY: bench-hard
bench-hard: install ## the default on hard sets (many lines, 10^4-10^5 rows) beside long searches (cached)
	$(BIN)/python -m bench.hard_cases

.PHONY: bench-load
bench-load: install ## 32 clients at 2 requests/s each (predicts, fits, listings) on SQLite and PostgreSQL, with keys: 60 s, then big bodies
	$(BIN)/python -m bench.load --duration 60 --clients 32 --big-bodies --write

.PHONY: bench-scaleout
bench-scaleout: install ## fits per minute: embedded worker, 1 and 2 Procrastinate workers (PostgreSQL)
	$(BIN)/python -m bench.scaleout

.PHONY: bench-streamed
bench-streamed: install ## fits streamed over row chunks on disk (10^6, 10^7 rows, k = 4, d = 20) beside in-memory and on a LocalCluster of 1 and 2 workers
	$(BIN)/python -m bench.streamed

.PHONY: bench-keyed
bench-keyed: install ## keyed fits: 10^5 accounts x 200 ratings vs a loop of the default fit, the job on 1 and 2 workers (PostgreSQL); keyed predict among 10^6 keys
	$(BIN)/python -m bench.keyed
	$(MAKE) --no-print-directory bench-keyed-memory

.PHONY: bench-keyed-memory
bench-keyed-memory: install ## a keyed job's peak memory per process, data many times a shard: 20,000 accounts x 200 ratings on 2 workers (PostgreSQL)
	$(BIN)/python -m bench.keyed --memory --accounts 20000 --keys-per-shard 1250 --global-rows 200000

.PHONY: bench-serving
bench-serving: install wrk ## predict throughput beside a bare endpoint, batches, big uploads (installs wrk)
	$(BIN)/python -m bench.serving

# The serving and registry benchmarks load the server with wrk (a Python load loop saturates
# the same two cores and makes their ratios noisy).
.PHONY: wrk
wrk: ## install Debian's wrk (for the serving and registry benchmarks) when it is missing
	@command -v wrk >/dev/null 2>&1 || { \
		echo "installing Debian's wrk for the serving and registry benchmarks (apt-get)"; \
		apt-get update -qq && apt-get install -y -qq wrk \
			|| echo "could not install wrk: the benchmarks use an async httpx loop instead"; }

.PHONY: bench-peers
bench-peers: install ## mixreg beside R's flexmix and mixtools (installs R if missing)
	sh bench/peers_r/install_r.sh
	$(BIN)/python -m bench.peers

.PHONY: bench-likelihood
bench-likelihood: install ## the likelihood behind SEs, BIC and the chosen k beside flexmix; k sweeps (installs R if missing)
	sh bench/peers_r/install_r.sh
	$(BIN)/python -m bench.likelihood

.PHONY: bench-peers-gated
bench-peers-gated: install ## gated mixtures beside flexmix's FLXPmultinom (installs R if missing)
	sh bench/peers_r/install_r.sh
	$(BIN)/python -m bench.peers_gated

.PHONY: bench-peers-grouped
bench-peers-grouped: install ## grouped fits beside flexmix's y ~ x | g (installs R if missing)
	sh bench/peers_r/install_r.sh
	$(BIN)/python -m bench.peers_grouped

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
