"""A handler module that exists but raises ImportError while being imported.

Only ``import_handler`` imports it (the tests of finding "an ImportError inside a
handler module reads like a wrong path").
"""

from django_dbworker import Handler
from tests.testapp.models import NoSuchModel  # noqa: F401 - the point of this module


class SomeHandler(Handler):  # pragma: no cover - never reached
    pass
