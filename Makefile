# Two entry points for a fresh machine; each creates .venv and installs what it needs.
#   make demo   run the example project's worker on SQLite with demo jobs
#   make test   run the test suite on SQLite, and on PostgreSQL when reachable
PYTHON ?= python3
VENV ?= .venv
DJANGO ?=
DEMO_JOBS ?= 20
DEMO_SECONDS ?= 12

BIN := $(VENV)/bin

.PHONY: demo test lint install

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' $(if $(DJANGO),"$(DJANGO)")
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py enqueue_demo_jobs $(DEMO_JOBS)
	$(BIN)/python manage.py runworker --max-time $(DEMO_SECONDS)
	$(BIN)/python manage.py dbworker_status

test: $(BIN)/.installed
	PYTHON=$(BIN)/python tests/run.sh

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	DJANGO_SETTINGS_MODULE=tests.settings $(BIN)/python -m django makemigrations --check --dry-run
	$(BIN)/python manage.py makemigrations --check --dry-run
