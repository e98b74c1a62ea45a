#!/usr/bin/env bash
# Run the test suite on SQLite (unless DBWORKER_TEST_SQLITE=0), then on MariaDB if
# DBWORKER_TEST_MARIADB_URL is set, then on PostgreSQL whenever one is reachable.
#
#   tests/run.sh [pytest args]
#
# PostgreSQL: $DATABASE_URL if set; otherwise a local server on 127.0.0.1:5432
# (started with pg_ctlcluster when it is installed but down). Under CI=true a
# missing PostgreSQL fails the run instead of being skipped. pytest's exit code
# 5 ("no tests ran") counts as a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

run_suite() {  # $1: label, $2: DATABASE_URL ("" for SQLite)
    echo "=== tests on $1 ($("$PYTHON" -c 'import django, sys; print(f"Python {sys.version.split()[0]}, Django {django.__version__}")'))"
    if [ -n "$2" ]; then
        DATABASE_URL="$2" "$PYTHON" -m pytest "${PYTEST_ARGS[@]}"
    else
        env -u DATABASE_URL "$PYTHON" -m pytest "${PYTEST_ARGS[@]}"
    fi
    local code=$?
    if [ "$code" -eq 5 ]; then echo "pytest ran no tests on $1: failing"; return 1; fi
    return "$code"
}

find_postgres() {
    if [ -n "${DATABASE_URL:-}" ]; then echo "$DATABASE_URL"; return 0; fi
    local url="postgres://postgres@127.0.0.1:5432/dbworker"
    if command -v pg_isready >/dev/null && ! pg_isready -q -h 127.0.0.1 -p 5432; then
        if command -v pg_ctlcluster >/dev/null && command -v pg_lsclusters >/dev/null; then
            local version
            version=$(pg_lsclusters -h 2>/dev/null | awk '{print $1; exit}')
            [ -n "$version" ] && pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true
            for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
        fi
    fi
    if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
        echo "$url"; return 0
    fi
    "$PYTHON" - "$url" <<'PY' >/dev/null 2>&1 && { echo "$url"; return 0; }
import sys, psycopg
psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=3).close()
PY
    return 1
}

PYTEST_ARGS=("$@")
# The suite waits on workers, subprocesses and clocks far more than it computes: pytest-xdist
# runs it in DBWORKER_TEST_PROCESSES processes (default 4, on 2 cores about 3.5 times
# faster; each has its own test database). 0 runs it in this process.
# --dist loadgroup: the tests of one xdist_group run in one process (the two-database
# tests share the second PostgreSQL server that process starts, tests/clusters.py);
# the others are spread as with the default --dist load.
PYTEST_ARGS=(-n "${DBWORKER_TEST_PROCESSES:-4}" --dist loadgroup "${PYTEST_ARGS[@]}")
# Coverage of the package, reported after each run (CI sets DBWORKER_COVERAGE=1).
if [ -n "${DBWORKER_COVERAGE:-}" ]; then
    PYTEST_ARGS=(--cov=django_dbworker --cov-report=term:skip-covered "${PYTEST_ARGS[@]}")
fi
status=0
# DBWORKER_TEST_SQLITE=0 leaves SQLite out (CI's older Django runs PostgreSQL only).
if [ "${DBWORKER_TEST_SQLITE:-1}" != 0 ]; then
    run_suite SQLite "" || status=1
fi

# MariaDB, when DBWORKER_TEST_MARIADB_URL names a database (mysql://root@127.0.0.1:3306/
# dbworker; the database must exist: Django's checks connect to it, not only to test_…).
if [ -n "${DBWORKER_TEST_MARIADB_URL:-}" ]; then
    run_suite MariaDB "$DBWORKER_TEST_MARIADB_URL" || status=1
fi

if pg_url=$(find_postgres); then
    run_suite PostgreSQL "$pg_url" || status=1
elif [ "${CI:-}" = "true" ]; then
    echo "CI=true but no PostgreSQL is reachable (set DATABASE_URL): failing"
    status=1
else
    echo "=== PostgreSQL not reachable: suite ran on SQLite only (set DATABASE_URL to include it)"
fi
exit $status
