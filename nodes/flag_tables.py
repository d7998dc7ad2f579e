"""SGLang flag tables shipped with Rankwise (package data), read once per process."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from nodes.domain.sglang_flags import FlagTable, parse_table, table_for

#: The SGLang version a node is assumed to run until discovery reads its own.
DEFAULT_VERSION = "0.5.9"
TABLE_FILE = Path(__file__).resolve().parent / "data" / "sglang-flags-by-version.tsv"


@cache
def _tables() -> dict[str, FlagTable]:
    return parse_table(TABLE_FILE.read_text())


def table(version: str | None) -> FlagTable:
    """The flag table that applies to SGLang ``version`` (the newest not newer than it);
    ``DEFAULT_VERSION``'s when the version is unknown (empty or None)."""
    return _tables()[table_for(version or DEFAULT_VERSION)]
