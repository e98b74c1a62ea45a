"""The router of the suite's two-database runs (``DBWORKER_TEST_SECOND_URL``, tests/clusters.py):
the models of ``ROUTED`` live on the alias ``second``, a PostgreSQL server of their own,
everything else on ``default``, as docs/operations.md § Several databases tells users to
split. The package's own apps migrate on both: each database that holds job tables holds
the package's tables beside them."""

from __future__ import annotations

SECOND = "second"
#: Job models (and the tasks backend's table) whose rows live on ``second``.
ROUTED = frozenset({"testapp.tenantjob", "testapp.reportjob", "dbworker_tasks.taskjob"})
#: Apps with tables on every database that holds job tables.
EVERYWHERE = frozenset({"django_dbworker", "dbworker_tasks"})


class SecondRouter:
    def db_for_read(self, model, **hints):
        return SECOND if model._meta.label_lower in ROUTED else None

    def db_for_write(self, model, **hints):
        return SECOND if model._meta.label_lower in ROUTED else None

    def allow_relation(self, obj1, obj2, **hints):
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        if app_label in EVERYWHERE:
            return True
        if model_name is not None and f"{app_label}.{model_name}" in ROUTED:
            return db == SECOND
        return db != SECOND
