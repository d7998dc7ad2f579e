from __future__ import annotations

from decimal import Decimal

import pytest

from nodes.domain.units import (
    GB,
    GiB,
    UnitError,
    format_bytes,
    kept_if_unchanged,
    parse_size,
    shown_entry,
    split_size,
    to_bytes,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("96GiB", 96 * 2**30),
        ("96 GB", 96 * 10**9),
        ("449GB", 449_000_000_000),
        ("1.5TB", 1_500_000_000_000),
        ("141 GiB", 151_397_597_184),
        ("0.5 GiB", 536_870_912),
        ("512MiB", 536_870_912),
    ],
)
def test_parse_size_reads_the_unit(text, expected):
    assert parse_size(text) == expected


def test_96_gib_is_not_96_gb():
    assert parse_size("96GiB") - parse_size("96GB") == 7_079_215_104


@pytest.mark.parametrize("text", ["96", "  300 "])
def test_bare_number_is_refused_with_both_readings(text):
    with pytest.raises(UnitError) as err:
        parse_size(text)
    message = str(err.value)
    assert "no unit" in message
    assert "GB" in message and "GiB" in message


@pytest.mark.parametrize("text", ["96 Gb", "96 gigs", "GiB", "-5GB", "1e3GB", "", "ninety GB"])
def test_malformed_sizes_are_refused(text):
    with pytest.raises(UnitError):
        parse_size(text)


def test_to_bytes_rounds_half_up_and_rejects_negative():
    assert to_bytes(Decimal("0.0000000005"), "GB") == 1
    with pytest.raises(UnitError):
        to_bytes(-1, "GB")
    with pytest.raises(UnitError):
        to_bytes(1, "gb")


@pytest.mark.parametrize(
    ("size", "unit", "text"),
    [
        (96 * GiB, "GiB", "96 GiB"),
        (449 * GB, "GB", "449 GB"),
        (449 * GB, "GiB", "418.2 GiB"),
        (150_754_820_096, "GiB", "140.4 GiB"),
        (0, "GB", "0 GB"),
    ],
)
def test_format_bytes_always_names_the_unit(size, unit, text):
    assert format_bytes(size, unit) == text


@pytest.mark.parametrize("size", [96 * GiB, 449 * GB, 150_754_820_096, 1, 123_456_789_012])
def test_a_shown_size_sent_back_unchanged_keeps_its_exact_bytes(size):
    number, unit = shown_entry(size)
    assert kept_if_unchanged(to_bytes(number, unit), size) == size
    assert abs(to_bytes(number, unit) - size) <= GB // 200  # shown to 0.01 GB
    assert kept_if_unchanged(to_bytes(number + 1, unit), size) == to_bytes(number + 1, unit)


def test_split_size_keeps_number_and_unit():
    assert split_size("96GiB") == (Decimal("96"), "GiB")
