"""The log viewer's search on PostgreSQL at a million lines, with and without a trigram index.

Run from the project folder against a scratch database it creates and drops:
``.venv/bin/python -m benchmarks.log_search_pg [--lines 1000000] [--trigram]
[--server postgres://postgres@127.0.0.1:5432]``. It stores ``--lines`` decode-batch lines of one
launch (ten of them carrying a rare string), then times ``log_view.search`` (the count and the
first 200 matches) for the rare string and for one on 1 line in 200, and the insert rate.
``--trigram`` adds a GIN trigram index over ``UPPER(text)`` first (what Django's ``icontains``
asks for), to weigh what it gives search against what it costs every stored line.
Target: search 1M < 1 s (the log viewer's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "rankwise_log_search_bench"


def psql(server: str, sql: str) -> None:
    subprocess.run(["psql", f"{server}/postgres", "-qc", sql], check=True)


def run(lines: int, trigram: bool) -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from nodes.models import Launch, LaunchLogLine, LaunchProfile, ProfileRevision
    from nodes.services import log_view
    from tests.factories import make_node

    call_command("migrate", verbosity=0)
    if trigram:
        with connection.cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            cursor.execute(
                "CREATE INDEX ON nodes_launchlogline USING gin ((UPPER(text::text)) gin_trgm_ops)"
            )
    node = make_node("bench-node")
    profile = LaunchProfile.objects.create(name="bench", created_by="bench")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, args=[], env={}, author="bench", node=node, verdict="ok",
        report={},
    )  # fmt: skip
    launch = Launch.objects.create(
        revision=revision, node=node, gpus=[0], port=30000, created_by="bench",
        startup_timeout_s=60, status="ready",
    )  # fmt: skip

    def batch(start: int, count: int) -> Iterator[LaunchLogLine]:
        for i in range(start, start + count):
            text = (
                f"[2026-12-05 10:00:{i % 60:02d} TP{i % 8}] Decode batch, #running-req: {i % 50}, "
                f"#token: {i}, token usage: 0.{i % 99:02d}, cuda graph: True, gen throughput "
                f"(token/s): {i % 1000}.00, #queue-req: 0, "
            )
            if i % (lines // 10) == 77:
                text = f"[2026-12-05 10:00:00 TP0] NEEDLE number {i}"
            yield LaunchLogLine(launch=launch, seq=i, text=text)

    began = time.monotonic()
    for start in range(1, lines + 1, 5000):
        LaunchLogLine.objects.bulk_create(batch(start, min(5000, lines + 1 - start)))
    took = time.monotonic() - began
    print(f"stored {lines:,} lines in {took:.1f} s ({lines / took:,.0f} lines/s)")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE nodes_launchlogline")
    for query in ("needle number", "TP3] Decode batch, #running-req: 7,"):
        began = time.monotonic()
        count, _ = log_view.search(launch, query)
        print(f"search {query!r}: {count:,} matches in {time.monotonic() - began:.2f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--trigram", action="store_true")
    parser.add_argument("--server", default="postgres://postgres@127.0.0.1:5432")
    args = parser.parse_args()
    psql(args.server, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    psql(args.server, f"CREATE DATABASE {DATABASE}")
    try:
        os.environ["DATABASE_URL"] = f"{args.server}/{DATABASE}"
        sys.path.insert(0, str(ROOT))
        run(args.lines, args.trigram)
    finally:
        psql(args.server, f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
