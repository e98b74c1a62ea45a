"""The SQL layer: every statement the engine runs, per database vendor.

It knows tables, columns, locks and parameters, and nothing of workers or
handlers. Lower than it are only ``states``, ``exceptions``, ``conf`` and
Django; everything else (models, the runtime, maintenance, the admin) builds
on it, never the other way round.

- ``dialects``: what differs between PostgreSQL, SQLite and MariaDB, as SQL
  fragments (``postgresql.py``, ``sqlite.py`` and ``mysql.py`` hold one ``Dialect``
  each; ``mysql_script.py`` runs statements with ``RETURNING`` as three, MariaDB
  having no ``UPDATE … RETURNING``, and ``mysql_locks.py`` a limited claim under its
  named lock);
- ``jobs``: the statements for one job table, written once from the fragments;
- ``rows``: claimed rows to model instances, keys in and out;
- ``registry``: the statements of the worker registry, from the same fragments;
- ``connection``: the worker's private connections, and care of Django's own;
- ``filters``: a ``Q`` compiled into a claim's WHERE clause;
- ``notify``: the enqueue half of the wake-ups (``NOTIFY``).

Parameters are named (``%(worker)s``) and travel as a dict.
"""
