"""Data copied into the project (the brief: it must stand alone) stays in step with its source."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"


def test_the_two_flag_table_copies_are_identical():
    product = ROOT / "nodes" / "data" / "sglang-flags-by-version.tsv"
    simulated = ROOT / "simfleet" / "node" / "site" / "sglang" / "flags-by-version.tsv"
    assert product.read_bytes() == simulated.read_bytes()


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared beside this checkout")
def test_copies_match_shared_when_it_is_there():
    source = SHARED / "reference" / "sglang-flags-by-version.tsv"
    assert (ROOT / "nodes" / "data" / source.name).read_bytes() == source.read_bytes()
    observations = SHARED / "reference" / "kv-observations.json"
    copy = ROOT / "tests" / "fixtures" / "kv" / "observations.json"
    assert copy.read_bytes() == observations.read_bytes()
    fixtures = ROOT / "tests" / "fixtures" / "cases"
    shared_cases = {p.name for p in (SHARED / "cases").iterdir() if p.is_dir()}
    assert shared_cases <= {p.name for p in fixtures.iterdir() if p.is_dir()}, "copy every case"
    assert (fixtures / "FORMAT.md").read_bytes() == (SHARED / "cases" / "FORMAT.md").read_bytes()
    for case in fixtures.iterdir():
        if case.is_dir():
            compare = filecmp.dircmp(case, SHARED / "cases" / case.name)
            assert not compare.diff_files and not compare.left_only, case.name
