"""How long the test suite takes: ``./run test``, ``./run test --quick`` or ``.ci/run``, from a
clean clone of this checkout's HEAD, several runs one after another.

    python -m benchmarks.suite --what test --runs 3 [--venv .venv] [--keep]

Each run is a fresh ``git clone`` of HEAD into a temporary folder (``../shared`` linked beside it,
as CI lays it), timed from the command's start to its exit. The virtualenv named by ``--venv`` is
used through ``RANKWISE_VENV`` (it holds exactly the pinned requirements; building a new one per
run would time pip, not the suite). Prints one line per run and then a Markdown table: wall time,
the pytest summary line, and the ten slowest test phases (``--durations``). Run it on an
otherwise idle machine: two full runs at once measure the contention, not the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "test": ["./run", "test", "-p", "no:cacheprovider", "--durations=10"],
    "quick": ["./run", "test", "--quick", "-p", "no:cacheprovider", "--durations=10"],
    "ci": ["bash", ".ci/run"],
}
SUMMARY = re.compile(r"^=*\s*((?:\d+ \w+, )*\d+ passed.*?)\s*=*$", re.M)
DURATION = re.compile(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)$", re.M)


def clone(into: Path) -> Path:
    checkout = into / "main"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(checkout)], check=True)
    shared = ROOT.parent / "shared"
    if shared.exists():
        (into / "shared").symlink_to(shared)
    return checkout


def one_run(what: str, venv: Path, keep: bool) -> dict[str, object]:
    folder = Path(tempfile.mkdtemp(prefix="rankwise-suite-"))
    try:
        checkout = clone(folder)
        env = {**os.environ, "RANKWISE_VENV": str(venv)}
        if what == "ci":
            env["CI"] = "true"
        start = time.monotonic()
        done = subprocess.run(COMMANDS[what], cwd=checkout, env=env, capture_output=True, text=True)
        wall = time.monotonic() - start
        out = done.stdout + done.stderr
        # Kept whatever happens (the clone is not): a failure is read from it afterwards.
        kept = folder.with_name(f"{folder.name}.txt")
        kept.write_text(out)
        summary = SUMMARY.findall(out)
        return {
            "what": what,
            "exit": done.returncode,
            "wall_s": round(wall, 1),
            "summary": summary[-1] if summary else "",
            "slowest": [
                {"seconds": float(s), "phase": p, "test": t}
                for s, p, t in DURATION.findall(out)[:10]
            ],
            "output": str(kept),
        }
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", choices=sorted(COMMANDS), default="test")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--venv", default=str(ROOT / ".venv"))
    parser.add_argument("--keep", action="store_true", help="keep each clone (its output is kept)")
    args = parser.parse_args(argv)
    venv = Path(args.venv).resolve()
    if not (venv / "bin" / "python").exists():
        parser.error(f"no virtualenv at {venv}: run ./run test once first")
    runs = []
    for number in range(1, args.runs + 1):
        result = one_run(args.what, venv, args.keep)
        runs.append(result)
        print(json.dumps({"run": number, **result}), flush=True)
    print(f"\n| run | `{' '.join(COMMANDS[args.what])}` | exit | result |\n|---|---|---|---|")
    for number, result in enumerate(runs, 1):
        minutes, seconds = divmod(float(str(result["wall_s"])), 60)
        print(f"| {number} | {int(minutes)} min {seconds:.0f} s | {result['exit']} | "
              f"{result['summary']} |")  # fmt: skip
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
