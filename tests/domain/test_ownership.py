"""Whose memory it is: a node's host RAM by launch commitment, pinned or still to come."""

from __future__ import annotations

from nodes.domain.ownership import host_share
from nodes.domain.units import GB


def test_a_pinned_pool_is_ours_and_one_still_to_come_is_committed():
    # 449 GB; one launch pinned 200 GB (MemAvailable already counts it), another will pin 100.
    share = host_share(449 * GB, 240 * GB, [(200 * GB, True), (100 * GB, False)])
    assert share is not None
    assert (share.pinned_bytes, share.committed_bytes) == (200 * GB, 100 * GB)
    assert share.free_bytes == 140 * GB  # what is available less what is still to come
    assert share.used_bytes == 9 * GB  # the rest: the OS and everything else
    parts = share.pinned_bytes + share.committed_bytes + share.used_bytes + share.free_bytes
    assert parts == share.total_bytes


def test_without_commitments_everything_not_available_is_used_besides():
    share = host_share(449 * GB, 400 * GB, [])
    assert share is not None and share.pinned_bytes == share.committed_bytes == 0
    assert (share.used_bytes, share.free_bytes) == (49 * GB, 400 * GB)
    assert host_share(None, None, []) is None
