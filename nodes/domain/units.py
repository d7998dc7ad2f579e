"""Memory sizes: decimal (GB = 10^9 bytes) and binary (GiB = 2^30 bytes) units, always explicit.

Rankwise stores every size as integer bytes. A size typed by a person must name its unit, because
the difference is not cosmetic: 96 GiB is 103.08 GB, and NVIDIA and SGLang use different ones
(``nvidia-smi`` reports MiB; SGLang's ``--hicache-size`` is decimal GB, see
shared/reference/sglang.md §1d).
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation, localcontext

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

#: Unit name → bytes per unit. Names are matched case-sensitively: "Gb" (gigabit) is not "GB".
UNITS: dict[str, int] = {
    "B": 1,
    "KB": KB,
    "MB": MB,
    "GB": GB,
    "TB": TB,
    "KiB": KiB,
    "MiB": MiB,
    "GiB": GiB,
    "TiB": TiB,
}

#: The two units a person chooses between when typing a size into the panel.
ENTRY_UNITS = ("GiB", "GB")

# At most 15 integer digits and 9 decimals: enough for any memory size, small enough to stay exact.
_NUMBER = r"[0-9]{1,15}(?:\.[0-9]{1,9})?"
_SIZE = re.compile(rf"^\s*(?P<number>{_NUMBER})\s*(?P<unit>[A-Za-z]+)\s*$")
_BARE = re.compile(rf"^\s*{_NUMBER}\s*$")


class UnitError(ValueError):
    """A size that cannot be read: no unit, an unknown unit, or not a number."""


def to_bytes(value: Decimal | int | str, unit: str) -> int:
    """Convert ``value`` ``unit`` to integer bytes, rounding half up to a whole byte.

    ``unit`` is a key of ``UNITS``. Raises ``UnitError`` for an unknown unit, a value that is not a
    number, or a negative value.
    """
    if unit not in UNITS:
        raise UnitError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    try:
        number = Decimal(value)
    except (InvalidOperation, ValueError):
        raise UnitError(f"{str(value)[:40]!r} is not a number") from None
    if not number.is_finite() or abs(number.adjusted()) > 30:
        raise UnitError(f"{str(value)[:40]!r} is not a plausible size")
    if number < 0:
        raise UnitError("a size cannot be negative")
    return int((number * UNITS[unit]).to_integral_value(rounding=ROUND_HALF_UP))


def split_size(text: str) -> tuple[Decimal, str]:
    """Split ``"96GiB"`` or ``"449 GB"`` into ``(Decimal("96"), "GiB")``.

    The unit is required: a bare number is ambiguous between GB and GiB, so it raises ``UnitError``
    naming both readings.
    """
    match = _SIZE.match(text)
    if match is None:
        if not _BARE.match(text):
            raise UnitError(
                f"{text[:40]!r} is not a size; write a number and a unit, e.g. 96GiB or 449GB"
            )
        stripped = text.strip()
        bare = Decimal(stripped)
        raise UnitError(
            f"{stripped!r} has no unit: say {stripped}GB ({to_bytes(bare, 'GB'):,} bytes) "
            f"or {stripped}GiB ({to_bytes(bare, 'GiB'):,} bytes)"
        )
    unit = match["unit"]
    if unit not in UNITS:
        raise UnitError(f"unknown unit {unit!r} in {text!r}; use one of {', '.join(UNITS)}")
    return Decimal(match["number"]), unit


def parse_size(text: str) -> int:
    """Parse a size with its unit (``"96GiB"``, ``"449 GB"``, ``"1.5TB"``) into integer bytes.

    Raises ``UnitError`` when the unit is missing or unknown, or the number is malformed.
    """
    number, unit = split_size(text)
    return to_bytes(number, unit)


def format_bytes(size: int, unit: str = "GiB", places: int = 1) -> str:
    """Format integer bytes in ``unit`` with the unit always shown: ``"96 GiB"``, ``"140.4 GiB"``.

    Trailing zeros after the decimal point are dropped, so whole sizes read as whole numbers.
    """
    if unit not in UNITS:
        raise UnitError(f"unknown unit {unit!r}")
    with localcontext() as context:
        context.prec = 80  # sizes far beyond any machine still format instead of raising
        value = Decimal(size) / UNITS[unit]
        quantum = Decimal(1).scaleb(-places)
        text = f"{value.quantize(quantum, rounding=ROUND_HALF_UP):f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} {unit}"


def shown_entry(size: int) -> tuple[Decimal, str]:
    """``size`` bytes as a size box shows it: whole GiB when it divides evenly, else GB to two
    decimals (MemTotal's 448,999,999,488 bytes read ``449`` GB, not ``448.999999488``). Not
    exact: a form that shows it keeps the exact bytes when it comes back unchanged
    (``kept_if_unchanged``)."""
    if size % GiB == 0:
        return Decimal(size // GiB), "GiB"
    shown = (Decimal(size) / GB).quantize(Decimal("0.01"))
    return (shown.normalize() if shown == shown.to_integral() else shown), "GB"


def kept_if_unchanged(typed: int | None, initial: int | None) -> int | None:
    """``typed`` bytes, or ``initial`` when what was typed is what ``shown_entry(initial)``
    showed: an unchanged form keeps the exact bytes it was filled from."""
    if typed is None or initial is None:
        return typed
    number, unit = shown_entry(initial)
    return initial if typed == to_bytes(number, unit) else typed
