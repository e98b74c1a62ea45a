"""Integrations with other tools, each optional (``prometheus``: metrics)."""

#: Set in the environment of the worker processes of a supervisor that serves metrics:
#: they write their figures for it (``prometheus.SupervisorMetrics``).
METRICS_CHILD = "DBWORKER_METRICS_CHILD"
