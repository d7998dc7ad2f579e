"""The diagnosis engine on big and hostile logs: how long ``diagnose`` takes.

Cases: (1) the incident's log grown to 1,000,000 lines of ordinary SGLang output (rank-tagged
prefill/decode lines) with the 8 host-pool lines and the failure at the end; (2) the same
without any signature (every rule scans every line and none matches: the worst ordinary case);
(3) 1,000,000 lines no two of which have the same shape (their letters differ), the worst case
for the index of line shapes; (4) 2,000 lines of 60,000 characters (a binary dump or a progress
bar without newlines), the
input that made one pattern quadratic before lines were cut. Each case is diagnosed 3 times;
the best and worst wall times are printed. No target is enforced here: the figures go to
benchmarks/RESULTS.md.

Run from the project folder: ``.venv/bin/python -m benchmarks.diagnosis``.
"""

from __future__ import annotations

import time

from nodes.domain.diagnosis import diagnose

GB = 10**9
FACTS = {
    "format": "rankwise-case/1",
    "engine_version": "0.5.9",
    "node": {"name": "n", "host_ram_bytes": 449 * GB, "gpus": []},
    "snapshots": [
        {"phase": "before_launch", "meminfo": {"MemTotal": 449 * GB, "MemAvailable": 440 * GB}}
    ],
}
FLAGS = {"tp_size": 8, "enable_hierarchical_cache": True, "hicache_size": 300}


def ordinary(lines: int) -> list[str]:
    return [
        f"[2026-12-01 10:{i // 60000 % 60:02d}:{i // 1000 % 60:02d} TP{i % 8}] Decode batch. "
        f"#running-req: {i % 64}, #token: {i * 7 % 90000}, token usage: 0.{i % 97:02d}, "
        f"gen throughput (token/s): {i % 3000}.0, #queue-req: 0"
        for i in range(lines)
    ]


def distinct(lines: int) -> list[str]:
    """Lines no two of which look alike even with their digits ignored (letters vary): the
    worst case for the shape index, which then holds every line."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        "[worker] chunk "
        + "".join(letters[(i // 26**k) % 26] for k in range(5))
        + " streamed to the client with status ok"
        for i in range(lines)
    ]


def incident_tail() -> list[str]:
    return [
        f"[2026-12-01 11:00:0{r} TP{r}] Allocating 300.00 GB host memory for hierarchical KV cache."
        for r in range(8)
    ] + ["Rank 3 scheduler is dead. Please check if there are relevant logs."]


def measure(name: str, text: str) -> None:
    times = []
    for _ in range(3):
        begun = time.perf_counter()
        found = diagnose(text, FACTS, FLAGS)
        times.append(time.perf_counter() - begun)
    size = len(text) / 2**20
    print(
        f"{name}: {size:.0f} MiB, {text.count(chr(10))} lines -> {found.category}; "
        f"best {min(times):.2f} s, worst {max(times):.2f} s"
    )


def main() -> None:
    body = ordinary(1_000_000)
    measure("1M lines + incident", "\n".join(body + incident_tail()) + "\n")
    measure("1M lines, no signature", "\n".join(body) + "\n")
    measure("1M distinct lines, no signature", "\n".join(distinct(1_000_000)) + "\n")
    measure("2,000 lines of 60,000 chars", "\n".join(["[" + "x" * 60000 + "]"] * 2000) + "\n")


if __name__ == "__main__":
    main()
