"""An upload bomb on /diagnose/: time and peak memory of reading and diagnosing it.

The bomb is the issue's: a gzipped tar (about 65 KB) of 64 MiB of newlines as ``launch.log`` and
a minimal ``facts.json``. Each figure comes from a fresh child process (its own peak RSS):

- ``bounded``: what the worker's task does now (``bundles.read_bundle_file`` with the upload
  bounds, then the diagnosis if it were accepted): refused after the line limit;
- ``baseline`` (with ``--baseline``): the same archive read whole and diagnosed, as the web
  process did before the bounds (slow: about half a minute and over a GiB);
- ``three``: three bounded reads at once, in three processes;
- ``largest``: the largest log an upload may hold (249,999 ordinary decode lines, no failure
  signature: every rule reads every line), accepted and diagnosed.

Run from the project folder: ``.venv/bin/python -m benchmarks.upload_bomb [--baseline]``.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import time
from typing import Any

MiB = 2**20


class _Newlines(io.RawIOBase):
    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = min(len(buffer), self.left)
        buffer[:n] = b"\n" * n
        self.left -= n
        return n


def bomb(largest: bool = False) -> io.BytesIO:
    """The bomb, or (``largest``) the biggest log an upload may hold: just under the line limit
    of ordinary decode lines that no rule matches, so every rule reads every line."""
    from benchmarks.diagnosis import ordinary

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo("bomb/launch.log")
        if largest:
            log = "\n".join(ordinary(249_999)).encode() + b"\n"
            info.size = len(log)
            tar.addfile(info, io.BytesIO(log))
        else:
            info.size = 64 * MiB
            tar.addfile(info, io.BufferedReader(_Newlines(info.size)))
        facts = b'{"format": "rankwise-case/1"}'
        info = tarfile.TarInfo("bomb/facts.json")
        info.size = len(facts)
        tar.addfile(info, io.BytesIO(facts))
    buffer.seek(0)
    buffer.name = "bomb.tar.gz"
    return buffer


def child(mode: str) -> dict[str, Any]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
    import django

    django.setup()
    from nodes.domain.bundle import BundleError
    from nodes.services import bundles

    upload = bomb(largest=mode == "largest")
    size = len(upload.getvalue())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    outcome = "diagnosed"
    try:
        if mode == "baseline":
            text, facts = bundles._read_archive(
                upload.name,
                lambda: tarfile.open(fileobj=upload, mode="r:*"),  # noqa: SIM115 (closed there)
                "not ",
                bundles.MAX_UPLOAD_LOG_BYTES,
                10**12,
            )
        else:
            text, facts = bundles.read_bundle_file(upload)
        bundles.diagnose_bundle(text, facts)
    except BundleError as exc:
        outcome = f"refused: {exc}"
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "mode": mode,
        "archive_bytes": size,
        "wall_s": round(wall, 3),
        "peak_rss_mib": round(peak / 1024),
        "rss_growth_mib": round((peak - before) / 1024),
        "outcome": outcome,
    }


def _run(mode: str, copies: int = 1) -> list[dict[str, Any]]:
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.upload_bomb", "--child", mode],
            stdout=subprocess.PIPE,
        )
        for _ in range(copies)
    ]
    found = [json.loads(p.communicate()[0]) for p in procs]
    for doc in found:
        doc["all_done_s"] = round(time.perf_counter() - start, 3)
    return found


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2])))
        return
    rows = _run("bounded") + _run("bounded", 3) + _run("largest")
    if "--baseline" in sys.argv:
        rows += _run("baseline")
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
