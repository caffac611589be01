# The single entry point. CI calls `make test` and nothing else.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.demo-installed

BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: venv java browser demo test lint bench bench-full bench-parts chaos cluster docs clean

venv: $(STAMP)

# make test: the package with every extra and the test tools
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all,dev]'
	@touch $(STAMP)

# make demo: the package with its extras (Spark for the main job, the console)
$(DEMO_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[all]'
	@touch $(DEMO_STAMP)

# Spark needs a JVM. Install Java 17 when it is missing and we may (root).
java:
	@if ! command -v java >/dev/null 2>&1; then \
		if [ "$$(id -u)" = "0" ]; then \
			echo "java not found: installing openjdk-17-jre-headless"; \
			apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y openjdk-17-jre-headless; \
		else \
			echo "java not found and not root: install a Java 17 runtime first" >&2; exit 1; \
		fi; \
	fi

# The console's browser tests need Debian's chromium; installed like Java when missing.
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = "0" ]; then \
			echo "chromium not found: installing Debian's chromium"; \
			apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
		else \
			echo "chromium not found and not root: install Debian's chromium first" >&2; exit 1; \
		fi; \
	fi

demo: $(DEMO_STAMP) java
	$(VENV)/bin/raydelay demo

test: venv java browser
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict  # into site/; a broken link fails
	$(PY) -m pytest -q

lint: venv
	$(VENV)/bin/ruff check raydelay tests bench
	$(VENV)/bin/ruff format --check raydelay tests bench
	$(VENV)/bin/mypy

chaos: venv
	CHAOS_MESSAGES=500000 CHAOS_SECONDS=300 $(PY) -m pytest -q -s --timeout 3600 tests/chaos -p no:cacheprovider
	$(MAKE) cluster

# The multi-node tier: a head and 3 workers (ray.cluster_utils) over SeaweedFS, one failure
# per test; about 2 minutes each. RAYDELAY_CLUSTER_RESULTS=<file> keeps each run's figures.
cluster: venv
	RAYDELAY_CLUSTER_TIER=1 $(PY) -m pytest -q -s --timeout 3600 tests/cluster -p no:cacheprovider

# The side-by-side suites (bench/compare.py) also need the Redis client and matplotlib;
# the bench script installs Debian's redis-server itself when it is missing.
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[all,dev,bench]'
	@touch $(BENCH_STAMP)

# A few minutes: raydelay against Redis and heapq -> bench/results/<date>-quick.md + plots;
# then Spark-on-Ray ingestion against a driver loop -> bench/results/<date>-ingest.md;
# then the HTTP API against the Python client, and what keys cost (tables on stdout).
bench: $(BENCH_STAMP)
	$(PY) bench/compare.py --suite quick
	$(PY) bench/ingest_bench.py --rows 1000000 --out bench/results/$$(date +%F)-ingest.md
	$(PY) bench/http_bench.py --rounds 3
	$(PY) bench/keys_bench.py

# About an hour: adds 10M / 50M pending, recovery at 10M and 100M in one subscription.
bench-full: $(BENCH_STAMP)
	$(PY) bench/compare.py --suite full

# About 15 minutes: scheduled Ray calls (#29) against Celery ETA tasks on Redis ->
# bench/results/<date>-tasks.md (TASKS_ARGS=--quick: about 3 minutes).
.PHONY: bench-tasks
bench-tasks: $(BENCH_STAMP)
	$(PY) bench/tasks_bench.py $(TASKS_ARGS)

# raydelay's own component benchmarks (each prints its table).
bench-parts: venv
	$(PY) bench/tracker_bench.py
	$(PY) bench/e2e_bench.py
	$(PY) bench/recovery_bench.py
	$(PY) bench/ingest_bench.py
	$(PY) bench/drain_buckets.py
	$(PY) bench/drain_core.py
	$(PY) bench/merge_bench.py
	$(PY) bench/key_shared.py

# The docs site on http://127.0.0.1:8000, rebuilt as docs/ change.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

clean:
	rm -rf $(VENV) site .raydelay .pytest_cache .hypothesis
