"""Create the example project's PostgreSQL (or MariaDB) database when it does not
exist yet.

``make demo`` runs it before ``migrate``, so ``DATABASE_URL=postgres://…/name make
demo`` works on a server where ``name`` was never created. On SQLite there is
nothing to do: ``migrate`` creates the file.
"""

import warnings

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections


class Command(BaseCommand):
    help = "Create the example project's PostgreSQL database if it does not exist."
    # Django's model checks on MariaDB connect to the database this command creates.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser):
        parser.add_argument("--database", default="default", help="Database alias.")

    def handle(self, *args, **options):
        connection = connections[options["database"]]
        if connection.vendor == "mysql":
            return self.create_on_mariadb(connection)
        if connection.vendor != "postgresql":
            return
        settings = connection.settings_dict
        name = settings["NAME"]
        host, port = settings["HOST"] or "localhost", settings["PORT"] or 5432
        createdb = f"createdb -h {host} -p {port}" + (
            f" -U {settings['USER']}" if settings["USER"] else ""
        )
        try:
            with warnings.catch_warnings():
                # Django's way in when the database itself may not exist: the server's
                # maintenance database. Its warning about falling back to the project's
                # database (the one that is missing) is noise here.
                warnings.simplefilter("ignore", RuntimeWarning)
                with connection._nodb_cursor() as cursor:
                    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                    if cursor.fetchone():
                        self.stdout.write(f"PostgreSQL database {name!r} on {host}:{port} exists")
                        return
                    cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
        except DatabaseError as exc:
            message = " ".join(str(exc).split())
            raise CommandError(
                f"cannot create PostgreSQL database {name!r} on {host}:{port}: {message}; "
                f"create it yourself (`{createdb} {name}`) or check DATABASE_URL"
            ) from exc
        self.stdout.write(f"created PostgreSQL database {name!r} on {host}:{port}")

    def create_on_mariadb(self, connection):
        name = connection.settings_dict["NAME"]
        try:
            with connection._nodb_cursor() as cursor:
                cursor.execute(
                    f"CREATE DATABASE IF NOT EXISTS {connection.ops.quote_name(name)} "
                    "CHARACTER SET utf8mb4"
                )
        except DatabaseError as exc:
            message = " ".join(str(exc).split())
            raise CommandError(
                f"cannot create MariaDB database {name!r}: {message}; create it yourself "
                "or check DATABASE_URL"
            ) from exc
        self.stdout.write(f"MariaDB database {name!r} is there")
