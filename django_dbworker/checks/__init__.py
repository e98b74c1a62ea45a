"""System checks (``dbworker.E001`` …) and the handler validation commands reuse.

Importing the package registers them (the app config does): ``settings`` (the
``DBWORKER`` setting, E103), ``handlers`` (each handler; the connection budget),
``job_models`` (the concrete job models), ``consumers`` (the consumers).
"""

from .consumers import check_consumers
from .handlers import check_connection_budget, check_settings_and_handlers, validate_handler
from .job_models import SUPPORTED_VENDORS, check_job_models, concrete_job_parent
from .settings import BACKEND_CHECKS, tasks_app_missing

__all__ = [
    "BACKEND_CHECKS",
    "SUPPORTED_VENDORS",
    "check_connection_budget",
    "check_consumers",
    "check_job_models",
    "check_settings_and_handlers",
    "concrete_job_parent",
    "tasks_app_missing",
    "validate_handler",
]
