"""What a launch needs (ranks, GPUs, ports, environment) and the pre-flight checks' verdicts."""

from __future__ import annotations

import pytest

from nodes.domain import launch_plan as plan
from nodes.domain.budget import BudgetReport
from nodes.domain.sglang_flags import ParsedCommand
from nodes.domain.units import GiB


def flags(**values) -> ParsedCommand:
    return ParsedCommand(values=values, given=set(values))


@pytest.mark.parametrize(
    ("values", "ranks"),
    [
        ({}, 1),
        ({"tp_size": 8}, 8),
        ({"tp_size": 2, "pp_size": 2}, 4),
        ({"tp_size": 2, "dp_size": 2}, 4),
        ({"tp_size": 8, "dp_size": 8, "enable_dp_attention": True}, 8),
    ],
)
def test_ranks_on_one_node(values, ranks):
    assert plan.ranks_needed(flags(**values)) == ranks


def test_a_multi_node_command_needs_its_share_of_ranks_on_each_node():
    assert plan.ranks_needed(flags(tp_size=16, nnodes=2)) == 8
    assert plan.ranks_needed(flags(tp_size=8, pp_size=2, nnodes=4)) == 4
    with pytest.raises(plan.PlanError, match="not divisible by --nnodes 3"):
        plan.ranks_needed(flags(tp_size=16, nnodes=3))
    with pytest.raises(plan.PlanError, match="one node only"):
        plan.ranks_needed(flags(tp_size=8, dp_size=2, nnodes=2))


def test_ports_include_the_derived_ones():
    assert plan.ports_needed(flags()) == [30000]
    assert plan.ports_needed(flags(port=31000, nccl_port=31500)) == [31000, 31500]
    assert plan.ports_needed(flags(enable_dp_attention=True)) == [30000, 30233]


def test_default_gpus_are_the_first_free_ones():
    assert plan.choose_gpus(range(8), {0, 2}, 3, None) == [1, 3, 4]


@pytest.mark.parametrize(
    ("wanted", "message"),
    [([9], "has no GPU 9"), ([0], "needs 2 GPU"), ([0, 1, 2], "needs 2 GPU")],
)
def test_chosen_gpus_must_exist_and_match_the_ranks(wanted, message):
    with pytest.raises(plan.PlanError, match=message):
        plan.choose_gpus(range(8), set(), 2, wanted)


def test_too_few_free_gpus_says_how_many_are_free():
    with pytest.raises(plan.PlanError, match="has 1 free of 2"):
        plan.choose_gpus(range(2), {1}, 2, None)


