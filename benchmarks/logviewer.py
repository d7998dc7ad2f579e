"""The log viewer in a real browser (Debian's chromium through Playwright), issue 21.

Part 1: a launch printing ``--rate`` lines/s (2,000) for ``--seconds`` (60) with its page open:
every 0.5 s a click on another element of the page (the page title), timed from the click to its
handler's answer read back from the page; the lines the page holds, sampled at each click.
Part 2: a launch with ``--lines`` (1,000,000) stored lines: the page opened (navigation to its
last line shown), a search for a string on 10 lines (to the first match marked), a jump to the
middle line (to it shown).

Prints one line per figure, ``NAME: VALUE UNIT``: ``click p95``, ``click max``, ``dom max``,
``open 1M``, ``search 1M``, ``jump 1M``. Targets: click p95 ≤ 200 ms, the DOM never over the
window's cap (3,000), each 1M figure under 1 s.

Run as root from the project folder: ``.venv/bin/python benchmarks/logviewer.py``. It starts
what it needs as ``logstream.py`` does (a simulated node, the workers, the ASGI panel, a
temporary SQLite database, Redis database 13) and tears it all down.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.logstream import REDIS_URL, fleet, percentile, register, sandbox, wait  # noqa: E402

CHROMIUM = os.environ.get("RANKWISE_CHROMIUM", "/usr/bin/chromium")
MODEL = "--model-path /srv/models/qwen2.5-7b"
NEEDLE = "needle-7f3a"
LINES = "document.querySelectorAll('#launch-log span[data-seq]').length"


def _browser(playwright: Any) -> Any:
    if not shutil.which(CHROMIUM):
        raise SystemExit(f"{CHROMIUM} is missing (apt-get install chromium)")
    return playwright.chromium.launch(
        executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--no-first-run"]
    )


def _page(browser: Any, base: str, password: str) -> Any:
    page = browser.new_context().new_page()
    page.set_default_timeout(30_000)
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill("bench")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{base}/")
    return page


def _user() -> str:
    from django.contrib.auth.models import Group, User

    password = "bench-viewer-password-1"
    user = User.objects.create_user("bench", password=password)
    user.groups.add(Group.objects.get(name="viewer"))
    return password


def live_window(browser: Any, base: str, password: str, sims: list[dict[str, object]],
                rate: int, seconds: int) -> list[str]:  # fmt: skip
    from nodes.management.cli import resolve_actor
    from nodes.models import Launch, Node
    from nodes.models.choices import Role
    from nodes.workflows import ending, launching
    from nodes.workflows.launching import adhoc_revision

    actor = resolve_actor(None, Role.OPERATOR)
    node = Node.objects.get(name=str(sims[0]["name"]))
    command = (
        f"SGLANG_STANDIN_CHATTER={rate} SGLANG_STANDIN_CHATTER_SECONDS={seconds} "
        f"SGLANG_STANDIN_CHATTER_AFTER=6 python3 -m sglang.launch_server {MODEL}"
    )
    launch = launching.submit(node=node, revision=adhoc_revision(command, node, actor), actor=actor)
    wait(lambda: Launch.objects.get(pk=launch.pk).status == "ready", 120, "ready")
    page = _page(browser, base, password)
    page.goto(f"{base}/launches/{launch.pk}/")
    # The click's handler stamps when it ran: the click is answered once the page reads it.
    page.evaluate(
        "document.querySelector('.log-viewer h2').addEventListener('click', (e) => {"
        " window.__answered = performance.now(); })"
    )
    clicks: list[float] = []
    dom: list[int] = []
    end = time.monotonic() + seconds + 6
    while time.monotonic() < end:
        started = time.perf_counter()
        page.evaluate("window.__answered = 0")
        page.locator(".log-viewer h2").click()
        page.wait_for_function("window.__answered > 0")
        clicks.append((time.perf_counter() - started) * 1000)
        dom.append(int(page.evaluate(LINES)))
        time.sleep(0.5)
    ending.stop(launch.pk, actor=actor)
    page.context.close()
    return [
        f"click p95: {percentile(clicks, 95):.0f} ms",
        f"click max: {max(clicks):.0f} ms",
        f"dom max: {max(dom)} lines",
        f"clicks: {len(clicks)} during {seconds} s at {rate} lines/s",
    ]


def million(browser: Any, base: str, password: str, sims: list[dict[str, object]],
            lines: int) -> list[str]:  # fmt: skip
    from nodes.domain.log_lines import level_of, rank_of
    from nodes.management.cli import resolve_actor
    from nodes.models import Launch, LaunchLogLine, Node
    from nodes.models.choices import LaunchStatus, Role
    from nodes.workflows.launching import adhoc_revision

    actor = resolve_actor(None, Role.OPERATOR)
    node = Node.objects.get(name=str(sims[0]["name"]))
    revision = adhoc_revision(f"python3 -m sglang.launch_server {MODEL}", node, actor)
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0], port=30100, created_by="bench",
        status=LaunchStatus.STOPPED, log_complete=True, last_seq=lines, startup_timeout_s=60,
    )  # fmt: skip
    marked = {lines * k // 10 + 17 for k in range(10)}

    def text(i: int) -> str:
        if i in marked:
            return f"[2026-12-03 10:00:00 TP0] found {NEEDLE} at {i}"
        if i % 8 == 0:
            return f"[2026-12-03 10:00:00 TP0] Decode batch, #running-req: 40, #token: {i}, "
        return f"[2026-12-03 10:00:00 TP{i % 4}] Prefill batch, #new-seq: 1, #new-token: {i}"

    batch = 20_000
    for first in range(1, lines + 1, batch):
        rows = []
        for i in range(first, min(first + batch, lines + 1)):
            t = text(i)
            rows.append(LaunchLogLine(launch=launch, seq=i, text=t, level=level_of(t),
                                      rank=rank_of(t)))  # fmt: skip
        LaunchLogLine.objects.bulk_create(rows, batch_size=5000)
    page = _page(browser, base, password)
    started = time.perf_counter()
    page.goto(f"{base}/launches/{launch.pk}/")
    page.locator(f"#line-{lines}").wait_for(state="attached")
    opened = time.perf_counter() - started
    page.get_by_label("Search the whole log").fill(NEEDLE)
    started = time.perf_counter()
    page.get_by_role("button", name="Search", exact=True).click()
    page.locator(f"#line-{min(marked)} mark").wait_for(state="attached")
    searched = time.perf_counter() - started
    said = page.locator("#log-matches").text_content()
    middle = lines // 2
    page.get_by_label("Go to line").fill(str(middle))
    started = time.perf_counter()
    page.get_by_role("button", name="Go to line").click()
    page.locator(f"#line-{middle}.current").wait_for(state="visible")
    jumped = time.perf_counter() - started
    page.context.close()
    return [
        f"open 1M: {opened:.2f} s",
        f"search 1M: {searched:.2f} s ({said})",
        f"jump 1M: {jumped:.2f} s",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--lines", type=int, default=1_000_000)
    args = parser.parse_args()
    # Playwright's sync API runs an event loop in this thread; Django's guard would refuse the
    # ORM calls made between browser steps, though nothing here runs concurrently.
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sandbox() as box:
        from playwright.sync_api import sync_playwright

        from tests.panel import start_panel
        from tests.workers import Workers

        workers = Workers(box.database, REDIS_URL, stream_threads=8)
        panel = None
        report: list[str] = []
        try:
            sims = fleet(box.state, 1, 2)
            register(sims)
            password = _user()
            workers.start()
            panel = start_panel(box.database, REDIS_URL, box.work)
            with sync_playwright() as playwright:
                browser = _browser(playwright)
                report += live_window(browser, panel.url, password, sims, args.rate, args.seconds)
                report += million(browser, panel.url, password, sims, args.lines)
                browser.close()
        finally:
            if panel is not None:
                panel.proc.kill()
            workers.stop()
    print("\n".join(report))


if __name__ == "__main__":
    main()
