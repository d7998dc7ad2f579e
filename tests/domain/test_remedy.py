"""A diagnosis's remedy as flag changes applied to a revision's flags."""

from __future__ import annotations

import pytest

from nodes.domain.remedy import changes_for, describe, with_changes
from nodes.domain.sglang_flags import parse_command
from nodes.flag_tables import table

T = table("0.5.9")


def test_a_flag_is_replaced_in_every_spelling_and_set_once_at_the_end():
    args = ["--model-path", "/m", "--hicache-size=300", "--tp", "8", "--hicache-size", "200"]
    out = with_changes(args, {"--hicache-size": 37}, T)
    assert out == ["--model-path", "/m", "--tp", "8", "--hicache-size", "37"]
    assert parse_command(out, T).values["hicache_size"] == 37


def test_an_alias_counts_as_the_same_flag():
    args = ["--tensor-parallel-size", "6", "--model-path", "/m"]
    out = with_changes(args, {"--tp-size": 4}, T)
    assert out == ["--model-path", "/m", "--tp-size", "4"]


def test_an_abbreviation_argparse_takes_for_the_flag_is_replaced_too():
    """``--hicache-si 300`` is ``--hicache-size 300`` to SGLang's parser: left in, it would be
    read after the change and undo it."""
    args = ["--model-path", "/m", "--hicache-si", "300", "--hicache-r", "2"]
    out = with_changes(args, {"--hicache-size": 37}, T)
    assert out == ["--model-path", "/m", "--hicache-r", "2", "--hicache-size", "37"]
    assert parse_command(out, T).values["hicache_size"] == 37
    # An ambiguous prefix is no spelling of it: argparse refuses it, and so it stays.
    assert "--hicache" in with_changes(["--hicache", "1"], {"--hicache-size": 37}, T)


def test_switches_are_added_and_flags_dropped():
    args = ["--model-path", "/m", "--cuda-graph-max-bs", "256"]
    out = with_changes(args, {"--trust-remote-code": True, "--cuda-graph-max-bs": None}, T)
    assert out == ["--model-path", "/m", "--trust-remote-code"]


def test_a_flag_the_version_lacks_is_refused():
    with pytest.raises(ValueError, match="not a flag of SGLang"):
        with_changes(["--model-path", "/m"], {"--no-such-flag": 1}, T)


def test_the_budget_engines_suggestion_wins_for_memory_categories():
    numbers = {"suggested_hicache_size_gb": 54.0}
    assert changes_for("host-oom-hicache", numbers) == {"--hicache-size": 54}
    assert changes_for("host-oom-hicache", numbers, {"--hicache-size": 37}) == {
        "--hicache-size": 37
    }
    # The budget's words are not the answer to a port collision.
    assert changes_for("port-in-use", {"port": 30000}, {"--hicache-size": 37}) == {}


def test_categories_without_a_flag_remedy_suggest_nothing():
    assert changes_for("leaked-gpu-memory", {"gpu0_used_mib": 98000}) == {}
    assert changes_for("trust-remote-code", {}) == {"--trust-remote-code": True}


def test_changes_read_as_flags():
    assert describe({"--hicache-size": 37, "--trust-remote-code": True}) == (
        "--hicache-size 37 --trust-remote-code"
    )
    assert describe({"--cuda-graph-max-bs": None}) == "without --cuda-graph-max-bs"
