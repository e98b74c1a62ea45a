from django.db import migrations

#: A collation that compares byte for byte, trailing spaces included (MariaDB >= 10.2).
BINARY = "utf8mb4_nopad_bin"


def alter(apps, schema_editor, collation):
    if schema_editor.connection.vendor != "mysql":
        return
    table = apps.get_model("django_dbworker", "RateBucket")._meta.db_table
    quote = schema_editor.quote_name
    spec = "VARCHAR(255)"
    if collation is not None:
        spec += f" CHARACTER SET utf8mb4 COLLATE {collation}"
    schema_editor.execute(
        f"ALTER TABLE {quote(table)} MODIFY {quote('name')} {spec} NOT NULL, "
        f"MODIFY {quote('key')} {spec} NOT NULL"
    )


def binary_keys(apps, schema_editor):
    """On MariaDB a rate bucket's name and key compare byte for byte, as on PostgreSQL
    and SQLite: in the database's collation (utf8mb4_general_ci, _unicode_ci) the keys
    "a", "A" and "a " were one bucket (the unique index that ``ON DUPLICATE KEY
    UPDATE`` spends a bucket through found "A" for "a"), and a claim's comparison of a
    job's key with a bucket's could mix two collations (error 1267)."""
    alter(apps, schema_editor, BINARY)


def database_collation(apps, schema_editor):
    """Back to the table's default collation. Keys that differ only there would collide
    in the unique index: the buckets go first (a bucket without its row is full)."""
    if schema_editor.connection.vendor == "mysql":
        table = apps.get_model("django_dbworker", "RateBucket")._meta.db_table
        schema_editor.execute(f"DELETE FROM {schema_editor.quote_name(table)}")
    alter(apps, schema_editor, None)


class Migration(migrations.Migration):
    atomic = False  # DDL on MariaDB (no transactional DDL there)

    dependencies = [
        ("django_dbworker", "0012_workerprocess_threads_view_metrics"),
    ]

    operations = [migrations.RunPython(binary_keys, database_collation)]
