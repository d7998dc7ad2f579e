"""What a node's cleanup offers ticked: the GPUs that look stuck, not every GPU (a cleanup kills
and resets what it is given; an operator who clicks through must not take a running server's
GPU or another user's)."""

from __future__ import annotations

import pytest

from nodes.domain.gpu_holders import GpuState, Holder
from nodes.models import LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services.holders import Inspection, stuck_gpus
from nodes.workflows import launching
from tests.factories import make_node, make_user

pytestmark = pytest.mark.django_db
GiB = 2**30


def _launch(node, status: str, actor) -> int:
    profile, _ = LaunchProfile.objects.get_or_create(name="qwen", created_by="pat")
    revision, _ = ProfileRevision.objects.get_or_create(
        profile=profile, number=1,
        defaults=dict(args=["--model-path", "/m"], env={}, author="pat", node=node, verdict="ok",
                      report={}),
    )  # fmt: skip
    launch = launching.create(node=node, revision=revision, actor=actor)
    launch.status = status
    launch.save(update_fields=["status"])
    return launch.pk


def gpu(index: int, *, used: int = 0, orphaned: int = 0, holders=(), state="held") -> GpuState:
    return GpuState(index, state, 96 * GiB, used, orphaned, list(holders))


def test_only_gpus_held_by_nothing_or_by_an_ended_launch_are_ticked():
    node = make_node("gpu-01", gpus=6, host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFake")
    olga = make_user("olga", "operator")
    running, ended = (
        _launch(node, LaunchStatus.READY, olga),
        _launch(node, LaunchStatus.FAILED, olga),
    )
    reading = Inspection(
        gpus=[
            gpu(0, state="free"),
            gpu(1, used=90 * GiB, holders=[Holder(pid=10, launch_id=running)]),
            gpu(2, used=90 * GiB, orphaned=90 * GiB),  # memory with no process
            gpu(3, used=90 * GiB, holders=[Holder(pid=11, launch_id=ended)]),
            gpu(4, used=20 * GiB, holders=[Holder(pid=12)]),  # someone else's job
            gpu(5, used=90 * GiB, orphaned=90 * GiB, state="quarantined"),
        ],
        host={},
        holders=[],
        groups={},
    )
    assert stuck_gpus(reading) == [2, 3]
