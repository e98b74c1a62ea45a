"""A handler module whose own dependency is not installed (a ModuleNotFoundError
that is not about the handler's path)."""

import dbworker_no_such_dependency  # type: ignore[import-not-found]  # noqa: F401 - the point

from django_dbworker import Handler


class SomeHandler(Handler):  # pragma: no cover - never reached
    pass
