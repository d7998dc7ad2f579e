"""Who holds a GPU, each GPU's state, and what each cleanup step may act on."""

from __future__ import annotations

from typing import Any

from nodes.domain import gpu_holders as gh

GiB = 2**30


def proc(
    pid: int,
    *,
    ppid: int = 1,
    state: str = "S",
    pgid: int | None = None,
    sid: int | None = None,
    devices: tuple[str, ...] | list[str] = (),
    marker: str | None = None,
    command: str = "x",
) -> dict[str, Any]:
    return {
        "pid": pid,
        "ppid": ppid,
        "state": state,
        "pgid": pgid or pid,
        "sid": sid or pid,
        "devices": list(devices),
        "launch_marker": marker,
        "command": command,
    }


def gpu(index: int, used: int, *processes: tuple[int, int]) -> dict[str, Any]:
    return {
        "index": index,
        "memory_total_bytes": 96 * GiB,
        "memory_used_bytes": used,
        "processes": [{"pid": p, "name": "python3", "used_memory_bytes": b} for p, b in processes],
    }


def test_holders_merge_nvml_and_device_files_and_know_their_launch():
    found = gh.holders(
        [
            proc(100, pgid=100, devices=["0", "ctl"], command="sglang::scheduler_TP0"),
            proc(200, devices=["1"], command="python3 train.py"),  # invisible to NVML
            proc(300, pgid=999, sid=100, state="Z", command="[sglang::schedul]"),
        ],
        [gpu(0, 40 * GiB, (100, 39 * GiB)), gpu(1, 20 * GiB), gpu(2, 10 * GiB, (4242, 9 * GiB))],
        {100: 7},
    )
    by_pid = {h.pid: h for h in found}
    assert by_pid[100].launch_id == 7 and by_pid[100].gpus == [0]
    assert by_pid[100].seen_by == ["device files", "nvml"]
    assert by_pid[200].launch_id is None and by_pid[200].seen_by == ["device files"]
    assert by_pid[300].launch_id == 7 and by_pid[300].state == "Z"  # its session is the launch's
    assert by_pid[4242].seen_by == ["nvml"] and by_pid[4242].used_bytes == {2: 9 * GiB}


def test_memory_with_no_live_holder_is_orphaned_and_quarantine_wins():
    found = gh.holders([proc(5, state="Z", devices=["1"])], [], {})
    states = gh.gpu_states(
        [gpu(0, 4 * 2**20), gpu(1, 60 * GiB), gpu(2, 60 * GiB)], found, {2: "held since…"}
    )
    assert [(s.state, s.orphaned_bytes) for s in states] == [
        ("free", 0),
        ("held", 60 * GiB),  # a defunct entry holds nothing
        ("quarantined", 60 * GiB),
    ]
    assert states[2].to_json()["quarantine_reason"] == "held since…"


def test_steps_touch_the_launch_and_only_the_foreign_holders_named():
    found = gh.holders(
        [
            proc(100, pgid=100, devices=["0"]),
            proc(150, ppid=1, pgid=150, marker="7", devices=["0"]),  # re-parented stray
            proc(160, pgid=100, state="Z"),
            proc(200, devices=["0"]),
            proc(300, devices=["1"]),
            proc(400, devices=["3"]),
        ],
        [],
        {100: 7},
    )
    plan = gh.targets(found, launch_id=7, group=100, chosen=[0, 1], named_foreign=[300, 400])
    assert plan.strays == [150] and plan.defunct == [160]
    assert plan.foreign == [300]  # 400 holds GPU 3, not a chosen one
    assert [h.pid for h in plan.untouched] == [200]


def test_host_memory_that_did_not_come_back():
    host = gh.host_state(
        {"MemTotal": 449 * 10**9, "MemAvailable": 100 * 10**9, "Mlocked": 300 * 10**9},
        [{"name": "nccl-1", "bytes": 4096}],
        available_before=440 * 10**9,
    )
    assert host["not_returned_bytes"] == 340 * 10**9 and host["shm_bytes"] == 4096
    assert host["mlocked_bytes"] == 300 * 10**9


def test_a_group_whose_leader_is_gone_counts_only_for_processes_from_before_the_launch_ended():
    stuck = proc(70, pgid=50, state="D")
    stuck["started_at"] = 1000.0
    newcomer = proc(71, pgid=50)
    newcomer["started_at"] = 5000.0  # a process of a group that reused the id later
    found = gh.holders([stuck, newcomer], [], {}, {50: (9, 2000.0)})
    assert {h.pid: h.launch_id for h in found} == {70: 9, 71: None}