def test_the_environment_pins_the_reserved_gpus():
    env = plan.launch_env({"HF_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "0"}, [4, 5])
    assert env == {"HF_TOKEN": "x", "CUDA_VISIBLE_DEVICES": "4,5"}


def test_gpus_with_a_foreign_process_or_held_memory_fail_with_the_pids():
    gpus = [
        plan.GpuNow(0, 0),
        plan.GpuNow(1, 20 * GiB, ((4242, "python3"),)),
        plan.GpuNow(2, 80 * GiB),
    ]
    check = plan.check_gpus_idle(gpus, [0, 1, 2])
    assert not check.passed
    assert "GPU 1 is used by PID 4242 (python3): 20 GiB held" in check.detail
    assert "GPU 2 has 80 GiB used with no process (held memory; clean up first)" in check.detail
    assert plan.check_gpus_idle(gpus, [0]).passed
    # A GPU a cleanup already quarantined is not sent back to the cleanup (a newcomer's find).
    held = plan.check_gpus_idle(gpus, [2], quarantined={2})
    assert "clean up first" not in held.detail
    assert "quarantined: a cleanup could not free it; a driver reload or a reboot does" in (
        held.detail
    )


def test_a_warn_verdict_passes_with_its_warning_and_block_fails():
    report = BudgetReport()
    report.add("warn", "pinned", "66% of host RAM would be pinned")
    check = plan.check_budget(report)
    assert check.passed and "warning: 66% of host RAM" in check.detail
    report.add("block", "host_oom", "8 ranks × 300 GB = 2400 GB > 449 GB")
    assert not plan.check_budget(report).passed


def test_flag_problems_belong_to_the_sglang_check():
    report = BudgetReport()
    report.add("block", "flag_unknown", "--foo is not a flag of SGLang 0.5.9")
    assert plan.check_budget(report).passed


def test_ports_shm_and_model_checks():
    assert not plan.check_ports([30000], [22, 30000]).passed
    assert plan.check_ports([30000], [22]).passed
    assert not plan.check_shm(64 * 2**20, 8).passed
    assert plan.check_shm(64 * 2**20, 1).passed
    assert not plan.check_model("/m", False, "no such folder on the node").passed
    assert plan.check_model("org/model", None, "not a local path").passed


def test_overrides_apply_only_to_failed_overridable_checks():
    checks = [
        plan.Check("budget", False, "too big"),
        plan.Check("reservation", False, "held"),
        plan.Check("shm", True, "ok"),
    ]
    plan.apply_overrides(checks, {"budget": "on purpose", "reservation": "x", "shm": "y"})
    assert [c.blocks for c in checks] == [False, True, False]
    assert checks[0].override == "on purpose" and checks[2].override == ""
    assert plan.unknown_overrides(["budget", "reservation", "nope"]) == ["reservation", "nope"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0,0", "GPU 0 is listed twice"),
        ("1,,", "expected GPU indexes"),
        ("\u0661", "expected GPU indexes"),  # an Arabic-Indic digit
        ("+1", "expected GPU indexes"),
        ("1_0", "expected GPU indexes"),
        ("-1", "expected GPU indexes"),
        ("", "expected GPU indexes"),
    ],
)
def test_gpu_lists_are_plain_ascii_indexes_each_once(text, message):
    with pytest.raises(plan.PlanError, match=message):
        plan.parse_gpu_list(text)
    assert plan.parse_gpu_list(" 3, 1 ") == [3, 1]


@pytest.mark.parametrize("port", [0, -1, 65536, 10**20])
def test_ports_outside_tcp_are_refused(port):
    with pytest.raises(plan.PlanError, match="is not a TCP port"):
        plan.check_port_numbers([30000, port])


def test_a_launch_on_another_port_appends_it():
    assert plan.launch_args(["--model-path", "/m"], flags(), 30001) == [
        "--model-path",
        "/m",
        "--port",
        "30001",
    ]
    assert plan.launch_args(["--port", "31000"], flags(port=31000), 31000) == ["--port", "31000"]


def test_ranks_that_die_or_turn_defunct_are_reported_once_seen():
    seen: dict[int, str] = {}
    alive = [
        {"pid": 10, "command": "python3 -m sglang.launch_server --tp 2", "state": "S"},
        {"pid": 11, "command": "sglang::scheduler_TP0", "state": "S"},
        {"pid": 12, "command": "sglang::scheduler_TP1", "state": "R"},
    ]
    assert plan.dead_ranks(seen, alive) == []
    assert plan.dead_ranks(seen, alive[:2]) == ["sglang::scheduler_TP1 (PID 12)"]
    zombie = [alive[0], {**alive[1], "state": "Z"}]
    assert "sglang::scheduler_TP0 (PID 11)" in plan.dead_ranks(seen, zombie)


def test_a_rank_that_died_before_it_was_first_seen_is_dead_too():
    # Killed before the follower first looked: only the kernel's 15-character name is left.
    defunct = {"pid": 52, "command": "[sglang::schedul]", "name": "sglang::schedul", "state": "Z"}
    alive = {"pid": 51, "command": "sglang::scheduler_TP0", "name": "sglang::schedul", "state": "S"}
    assert plan.dead_ranks({}, [alive, defunct]) == ["sglang::scheduler (PID 52, defunct)"]
    other = {"pid": 60, "command": "[python3]", "name": "python3", "state": "Z"}
    assert plan.dead_ranks({}, [alive, other]) == []


def test_a_rank_in_uninterruptible_sleep_is_alive_though_its_command_line_is_not_read():
    """Under load a rank pinning host memory sleeps in ``D`` for a moment; the agent then reads
    only its ``stat`` name (reading /proc/PID/cmdline could hang on its memory map), so its
    command is ``[sglang::schedul]``. Found as "scheduler_TP11 died during start-up" on a busy
    machine: the same PID, alive, is the same rank."""
    seen: dict[int, str] = {}
    rank = {"pid": 11, "command": "sglang::scheduler_TP11", "name": "sglang::schedul", "state": "S"}
    assert plan.dead_ranks(seen, [rank]) == []
    asleep = {**rank, "command": "[sglang::schedul]", "state": "D"}
    assert plan.dead_ranks(seen, [asleep]) == []
    assert plan.dead_ranks(seen, [rank]) == []
    assert plan.dead_ranks(seen, [{**asleep, "state": "Z"}]) == ["sglang::scheduler_TP11 (PID 11)"]
