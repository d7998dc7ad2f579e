"""An audit entry's change in words: changed fields only."""

from __future__ import annotations

from nodes.domain.audit_changes import MAX_VALUE_CHARS, Change, changes


def test_only_the_fields_that_differ_are_listed():
    before = {"team": None, "visibility": "everyone", "labels": ["a"]}
    after = {"team": "research", "visibility": "everyone", "labels": ["a", "b"]}
    assert changes(before, after) == [
        Change("team", "none", "research"),
        Change("labels", "a", "a, b"),
    ]


def test_a_created_object_lists_every_field_and_objects_read_as_key_value():
    found = changes(None, {"revision": 2, "env": {"A": "1", "B": "2"}})
    assert found == [Change("revision", None, "2"), Change("env", None, "A=1, B=2")]


def test_long_values_are_cut_and_non_objects_are_one_value():
    (long,) = changes({}, {"command": "x" * 1000})
    assert long.after is not None and len(long.after) == MAX_VALUE_CHARS
    assert long.after.endswith("…")
    assert changes("a", "b") == [Change("value", "a", "b")]
    assert changes({"same": 1}, {"same": 1}) == []


def test_a_list_of_records_reads_one_record_after_another():
    checks = [{"name": "budget", "passed": False}, {"name": "shm", "passed": True}]
    (found,) = changes(None, {"checks": checks})
    assert found.after == "name=budget, passed=False; name=shm, passed=True"
