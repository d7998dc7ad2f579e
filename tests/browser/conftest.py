"""A real browser: Debian's chromium driven by Playwright (no browser downloads)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("RANKWISE_CHROMIUM", "/usr/bin/chromium")
# Playwright's sync API runs an event loop in this thread; Django's guard would refuse the ORM
# calls the tests make between browser steps, though nothing here runs concurrently.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `./run test` installs Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


#: How long an action (a click, a fill) and an ``expect`` wait for their condition before failing.
#: Deadlines, not delays: a condition met at once returns at once. Generous because the suite runs
#: several processes on two cores, where a page can take seconds to answer.
ACTION_TIMEOUT_MS = 30_000
EXPECT_TIMEOUT_MS = 20_000


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed:
        item.stash[_FAILED] = True
    return report


_FAILED = pytest.StashKey[bool]()
#: Where a failed journey's trace goes (``RANKWISE_TRACES=DIR``; read it with ``playwright
#: show-trace``): what the page asked, what it was answered and when, its console. Off by
#: default: tracing costs the renderer time on a loaded machine.
TRACES = os.environ.get("RANKWISE_TRACES", "")


@pytest.fixture
def page(browser, request):
    from playwright.sync_api import expect

    expect.set_options(timeout=EXPECT_TIMEOUT_MS)
    context = browser.new_context()
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    if TRACES:
        context.tracing.start(snapshots=True, screenshots=False)
    page = context.new_page()
    yield page
    if TRACES and request.node.stash.get(_FAILED, False):
        path = Path(TRACES) / f"{request.node.name[:80]}-{os.getpid()}.zip"
        path.parent.mkdir(parents=True, exist_ok=True)
        context.tracing.stop(path=str(path))
    context.close()
