"""``metrics_view``: the gauges read from the database, and this process's enqueued
counter, served from Django itself (for setups with no worker port), to users with the
``django_dbworker.view_metrics`` permission or to a scraper's bearer token."""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import conf
from ..handler import Handler, HandlerImportError, import_handler
from .prometheus_enqueued import ENQUEUED
from .prometheus_gauges import TableGauges

#: What a user needs to read ``metrics_view`` (the gauges of every job model).
METRICS_PERMISSION = "django_dbworker.view_metrics"


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The gauges read from the database and this process's enqueued counter, for a
    URLconf. Served to active users with the ``django_dbworker.view_metrics``
    permission (``METRICS_PERMISSION``; superusers have every permission), or to a
    request whose ``Authorization`` header is ``Bearer <DBWORKER["METRICS_TOKEN"]>``;
    others get 401 (a token is set) or 403. Leaves the request's database connections
    as they are."""
    refused = _refused(request)
    if refused is not None:
        return refused
    registry = CollectorRegistry()
    registry.register(TableGauges(handlers=_configured_handlers, close_connections=False))
    registry.register(ENQUEUED)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _refused(request: HttpRequest) -> HttpResponse | None:
    token = conf.get("METRICS_TOKEN")
    if token:
        given = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(given, f"Bearer {token}".encode()):
            return None
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.has_perm(METRICS_PERMISSION):
        return None
    if token:
        response = HttpResponse(
            "A bearer token is needed.\n", status=401, content_type="text/plain"
        )
        response["WWW-Authenticate"] = 'Bearer realm="dbworker metrics"'
        return response
    return HttpResponse(
        f"Needs the permission {METRICS_PERMISSION} (set DBWORKER['METRICS_TOKEN'] for a "
        "scraper).\n",
        status=403,
        content_type="text/plain",
    )


def _configured_handlers() -> list[str]:
    names = []
    for path in conf.get("HANDLERS"):
        try:
            names.append(Handler.get_name(import_handler(path)))  # type: ignore[arg-type]
        except HandlerImportError:
            continue
    return names
