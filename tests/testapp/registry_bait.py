"""Imported by nothing: ``tests/test_admin_permissions.py`` names this module in the
worker registry and checks that no admin page imports it (a registry row is data, not
code for the web process to run)."""

from tests.testapp.handlers import BehaviorHandler


class Bait(BehaviorHandler):
    pass
