"""Fixtures of the browser tests: one app server for the package, one Chromium per module.

The server (``app.py`` on the embedded model, CPU, a free localhost port) is shared by every
browser test module, so it starts once; each test gets a fresh page. A folder without
``__init__.py`` has no package scope, so that server lives to the end of the session.

``test_browser_vllm.py`` and ``test_browser_llamacpp.py`` start a page of their own, with a
vLLM or llama.cpp beside it, so they run first here (``pytest_collection_modifyitems``), before
the shared server starts: after it, both pages,
their engine processes and the two vLLMs the suite runs by then came to more than a 24 GiB
machine holds, and the kernel killed the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_kit import CHROMIUM, CHROMIUM_ARGS
from server_kit import start_app_server

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the playwright package is optional: browser tests are skipped without it
    sync_playwright = None


@pytest.fixture(scope="package")
def server_url(request, tmp_path_factory) -> str:
    """``app.py`` on a free localhost port, offline, for all browser tests; stopped at the end."""
    return start_app_server(request, tmp_path_factory)


HERE = Path(__file__).parent
# the modules with a page of their own
OWN_SERVER_MODULES = (
    "test_browser_vllm.py",
    "test_browser_llamacpp.py",
    "test_browser_endpoint.py",
    "test_browser_servers.py",
    "test_browser_models.py",
)


def pytest_collection_modifyitems(session, config, items):
    """Among this folder's tests, the modules with a page of their own run first, before the
    shared server starts; the order is otherwise kept."""
    here = [i for i, item in enumerate(items) if HERE in Path(item.path).parents]
    if not here:
        return
    mine = [items[i] for i in here]
    first = [item for item in mine if Path(item.path).name in OWN_SERVER_MODULES]
    rest = [item for item in mine if Path(item.path).name not in OWN_SERVER_MODULES]
    for i, item in zip(here, first + rest, strict=True):
        items[i] = item


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module."""
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, server_url):
    """A fresh page on the app; console errors, page errors and dialogs are collected."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.console_errors = []
    page.page_errors = []
    page.dialogs = []
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda exc: page.page_errors.append(str(exc)))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(server_url)
    page.locator('#requests_table [data-testid="cell-0-0"]').wait_for(timeout=30_000)
    yield page
    if page.console_errors:
        print("browser console errors:", *page.console_errors, sep="\n  ")
    context.close()
    assert not page.page_errors, f"uncaught errors in the page: {page.page_errors}"
    # plotly.js says "<path> attribute d: Expected number, "MNaN,NaN..."" for a shape or line
    # whose coordinates are not numbers
    nan_drawn = [e for e in page.console_errors if "attribute" in e and "NaN" in e]
    assert not nan_drawn, f"a chart was drawn from coordinates that are not numbers: {nan_drawn}"


# --- page helpers --------------------------------------------------------------------------------
