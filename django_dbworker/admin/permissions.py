"""What a user of the admin may see and do, for the pages that show or change more than
their own model's rows.

- ``model_permission``: a model's permission (``view``, ``change``, ...) as the user
  holds it, whatever a ``ModelAdmin`` says of its own forms (the control pages answer
  False to ``has_change_permission`` to keep their forms read-only; their actions check
  the real permission here).
- ``visible_jobs``: of the jobs named by label (``app_label.Model:pk``, as the worker
  registry and the schedules hold them), those the user may open: of a model whose admin
  on this site gives them the view (or change) permission, and among the rows that
  admin's ``get_queryset(request)`` returns them. Nothing is read from a model the user
  may not see.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.apps import apps
from django.contrib.admin import AdminSite
from django.contrib.admin.exceptions import NotRegistered
from django.contrib.admin.utils import quote
from django.contrib.auth import get_permission_codename
from django.core.exceptions import FieldError, ValidationError
from django.db.models import Model
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse


def model_permission(request: HttpRequest, model: type[Model], action: str) -> bool:
    """Whether the user of ``request`` holds ``action`` (``view``, ``change``, ``add``,
    ``delete``) on ``model``."""
    opts = model._meta
    codename = get_permission_codename(action, opts)
    return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))


def operator_name(request: HttpRequest) -> str:
    """Who acts, as the audit trail records it."""
    user = getattr(request, "user", None)
    return str(user.get_username()) if user is not None else ""


@dataclass(frozen=True)
class VisibleJob:
    """A job the user may open: its admin page, state and last check-in."""

    url: str
    state: str
    progress: Any


def _model_of(label: str) -> tuple[type[Model] | None, str]:
    model_label, _, pk = label.rpartition(":")
    try:
        return apps.get_model(model_label), pk
    except (LookupError, ValueError):
        return None, pk


def visible_jobs(
    request: HttpRequest, site: AdminSite, labels: Iterable[str]
) -> dict[str, VisibleJob | None]:
    """The jobs of ``labels`` the user of ``request`` may open on ``site``, by label
    (one query per model they may view; none for the others). None for a job of a
    model they may view that is not among their rows (deleted since, or not theirs);
    a label they may not know of at all is left out."""
    by_model: dict[type[Model], dict[str, str]] = defaultdict(dict)
    for label in labels:
        model, pk = _model_of(label)
        if model is not None and pk:
            by_model[model][pk] = label
    found: dict[str, VisibleJob | None] = {}
    for model, pks in by_model.items():
        try:
            model_admin = site.get_model_admin(model)
        except NotRegistered:
            continue
        if not model_admin.has_view_or_change_permission(request):
            continue
        opts = model._meta
        fields = ["pk", "state", *(["progress"] if _has_field(model, "progress") else [])]
        try:
            rows = list(
                model_admin.get_queryset(request).filter(pk__in=list(pks)).values_list(*fields)
            )
        except (ValueError, ValidationError, FieldError):
            continue
        found.update(dict.fromkeys(pks.values()))
        for pk, state, *progress in rows:
            if str(pk) not in pks:
                continue
            label = pks[str(pk)]
            try:
                url = reverse(
                    f"{site.name}:{opts.app_label}_{opts.model_name}_change", args=[quote(pk)]
                )
            except NoReverseMatch:
                continue
            found[label] = VisibleJob(url, str(state), progress[0] if progress else None)
    return found


def _has_field(model: type[Model], name: str) -> bool:
    try:
        model._meta.get_field(name)
    except Exception:
        return False
    return True
