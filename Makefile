# The project's two commands: `make test` and `make demo`. Both set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEV_STAMP := $(VENV)/.installed-dev
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: test demo lint typecheck pytest bench clean

test: $(DEV_STAMP) lint typecheck pytest

demo: $(DEMO_STAMP)
	$(BIN)/leaseguard simulate --plot demo.png

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy --strict leaseguard

pytest: $(DEV_STAMP)
	$(BIN)/pytest

bench: $(DEV_STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	$(BIN)/python bench/redis_ops.py
	$(BIN)/python bench/dynamodb_requests.py

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "leaseguard needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[embedded,cli]'
	touch $@

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache demo.png
