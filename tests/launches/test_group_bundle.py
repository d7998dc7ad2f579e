"""The bundle of a multi-node launch (issue 22): one log with every node's lines in stored
order, each after ``[NODE] ``; node 0's facts with ``nodes_in_launch`` and, in ``extra.group``,
every node's name, node rank, TP ranks and snapshots; read back and diagnosed, it names the
node."""

from __future__ import annotations

import io
import tarfile

import pytest

from nodes.domain.log_lines import level_of, rank_of
from nodes.models import Launch, LaunchLogLine, LaunchProfile, ProfileRevision
from nodes.models.choices import LaunchStatus
from nodes.services import bundles
from tests.factories import make_node

pytestmark = pytest.mark.django_db


def _snapshot(time: float, oom: list[str] | None = None) -> dict:
    return {
        "time": time,
        "meminfo": {"MemTotal": 449_000_000_000, "MemAvailable": 300_000_000_000},
        "launch": {"members": []},
        "oom_lines": oom or [],
        "gpus": [],
    }


def _group(args: list[str], *, nodes: int = 2) -> tuple[Launch, list[Launch]]:
    """A failed launch over ``nodes`` nodes (``node-a`` is node 0): the group launch and its
    parts, each with the snapshot taken at the failure on its node."""
    hosts = [make_node(f"node-{chr(97 + r)}", host=f"10.0.0.{r + 1}") for r in range(nodes)]
    profile = LaunchProfile.objects.create(name="kimi-2n", created_by="olga")
    revision = ProfileRevision.objects.create(
        profile=profile, number=1, env={}, author="olga", verdict="ok", args=args, report={}
    )
    common = {
        "revision": revision,
        "gpus": list(range(8)),
        "port": 30000,
        "created_by": "olga",
        "startup_timeout_s": 900,
        "status": LaunchStatus.FAILED,
        "dist_init_addr": "10.0.0.1:5000",
    }
    head = Launch.objects.create(
        node=hosts[0],
        node_rank=0,
        reason="the server exited (code -9) during start-up",
        snapshot=_snapshot(1764547200.0),
        **common,
    )
    parts = [
        Launch.objects.create(
            node=hosts[r],
            node_rank=r,
            group=head,
            reason="stopped with the group",
            snapshot=_snapshot(1764547201.0 + r, oom=[f"node-{chr(97 + r)} kernel line {r}"]),
            **common,
        )
        for r in range(1, nodes)
    ]
    return head, parts


def _lines(head: Launch, rows: list[tuple[str, str]]) -> None:
    LaunchLogLine.objects.bulk_create(
        LaunchLogLine(
            launch=head, seq=i, text=text, node=node, level=level_of(text), rank=rank_of(text)
        )
        for i, (node, text) in enumerate(rows, 1)
    )
    head.last_seq = len(rows)
    head.save(update_fields=["last_seq"])


ARGS = ["--model-path", "/models/kimi", "--tp-size", "16", "--nnodes", "2"]
STORE_TIMEOUT = [
    ("node-a", "[2026-12-01 10:00:00 TP0] Init torch distributed begin."),
    ("node-b", "[2026-12-01 10:00:01 TP8] Init torch distributed begin."),
    ("node-a", "[2026-12-01 10:10:01 TP0] Scheduler hit an exception: Traceback (most recent"),
    ("node-a", '  File "/sglang/srt/model_executor/model_runner.py", line 812, in init_torch'),
    (
        "node-a",
        "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
        "8/16 clients joined.",
    ),
    ("", "panel: stopping the group"),
]


def test_the_group_log_has_every_node_s_lines_in_stored_order_each_after_its_node():
    head, _ = _group(ARGS)
    _lines(head, STORE_TIMEOUT)

    text = bundles.launch_log_text(head)

    assert text.splitlines() == [f"[{n}] {t}" if n else t for n, t in STORE_TIMEOUT]
    assert text.splitlines()[1] == (
        "[node-b] [2026-12-01 10:00:01 TP8] Init torch distributed begin."
    )


def test_a_one_node_launch_keeps_its_lines_as_they_were_printed():
    head, parts = _group(ARGS)
    Launch.objects.filter(pk__in=[p.pk for p in parts]).delete()
    _lines(head, [("", "[2026-12-01 10:00:00 TP0] Init torch distributed begin.")])

    assert bundles.launch_log_text(head) == (
        "[2026-12-01 10:00:00 TP0] Init torch distributed begin.\n"
    )
    assert "group" not in bundles.facts_of(head)["extra"]


def test_the_group_facts_list_every_node_with_its_tp_ranks_and_its_own_snapshots():
    head, _ = _group(ARGS)

    facts = bundles.facts_of(head)

    assert facts["nodes_in_launch"] == 2
    assert facts["node"]["name"] == "node-a"
    group = facts["extra"]["group"]
    assert [(g["name"], g["node_rank"]) for g in group] == [("node-a", 0), ("node-b", 1)]
    assert group[0]["tp_ranks"] == list(range(0, 8))
    assert group[1]["tp_ranks"] == list(range(8, 16))
    # Each node's snapshot is its own, in the bundle's snapshot shape, with the panel's reason.
    assert group[0]["snapshots"] == facts["snapshots"]
    after_b = group[1]["snapshots"][-1]
    assert after_b["phase"] == "after_failure"
    assert after_b["kernel_log"] == ["node-b kernel line 1"]
    assert after_b["notes"][0] == "panel: stopped with the group"
    assert after_b["taken_at"] == "2025-12-01T00:00:02Z"


def test_tp_ranks_per_node_count_pipeline_stages_too():
    head, _ = _group(["--model-path", "/m", "--tp-size", "8", "--pp-size", "2", "--nnodes", "2"])

    group = bundles.facts_of(head)["extra"]["group"]

    assert [g["tp_ranks"] for g in group] == [list(range(0, 8)), list(range(8, 16))]


def test_a_part_gives_its_group_s_bundle():
    head, parts = _group(ARGS)
    _lines(head, STORE_TIMEOUT)

    assert bundles.facts_of(parts[0])["extra"]["group"] == bundles.facts_of(head)["extra"]["group"]
    assert bundles.launch_log_text(parts[0]) == bundles.launch_log_text(head)


def test_the_downloaded_group_bundle_reads_back_and_its_diagnosis_names_the_node():
    head, _ = _group(ARGS)
    _lines(head, STORE_TIMEOUT)

    data = bundles.launch_bundle(head)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        names = sorted(m.name for m in archive.getmembers())
    assert names == [f"launch-{head.pk}/facts.json", f"launch-{head.pk}/launch.log"]
    upload = io.BytesIO(data)
    upload.name = "group.tar.gz"
    log, facts = bundles.read_bundle_file(upload)
    found = bundles.diagnose_bundle(log, facts)

    assert found.category == "nccl-init-hang"
    assert "8 of the 16 ranks joined" in found.summary
    assert "node-b (node rank 1, TP8–TP15) never joined" in found.summary
    assert found.evidence[0].text.startswith("[node-a] torch.distributed.DistStoreError")
