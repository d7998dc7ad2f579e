"""A diagnosis's figure keys (``numbers``: ``tried_to_allocate_gib``) as an operator reads them
(``tried to allocate (GiB)``): the unit suffix becomes a unit in brackets, underscores spaces."""

from __future__ import annotations

#: Key suffixes and the unit each names, longest first where one ends another.
UNITS = (
    ("_bytes", "bytes"),
    ("_gib", "GiB"),
    ("_mib", "MiB"),
    ("_kib", "KiB"),
    ("_gb", "GB"),
    ("_mb", "MB"),
    ("_ms", "ms"),
    ("_s", "s"),
    ("_min", "min"),
    ("_percent", "%"),
)
#: Words spelled as operators spell them.
WORDS = {"tp": "TP", "pp": "PP", "dp": "DP", "kv": "KV", "gpu": "GPU", "gpus": "GPUs", "pid": "PID"}


def label(key: str) -> str:
    """``"free_gib_at_oom"`` → ``"free at OOM (GiB)"``; a key without a unit keeps its words."""
    unit = ""
    words = key.split("_")
    for suffix, name in UNITS:
        part = suffix[1:]
        if part in words[1:]:
            words.remove(part)
            unit = name
            break
    text = " ".join(WORDS.get(w, w.upper() if w == "oom" else w) for w in words)
    return f"{text} ({unit})" if unit else text
