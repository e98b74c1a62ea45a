# The two 0009 migrations of main (issue 43's second job table, the claims' waiting
# index) merged: without it ``migrate`` refuses the benchmark project.

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("benchproject", "0009_claims_skip_waiting_jobs"),
        ("benchproject", "0009_other_bench_job"),
    ]

    operations = []
