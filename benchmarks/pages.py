"""Pages that read a node: how long the request itself takes, and how long until the page shows
the reading.

For each page, over ``--samples`` rounds (pages interleaved, after ``--warmup`` rounds not
counted), against a live panel (uvicorn, as ``./run`` starts it) with real Celery workers
(``default`` and ``streams`` queues) on one simulated node (8 × 96 GiB, 449 GB of RAM, SGLang
0.5.9, a foreign process holding 10 GiB on GPU 0 so the holders table has a holder), logged in
as an operator:

- (a) **request**: the request's own time, from sending it to the last byte of its response
  (what the browser waits for before it has anything to show; on loopback, the server's time);
- (b) **shown**: from sending the first request until a response holds the page's content
  marker. When the first response does not hold it (a placeholder), the script does what htmx
  does: it follows the elements that ask for content by themselves (``hx-get``/``hx-post``
  with an ``hx-trigger`` of ``load``, ``revealed``, ``intersect`` or ``every Ns``), waiting
  the trigger's ``delay:``/``every`` interval first (``--poll-interval S`` overrides
  ``every``), with ``HX-Request: true`` and the element's ``hx-vals`` (for an ``hx-post``,
  also the page's form data and the named inputs inside the element), until a response holds
  the marker. An ``every`` poller whose response is swapped into it (not ``outerHTML``) keeps
  polling; one that is replaced polls again only if the response names a poller again.
  A response that says ``Not read:`` (the node did not answer) stops the run.

Pages (content marker in brackets):

1. ``node page``: ``GET /nodes/<pk>/``; its GPU holders panel comes in by ``hx-trigger="load"``,
   so (b) is the page and then the holders (``data-gpu="``, a row of the holders table);
2. ``GPU holders``: ``GET /nodes/<pk>/gpus/`` with ``HX-Request`` (``data-gpu="``);
3. ``profile form``: ``GET /launch-profiles/new/`` (``id="budget-panel"``);
4. ``budget check, model cache miss``: ``POST /launch-profiles/check/`` (the form's live check)
   for Kimi-K2.5 (``--model``) at TP 8 on a model path not read before: each sample names a new
   symbolic link ``/tmp/rankwise-pagebench/miss-N`` on the node to ``/srv/models/<model>``, so
   no cache (the panel's, or a worker's) has it and the model's config.json and safetensors
   headers are read over SSH (``Device KV pool per rank:``, a line of the arithmetic that shows
   only when the model's geometry is known);
5. ``budget check, model cache hit``: the same with ``/srv/models/<model>`` itself, read once
   before the samples (within the 10-minute geometry cache);
6. ``cleanup form``: ``GET /nodes/<pk>/cleanup/`` (``data-gpu="``).

Run as root from the project folder: ``.venv/bin/python benchmarks/pages.py [--samples 20]
[--json]`` (or ``python -m benchmarks.pages``). It brings a one-node fleet up in a temporary
folder, uses a temporary SQLite database and state folder and Redis database 11 of the local
Redis (``RANKWISE_BENCH_REDIS_URL`` changes it), and tears all of it down, the fleet included,
even on failure. It prints p50/p95/max in milliseconds per page, the load average at the start
and the end, and with ``--json`` the same as one JSON document. Target: no page waits on SSH
inside the request: (a) under 0.5 s at p95 for every page.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import http.cookies
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
REDIS_URL = os.environ.get("RANKWISE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
SPEC = {
    "nodes": [
        {
            "name": "pagebench",
            "gpus": 8,
            "gpu_memory": "96GiB",
            "host_ram": "449GB",
            "sglang_version": "0.5.9",
            "speed": 8,
        }
    ]
}
MISS_DIR = "/tmp/rankwise-pagebench"
HOLDERS = 'data-gpu="'
DEVICE_POOL = "Device KV pool per rank:"
NOT_READ = "Not read:"
TARGET_MS = 500.0
FOLLOW_TIMEOUT_S = 120.0
# What makes an element ask for content by itself (htmx's hx-trigger), and its wait.
SELF_TRIGGER = re.compile(r"^\s*(load|revealed|intersect|every\s+([0-9.]+)(ms|s)?)\b(.*)$")
DELAY = re.compile(r"delay:([0-9.]+)(ms|s)?")
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def seconds(number: str, unit: str | None) -> float:
    return float(number) / 1000 if unit == "ms" else float(number)


@dataclass
class Poller:
    """An element that asks for content by itself: where, how, after how long, and the values
    it sends besides the page's form (its ``hx-vals``, and for a POST the named inputs inside
    it, which the browser sends as part of the form the element sits in)."""

    method: str
    url: str
    wait_s: float
    every: bool
    replaced: bool  # its response replaces it (outerHTML), so it polls again only if named
    values: dict[str, str] = field(default_factory=dict)


class _Pollers(HTMLParser):
    def __init__(self, base: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base = base
        self.found: list[Poller] = []
        self.open: list[tuple[str, list[int], Poller]] = []  # tag, same-tag depth, poller

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {k: v or "" for k, v in attrs}
        for open_tag, depth, poller in self.open:
            if tag == open_tag:
                depth[0] += 1
            if (
                tag in ("input", "select", "textarea")
                and attr.get("name")
                and poller.method == "POST"
            ):
                poller.values.setdefault(attr["name"], attr.get("value", ""))
        method = "GET" if "hx-get" in attr else "POST" if "hx-post" in attr else ""
        if not method:
            return
        for part in attr.get("hx-trigger", "").split(","):
            match = SELF_TRIGGER.match(part)
            if match is None:
                continue
            every = match[2] is not None
            wait = seconds(match[2], match[3]) if every else 0.0
            delay = DELAY.search(match[4])
            if delay and not every:
                wait = seconds(delay[1], delay[2])
            url = urllib.parse.urljoin(self.base, attr["hx-get" if method == "GET" else "hx-post"])
            swap = (attr.get("hx-swap") or "innerHTML").split()[0]
            poller = Poller(method, url, wait, every, swap in ("outerHTML", "delete"))
            try:
                vals = json.loads(attr.get("hx-vals") or "{}")
            except ValueError:
                vals = {}
            if isinstance(vals, dict):
                poller.values.update({str(k): str(v) for k, v in vals.items()})
            self.found.append(poller)
            if tag not in VOID:
                self.open.append((tag, [1], poller))
            return

    def handle_endtag(self, tag: str) -> None:
        for entry in list(self.open):
            if entry[0] == tag:
                entry[1][0] -= 1
                if entry[1][0] == 0:
                    self.open.remove(entry)


def pollers(body: str, base: str) -> list[Poller]:
    parser = _Pollers(base)
    parser.feed(body)
    parser.close()
    return parser.found


@dataclass
class Answer:
    status: int
    body: str
    elapsed_ms: float
    cookies: dict[str, str]


class Browser:
    """An operator's browser, as far as these pages go: its session and CSRF cookies, one
    connection per request (on loopback its set-up is a fraction of a millisecond)."""

    def __init__(self, url: str, session_cookie: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        name, _, value = session_cookie.partition("=")
        self.cookies = {name: value}

    def request(
        self, method: str, url: str, data: dict[str, str] | None = None, *, htmx: bool = False
    ) -> Answer:
        parts = urllib.parse.urlsplit(url)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}
        if htmx:
            headers["HX-Request"] = "true"
        body = None
        if method == "POST":
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            headers["X-CSRFToken"] = self.cookies.get("csrftoken", "")
            body = urllib.parse.urlencode(data or {})
        connection = http.client.HTTPConnection(self.host, self.port, timeout=FOLLOW_TIMEOUT_S)
        try:
            started = time.perf_counter()
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            content = response.read()
            elapsed = (time.perf_counter() - started) * 1000
        finally:
            connection.close()
        jar: dict[str, str] = {}
        for header in response.headers.get_all("Set-Cookie") or []:
            cookie = http.cookies.SimpleCookie()
            cookie.load(header)
            jar.update({k: m.value for k, m in cookie.items()})
        self.cookies.update(jar)
        if not 200 <= response.status < 300:
            raise SystemExit(f"{method} {path}: HTTP {response.status}: {content[:300]!r}")
        return Answer(response.status, content.decode(errors="replace"), elapsed, jar)


@dataclass
class Page:
    name: str
    method: str
    path: str
    marker: str
    htmx: bool = False
    data: dict[str, str] | None = None
    fresh_path: bool = False  # a new model path for each request (a cache miss)
    request_ms: list[float] = field(default_factory=list)
    shown_ms: list[float] = field(default_factory=list)
    followups: list[int] = field(default_factory=list)


def shown(
    browser: Browser,
    page: Page,
    data: dict[str, str] | None,
    poll_interval: float | None,
) -> tuple[float, float, int]:
    """(request ms, shown ms, follow-up requests) for one visit of ``page``."""
    started = time.perf_counter()
    first = browser.request(page.method, page.path, data, htmx=page.htmx)
    answer, count = first, 0
    due: list[tuple[float, Poller]] = []

    def schedule(found: list[Poller], now: float) -> None:
        for poller in found:
            wait = poll_interval if poll_interval is not None and poller.every else poller.wait_s
            due.append((now + wait, poller))

    schedule(pollers(first.body, page.path), time.perf_counter())
    while page.marker not in answer.body:
        if NOT_READ in answer.body:
            line = answer.body[answer.body.index(NOT_READ) :].split("<")[0]
            raise SystemExit(f"{page.name}: {line.strip()}")
        if not due:
            raise SystemExit(
                f"{page.name}: no {page.marker!r} in the response and nothing polls for it: "
                f"{answer.body[:500]!r}"
            )
        if time.perf_counter() - started > FOLLOW_TIMEOUT_S:
            raise SystemExit(f"{page.name}: {page.marker!r} not shown in {FOLLOW_TIMEOUT_S} s")
        due.sort(key=lambda item: item[0])
        when, poller = due.pop(0)
        time.sleep(max(0.0, when - time.perf_counter()))
        url, sent = poller.url, None
        if poller.method == "POST":
            sent = {**(data or {}), **poller.values}
        elif poller.values:
            joiner = "&" if urllib.parse.urlsplit(url).query else "?"
            url += joiner + urllib.parse.urlencode(poller.values)
        answer = browser.request(poller.method, url, sent, htmx=True)
        count += 1
        found = pollers(answer.body, poller.url)
        if poller.every and not poller.replaced and not found:
            found = [poller]
        schedule(found, time.perf_counter())
    return first.elapsed_ms, (time.perf_counter() - started) * 1000, count


def simfleet(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "simfleet", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if result.returncode != 0:
        raise SystemExit(f"simfleet {' '.join(args)} failed: {result.stderr}")
    return result.stdout


def setup_node(state: str) -> tuple[Any, dict[str, Any]]:
    """The fleet's node in the inventory (key stored, host key trusted, discovered) and its
    ``simfleet up --json`` description."""
    from django.core.management import call_command

    from benchmarks.heartbeat import register
    from nodes.models import Node
    from nodes.services.roles import ensure_roles
    from nodes.workflows.discovery import discover

    spec_file = Path(state).parent / "spec.json"
    spec_file.write_text(json.dumps(SPEC))
    sim = json.loads(simfleet("up", "--state", state, "--spec", str(spec_file), "--json"))
    sim = sim["nodes"][0]
    simfleet("hold", sim["name"], "--gpu", "0", "--memory", "10GiB", "--state", state)
    call_command("migrate", verbosity=0)
    ensure_roles()
    register([sim])
    node = Node.objects.get(name=sim["name"])
    discover(node.pk)
    node.refresh_from_db()
    return node, sim


def make_links(sim: dict[str, Any], model: str, count: int) -> list[str]:
    """``count`` new paths on the node, each a symbolic link to the model's folder."""
    from tests.fleet import SimNode

    target = sim["models"][model]
    stamp = f"{os.getpid()}-{int(time.time())}"
    paths = [f"{MISS_DIR}/miss-{stamp}-{i}" for i in range(count)]
    script = f"mkdir -p {MISS_DIR} && " + " && ".join(f"ln -s {target} {p}" for p in paths)
    SimNode(**sim, state="").ok(script)
    return paths


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    database = f"sqlite:///{work / 'bench.sqlite3'}"
    state = str(work / "fleet")
    os.environ.update(
        DATABASE_URL=database,
        RANKWISE_STATE_DIR=str(work / "var"),
        REDIS_URL=REDIS_URL,
        CELERY_BROKER_URL=REDIS_URL,
        TMPDIR=str(work),  # the workers' logs
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
    import django

    django.setup()
    import redis

    from tests.factories import make_user
    from tests.panel import start_panel
    from tests.workers import Workers

    redis.Redis.from_url(REDIS_URL).flushdb()
    load_start = os.getloadavg()
    workers = Workers(database, REDIS_URL)
    panel = None
    try:
        node, sim = setup_node(state)
        rounds = args.warmup + args.samples
        misses = make_links(sim, args.model, rounds)
        workers.start()
        panel = start_panel(database, REDIS_URL, work)
        operator = make_user("otto", "operator")
        browser = Browser(panel.url, panel.cookie_for(operator))
        check = {
            "name": "pagebench",
            "node": str(node.pk),
            "model_path": sim["models"][args.model],
            "tp_size": "8",
            "pp_size": "1",
            "dp_size": "1",
            "mem_fraction_static": "0.93",
            "kv_cache_dtype": "auto",
            "port": "30000",
            "enable_hicache": "on",
            "hicache_size": "20",
            "model_config": "",
        }
        pages = [
            Page("node page", "GET", f"/nodes/{node.pk}/", HOLDERS),
            Page("GPU holders", "GET", f"/nodes/{node.pk}/gpus/", HOLDERS, htmx=True),
            Page("profile form", "GET", "/launch-profiles/new/", 'id="budget-panel"'),
            Page(
                "budget check, model cache miss",
                "POST",
                "/launch-profiles/check/",
                DEVICE_POOL,
                htmx=True,
                data=check,
                fresh_path=True,
            ),
            Page(
                "budget check, model cache hit",
                "POST",
                "/launch-profiles/check/",
                DEVICE_POOL,
                htmx=True,
                data=check,
            ),
            Page("cleanup form", "GET", f"/nodes/{node.pk}/cleanup/", HOLDERS),
        ]
        browser.request("GET", "/launch-profiles/new/")  # the CSRF cookie, as a browser has it
        if "csrftoken" not in browser.cookies:
            raise SystemExit("the profile form set no csrftoken cookie")
        loads = []
        for i in range(rounds):
            for page in pages:
                data = page.data
                if data is not None:
                    data = {**data, "hicache_size": str(20 + i)}
                    if page.fresh_path:
                        data["model_path"] = misses[i]
                request_ms, shown_ms, count = shown(browser, page, data, args.poll_interval)
                if i >= args.warmup:
                    page.request_ms.append(request_ms)
                    page.shown_ms.append(shown_ms)
                    page.followups.append(count)
            loads.append(os.getloadavg()[0])
        load_end = os.getloadavg()
    except BaseException:
        for log in [work / "panel.log", *sorted(workers.logs.glob("*.log"))]:
            if log.exists():
                tail = log.read_text(errors="replace")[-3000:]
                print(f"--- {log.name} (last 3,000 characters)\n{tail}", file=sys.stderr)
        raise
    finally:
        if panel is not None:
            panel.proc.kill()
            panel.proc.wait()
        workers.stop()
        subprocess.run(
            [sys.executable, "-m", "simfleet", "down", "--state", state],
            cwd=ROOT,
            capture_output=True,
        )

    def figures(values: list[float]) -> dict[str, float]:
        return {
            "p50": round(percentile(values, 50), 1),
            "p95": round(percentile(values, 95), 1),
            "max": round(max(values), 1),
        }

    return {
        "date": datetime.date.today().isoformat(),
        "samples": args.samples,
        "warmup": args.warmup,
        "model": args.model,
        "poll_interval_s": args.poll_interval,
        "load_average": {
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in load_end],
            "one_minute_during": {"min": round(min(loads), 2), "max": round(max(loads), 2)},
        },
        "target": {"request_p95_ms": TARGET_MS},
        "pages": [
            {
                "page": p.name,
                "request": f"{p.method} {p.path}" + (" (HX-Request)" if p.htmx else ""),
                "marker": p.marker,
                "request_ms": figures(p.request_ms),
                "shown_ms": figures(p.shown_ms),
                "follow_ups": {"min": min(p.followups), "max": max(p.followups)},
                "request_p95_under_target": percentile(p.request_ms, 95) < TARGET_MS,
            }
            for p in pages
        ],
    }


