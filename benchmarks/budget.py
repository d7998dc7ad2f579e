"""Server time of the live budget check (the request the profile form sends as you type).

Run from the project folder: ``.venv/bin/python benchmarks/budget.py [--requests 300]``.
It uses a temporary SQLite database, a node like the incident's, and a pasted Kimi-K2
config.json (so the device pool is computed too), and prints p50/p95/max in milliseconds.
Target: p95 under 50 ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankwise-budget-") as tmp:
        os.environ.update(
            DATABASE_URL=f"sqlite:///{tmp}/bench.sqlite3", RANKWISE_STATE_DIR=f"{tmp}/var"
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command
        from django.test import Client
        from django.test.utils import setup_test_environment

        from nodes.domain.units import GB, GiB
        from nodes.models import Gpu, Node
        from nodes.services.roles import ensure_roles
        from simfleet.models import MODELS
        from tests.factories import make_user

        setup_test_environment()
        call_command("migrate", verbosity=0)
        ensure_roles()
        node = Node.objects.create(
            name="gpu-01",
            host="10.0.0.5",
            host_ram_bytes=449 * GB,
            mem_available_bytes=408 * GB,
            sglang_version="0.5.9",
        )
        Gpu.objects.bulk_create(
            Gpu(node=node, index=i, name="NVIDIA H200", memory_total_bytes=96 * GiB)
            for i in range(8)
        )
        client = Client()
        client.force_login(make_user("otto", "operator"))  # type: ignore[arg-type]
        data = {
            "name": "kimi",
            "node": node.pk,
            "model_path": "/models/kimi",
            "tp_size": "8",
            "pp_size": "1",
            "dp_size": "1",
            "mem_fraction_static": "0.93",
            "kv_cache_dtype": "auto",
            "port": "30000",
            "enable_hicache": "on",
            "hicache_size": "300",
            "model_config": json.dumps(MODELS["kimi-k2"]["config"]),
        }
        timings = []
        for i in range(args.requests + 20):
            data["hicache_size"] = str(20 + i % 300)
            started = time.perf_counter()
            response = client.post("/launch-profiles/check/", data, headers={"HX-Request": "true"})
            elapsed = (time.perf_counter() - started) * 1000
            assert response.status_code == 200 and b"budget-panel" in response.content
            if i >= 20:  # the first requests warm caches and imports
                timings.append(elapsed)
    timings.sort()
    p95 = timings[int(len(timings) * 0.95) - 1]
    print(f"requests: {len(timings)}")
    print(
        f"live budget check: p50 {statistics.median(timings):.1f} ms, p95 {p95:.1f} ms, "
        f"max {timings[-1]:.1f} ms"
    )


if __name__ == "__main__":
    main()
