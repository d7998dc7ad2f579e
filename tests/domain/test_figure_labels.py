"""A diagnosis's figures under readable names with their units."""

from __future__ import annotations

import pytest

from nodes.domain.figure_labels import label, value


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("tried_to_allocate_gib", "tried to allocate (GiB)"),
        ("free_gib_at_oom", "free at OOM (GiB)"),
        ("nccl_timeout_ms", "nccl timeout (ms)"),
        ("tp_size", "TP size"),
        ("gpu0_used_mib", "gpu0 used (MiB)"),
        ("suggested_hicache_size_gb", "suggested hicache size (GB)"),
        ("holder_pid", "holder PID"),
        ("seq_num", "seq num"),
    ],
)
def test_a_figure_key_reads_as_words_with_its_unit(key, shown):
    assert label(key) == shown


@pytest.mark.parametrize(
    ("key", "figure", "shown"),
    [
        ("running", 114.667, "114.7"),
        ("queued", 98.08, "98.1"),
        ("free_gib", 3.256, "3.26"),
        ("token_usage", 0.9871, "98.7 %"),
        ("cache_hit_rate", 0.0, "0.0 %"),
        ("pool_tokens", 856123, "856,123"),
        ("weights_gib", 72.29, "72.29"),
        ("running", 12.0, "12"),
        ("free_bytes", 98_000_000_000, "98,000,000,000"),
        ("note", "n/a", "n/a"),
    ],
)
def test_a_figure_reads_without_float_noise(key, figure, shown):
    assert value(key, figure) == shown
