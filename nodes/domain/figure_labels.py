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


#: Figures that are shares of a whole (0–1), shown as percentages: SGLang's
#: ``sglang:token_usage`` and ``sglang:cache_hit_rate`` gauges, as the capacity advisor keeps them.
SHARES = frozenset({"token_usage", "cache_hit_rate"})
#: Means of request counts (the advisor's ``num_running_reqs``/``num_queue_reqs`` over a window).
COUNTS = frozenset({"running", "queued"})


def value(key: str, figure: object) -> str:
    """A figure as an operator reads it: whole numbers with thousands separators, shares
    (``SHARES``) as percentages, means of counts to one decimal (114.667 running requests read
    ``114.7``), other fractions to two (as logs print GiB). Anything else as it is."""
    if isinstance(figure, bool) or not isinstance(figure, int | float):
        return str(figure)
    if str(key) in SHARES and 0 <= figure <= 1:
        return f"{figure * 100:.1f} %"
    if isinstance(figure, int) or (figure.is_integer() and abs(figure) < 2**53):
        return f"{int(figure):,}"
    places = 1 if str(key) in COUNTS or abs(figure) >= 100 else 2
    return f"{figure:,.{places}f}"