def table(report: dict[str, Any]) -> str:
    load = report["load_average"]
    lines = [
        f"{report['samples']} samples per page ({report['warmup']} warm-up rounds not counted), "
        f"model {report['model']}",
        "load average (1, 5, 15 min): start "
        + ", ".join(f"{x:.2f}" for x in load["start"])
        + "; end "
        + ", ".join(f"{x:.2f}" for x in load["end"])
        + f"; 1-min during the run {load['one_minute_during']['min']:.2f}–"
        f"{load['one_minute_during']['max']:.2f}",
        "",
        "| page | request | (a) request p50 / p95 / max ms | (b) shown p50 / p95 / max ms "
        "| follow-ups | (a) p95 < 500 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in report["pages"]:
        a, b, f = row["request_ms"], row["shown_ms"], row["follow_ups"]
        follow = str(f["min"]) if f["min"] == f["max"] else f"{f['min']}–{f['max']}"
        lines.append(
            f"| {row['page']} | `{row['request']}` | {a['p50']:.1f} / {a['p95']:.1f} / "
            f"{a['max']:.1f} | {b['p50']:.1f} / {b['p95']:.1f} / {b['max']:.1f} | {follow} | "
            f"{'yes' if row['request_p95_under_target'] else 'no'} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--model", default="kimi-k2", help="a model of the simulated node")
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=None,
        help="seconds between polls of an 'every' trigger (default: the trigger's own)",
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    with tempfile.TemporaryDirectory(prefix="rankwise-pagebench-") as tmp:
        report = run(args, Path(tmp))
    print(json.dumps(report, indent=2) if args.json else table(report))


if __name__ == "__main__":
    main()
