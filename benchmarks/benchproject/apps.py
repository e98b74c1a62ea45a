from django.apps import AppConfig


class BenchprojectConfig(AppConfig):
    name = "benchmarks.benchproject"
    label = "benchproject"
    default_auto_field = "django.db.models.BigAutoField"
