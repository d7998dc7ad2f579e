"""A diagnosis's figures under readable names with their units."""

from __future__ import annotations

import pytest

from nodes.domain.figure_labels import label


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
