"""Headless Chromium (Debian's package) driven by Playwright; never a downloaded browser."""

import os
import shutil

import pytest

CHROMIUM = os.environ.get("DBWORKER_CHROMIUM", "/usr/bin/chromium")
# Playwright's sync API runs an event loop in this thread; the ORM calls the test
# makes between browser steps are plain synchronous calls.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def _missing():
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install -e '.[dev]')"
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        return f"{CHROMIUM} not found (apt-get install chromium)"
    return None


@pytest.fixture(scope="session")
def browser():
    reason = _missing()
    if reason:
        if os.environ.get("CI") == "true":
            pytest.fail(f"browser tests cannot run under CI=true: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-background-networking",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    # A common laptop/desktop width: the job list must fit it without scrolling sideways.
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()
