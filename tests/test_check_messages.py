"""Every system check message reads as sentences: none ends a sentence twice ("?.",
"..") where a message wraps another one (issue 42, item 24: W003 for a misspelt
handler read "did you mean 'BehaviorHandler'?. runworker …")."""

import re

import pytest
from django.core import checks

from django_dbworker.text import sentence

pytestmark = pytest.mark.django_db  # MariaDB: the checks read the server's version

#: A sentence ended twice: "?." "!." or ".." (not an ellipsis "...").
TWICE = re.compile(r"[?!]\.|(?<!\.)\.\.(?!\.)")

H = "tests.testapp.handlers"


def texts():
    for message in checks.run_checks(tags=["dbworker"]):
        yield message.id, message.msg
        if message.hint:
            yield message.id, message.hint


@pytest.mark.parametrize(
    "dbworker",
    [
        {"HANDLERS": [f"{H}.BehaviourHandler"]},  # a close match: "did you mean …?"
        {"HANDLERS": [f"{H}.Nope"]},
        {"HANDLERS": ["tests.testapp.broken_import.Handler"]},  # raised at import
        {"HANDLERS": ["nodots"]},
        {"HANDLER": []},  # a misspelt key
        {"LISTEN_DATABASE": "nope"},
    ],
)
def test_no_check_message_ends_a_sentence_twice(settings, dbworker):
    settings.DBWORKER = dbworker
    found = list(texts())
    assert found, "the configuration is wrong: some check must say so"
    assert [(id, text) for id, text in found if TWICE.search(text)] == []


def test_w003_of_a_misspelt_handler_asks_once():
    from django.test import override_settings

    with override_settings(DBWORKER={"HANDLERS": [f"{H}.BehaviourHandler"]}):
        [message] = [m for m in checks.run_checks(tags=["dbworker"]) if m.id == "dbworker.W003"]
    assert "did you mean 'BehaviorHandler'? runworker and runresetter will refuse" in (message.msg)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("a", "a."), ("a.", "a."), ("a?", "a?"), ("a!", "a!"), ("a ", "a.")],
)
def test_sentence(text, expected):
    assert sentence(text) == expected
