"""Sizes with explicit units (GB = 10^9, GiB = 2^30), parsed independently of Rankwise's code."""

from __future__ import annotations

import re

UNITS = {"B": 1, "MB": 10**6, "GB": 10**9, "TB": 10**12, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]+)\s*$")


def parse_size(text: str | int) -> int:
    """``"141GiB"`` → bytes; an int is taken as bytes. Raises ValueError without a known unit."""
    if isinstance(text, int):
        return text
    match = _SIZE.match(text)
    if not match or match[2] not in UNITS:
        raise ValueError(f"{text!r}: give a size with a unit ({', '.join(UNITS)})")
    whole, _, frac = match[1].partition(".")
    scale = UNITS[match[2]]
    return int(whole) * scale + (int(frac) * scale // 10 ** len(frac) if frac else 0)
