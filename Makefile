# Every target creates or refreshes .venv first, so a fresh clone needs nothing but python3 (3.11+).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
K8S_TOOLS := $(CURDIR)/.cache/k8s-tools
export PATH := $(K8S_TOOLS)/helm:$(K8S_TOOLS)/kubectl:$(CURDIR)/$(BIN):$(PATH)

.PHONY: demo test lint bench soak install clean lock

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[operator,test,dev,demo]'
	touch $(STAMP)

install: $(STAMP)

## make demo: the main job on an embedded PostgreSQL (or on $SKIPLOCK_DSN / $DATABASE_URL when set)
demo: $(STAMP)
	$(BIN)/skiplock demo

## make test: lint, then the whole suite against a real PostgreSQL (SKIPLOCK_TEST_DSN, Docker, or embedded)
test: $(STAMP)
	bash tools/get-k8s-tools.sh >/dev/null
	$(MAKE) --no-print-directory lint
	$(BIN)/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	bash tools/check-layout.sh
	$(BIN)/ruff check worker operator tests bench
	$(BIN)/mypy
	cd $(CURDIR) && PYTHONPATH=worker:operator $(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python bench/run.py $(BENCH_ARGS)

soak: $(STAMP)
	$(BIN)/pytest -q -m soak tests/chaos

## make lock: pin the image's dependencies with their sha256 (requirements/*.lock; needs the package index).
## Kept pins stay; LOCK_ARGS=--upgrade moves them to the newest allowed versions.
LOCK = $(BIN)/uv pip compile pyproject.toml --quiet --generate-hashes --universal --python-version 3.11 \
	--custom-compile-command 'make lock' $(LOCK_ARGS)
lock: $(STAMP)
	$(BIN)/pip install -q 'uv>=0.5'
	$(LOCK) --extra operator -o requirements/operator.lock
	$(LOCK) --constraint requirements/operator.lock -o requirements/worker.lock

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
