"""A minimal Django project for the benchmark: one job model, no-op handlers."""
