# Two entry points for a fresh machine; each creates .venv and installs what it needs.
#   make demo   run the example project's worker with demo jobs (SQLite, or DATABASE_URL)
#   make test   run the test suite on SQLite, and on PostgreSQL when reachable
PYTHON ?= python3
VENV ?= .venv
DJANGO ?=
DEMO_JOBS ?= 20
DEMO_SECONDS ?= 60

BIN := $(VENV)/bin
# mysqlclient (MariaDB: DATABASE_URL=mysql://...) builds only against its C library:
# the `mysql` dependency group is added where pkg-config finds one.
MYSQL_GROUP := $(shell (pkg-config --exists libmariadb || pkg-config --exists mysqlclient) 2>/dev/null && echo "--group mysql")
# The commands `make demo` prints at the end need the same database as the demo.
DEMO_ENV := $(if $(DATABASE_URL),DATABASE_URL='$(DATABASE_URL)' )

.PHONY: demo test unit lint install

# The demo needs the `example` dependency group only (django-environ, psycopg); tests
# and lint need the `dev` group (pytest, Playwright, mypy...; groups need pip >= 25.1).
$(BIN)/.venv:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	touch $@

$(BIN)/.installed-example: pyproject.toml $(BIN)/.venv
	$(BIN)/python -m pip install --quiet -e . --group example $(MYSQL_GROUP) $(if $(DJANGO),"$(DJANGO)")
	touch $@

$(BIN)/.installed-dev: pyproject.toml $(BIN)/.venv
	$(BIN)/python -m pip install --quiet -e . --group dev $(MYSQL_GROUP) $(if $(DJANGO),"$(DJANGO)")
	touch $@

install: $(BIN)/.installed-dev

demo: $(BIN)/.installed-example
	$(BIN)/python manage.py create_demo_database
	$(BIN)/python manage.py migrate --verbosity 0
	$(BIN)/python manage.py enqueue_demo_jobs $(DEMO_JOBS) --tasks
	$(BIN)/python manage.py runworker example_project.example.workers.ExampleHandler --tasks --until-done --max-time $(DEMO_SECONDS)
	$(BIN)/python manage.py dbworker_status
	@echo
	@echo "Follow the jobs in the admin (counts per state, each job's execution log, the workers):"
	@echo "  $(DEMO_ENV)$(BIN)/python manage.py create_demo_superuser   # user 'admin', prints its password"
	@echo "  $(DEMO_ENV)$(BIN)/python manage.py runserver               # then open http://127.0.0.1:8000/admin/"
	@echo "and, in another terminal, watch new jobs run:"
	@echo "  $(DEMO_ENV)$(BIN)/python manage.py enqueue_demo_jobs 50 && $(DEMO_ENV)$(BIN)/python manage.py runworker"

test: $(BIN)/.installed-dev
	PYTHON=$(BIN)/python tests/run.sh

# The fast tier: pure logic, no database (seconds).
unit: $(BIN)/.installed-dev
	$(BIN)/python -m pytest tests/unit -q

lint: $(BIN)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	DJANGO_SETTINGS_MODULE=tests.settings $(BIN)/python -m django makemigrations --check --dry-run
	DJANGO_SETTINGS_MODULE=benchmarks.benchproject.settings $(BIN)/python -W ignore::RuntimeWarning -m django makemigrations --check --dry-run
	$(BIN)/python manage.py makemigrations --check --dry-run
