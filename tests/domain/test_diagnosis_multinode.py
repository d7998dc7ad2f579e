"""The diagnosis of a launch over several nodes (issue 22): what an operator reads names the node
and the ranks — a node whose ranks never joined the store, a node that could not reach it, a
rank that died during init on one node, the nodes parting while serving — and any other
diagnosis of such a bundle says which node its line came from.

Bundles are built as ``services.bundles`` writes them: each line after ``[NODE] ``, node 0's
facts with ``extra.group`` listing every node's TP ranks and snapshots.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodes.domain.diagnosis import diagnose
from nodes.domain.diagnosis.evidence import Log
from tests.cases import flags_of

READY = "[2026-12-01 10:05:00] The server is fired up and ready to roll!"
STORE_WAIT = (
    "torch.distributed.DistStoreError: Timed out after 601 seconds waiting for clients. "
    "{joined}/{world} clients joined."
)


def _facts(
    nodes: list[str],
    *,
    tp: int = 16,
    snapshots: dict[str, list[dict[str, Any]]] | None = None,
    extra: list[str] | None = None,
) -> dict[str, Any]:
    per = tp // len(nodes)
    snaps = snapshots or {}
    command = ["python3", "-m", "sglang.launch_server", "--model-path", "/models/kimi"]
    command += ["--tp-size", str(tp), "--nnodes", str(len(nodes)), "--node-rank", "0"]
    command += ["--dist-init-addr", "10.0.0.1:5000", *(extra or [])]
    return {
        "format": "rankwise-case/1",
        "engine": "sglang",
        "engine_version": "0.5.9",
        "node": {"name": nodes[0], "host_ram_bytes": None, "gpus": []},
        "nodes_in_launch": len(nodes),
        "command": command,
        "snapshots": snaps.get(nodes[0], []),
        "extra": {
            "group": [
                {
                    "name": name,
                    "node_rank": r,
                    "tp_ranks": list(range(r * per, (r + 1) * per)),
                    "snapshots": snaps.get(name, []),
                }
                for r, name in enumerate(nodes)
            ]
        },
    }


def _log(rows: list[tuple[str, str]]) -> str:
    return "".join(f"[{node}] {text}\n" if node else f"{text}\n" for node, text in rows)


def _run(rows: list[tuple[str, str]], facts: dict[str, Any]):
    return diagnose(_log(rows), facts, flags_of(facts))


def _begins(node: str, ranks: range, when: str = "10:00:00") -> list[tuple[str, str]]:
    return [(node, f"[2026-12-01 {when} TP{r}] Init torch distributed begin.") for r in ranks]


def _raised(node: str, rank: int, error: str, when: str = "10:10:01") -> list[tuple[str, str]]:
    return [
        (node, f"[2026-12-01 {when} TP{rank}] Scheduler hit an exception: Traceback (most "),
        (node, '  File "/sglang/srt/model_executor/model_runner.py", line 812, in init_torch'),
        (node, "    init_distributed_environment("),
        (node, error),
    ]


# --- the store ------------------------------------------------------------------------------


def test_a_node_whose_ranks_never_started_is_named_with_its_ranks():
    rows = _begins("node-a", range(8)) + _raised("node-a", 0, STORE_WAIT.format(joined=8, world=16))
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "nccl-init-hang"
    assert "the store on node-a (node 0) at 10.0.0.1:5000 waited 601 s" in found.summary
    assert "only 8 of the 16 ranks joined" in found.summary
    assert (
        "node-b (node rank 1, TP8–TP15) never joined: its ranks never began distributed init"
        in found.summary
    )
    assert "--dist-init-addr (10.0.0.1:5000)" in found.remedy
    assert "port 5000 is open" in found.remedy and "GLOO_SOCKET_IFNAME" in found.remedy
    assert found.evidence[0].text.startswith("[node-a] torch.distributed.DistStoreError")
    assert found.numbers["clients_joined"] == 8 and found.numbers["world_size"] == 16


def test_of_three_nodes_the_one_whose_ranks_never_began_is_the_one_named():
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + _raised("node-a", 0, STORE_WAIT.format(joined=16, world=24))
    )
    found = _run(rows, _facts(["node-a", "node-b", "node-c"], tp=24))

    assert "node-c (node rank 2, TP16–TP23) never joined" in found.summary
    assert "node-b" not in found.summary


def test_a_node_that_began_init_but_never_arrived_is_named_as_such():
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + _raised("node-a", 0, STORE_WAIT.format(joined=8, world=16))
    )
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert "node-b (node rank 1, TP8–TP15) never joined: its ranks began distributed init" in (
        found.summary
    )
    assert "refused connection" in found.summary


def test_the_node_that_cannot_reach_the_store_is_named_with_the_address_and_the_errno():
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + [
            (
                "node-b",
                "[rank8]:[W1201 10:00:31.1 socket.cpp:752] [c10d] The client socket has failed "
                "to connect to [::ffff:10.0.0.1]:5000 (errno: 113 - No route to host).",
            )
        ]
        + _raised(
            "node-b",
            8,
            "torch.distributed.DistNetworkError: The client socket has timed out after 600s "
            "while trying to connect to (10.0.0.1, 5000).",
        )
    )
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "nccl-init-hang"
    assert (
        "node-b (node rank 1, TP8–TP15) could not reach the distributed store at 10.0.0.1:5000 "
        "for 600 s (connect errno 113: No route to host)"
    ) in found.summary
    assert "nc -zv 10.0.0.1 5000 from node-b" in found.remedy
    assert "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME" in found.remedy
    assert found.numbers["connect_timeout_s"] == 600 and found.numbers["store_port"] == 5000


def test_node_0_s_log_alone_names_the_missing_node_by_its_rank():
    """An operator's paste of node 0's log, without the group: the command's --nnodes and
    --tp-size place the missing ranks."""
    log = "\n".join(
        [
            "[2026-12-01 10:00:00 TP0] Init torch distributed begin.",
            STORE_WAIT.format(joined=8, world=16),
        ]
    )
    found = diagnose(log, {}, {"tp_size": 16, "nnodes": 2, "dist_init_addr": "10.0.0.1:5000"})

    assert found.category == "nccl-init-hang"
    assert "node rank 1 (TP8–TP15) never joined" in found.summary
    assert "the store on node 0 at 10.0.0.1:5000" in found.summary


def test_on_one_node_the_store_says_how_many_ranks_never_joined():
    found = diagnose(STORE_WAIT.format(joined=1, world=4) + "\n", {}, {"tp_size": 4})

    assert found.category == "nccl-init-hang"
    assert "only 1 of the 4 ranks joined; 3 ranks never joined (TP 4)" in found.summary


def test_a_store_port_that_was_taken_stays_a_port_in_use():
    rows = _begins("node-b", range(8, 16)) + [
        (
            "node-a",
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 5000, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use",
        ),
        (
            "node-b",
            "torch.distributed.DistNetworkError: The client socket has timed out after 600s "
            "while trying to connect to (10.0.0.1, 5000).",
        ),
    ]
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "port-in-use"
    assert "line 9 is from node-a (node rank 0, TP0–TP7)" in found.summary


# --- a rank that died during init ------------------------------------------------------------


def test_a_rank_dying_in_nccl_s_bootstrap_names_its_node_and_the_peer_it_could_not_reach():
    snapshots = {
        "node-b": [
            {
                "phase": "before_launch",
                "network": {
                    "interfaces": [
                        {"name": "eth0", "ipv4": "10.1.0.5/24", "default_route": True},
                        {"name": "lo", "ipv4": "127.0.0.1/8", "default_route": False},
                    ]
                },
            }
        ]
    }
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + [
            (
                "node-b",
                "node-b:240:240 [4] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to "
                "10.0.0.1<43369> failed : Software caused connection abort",
            )
        ]
        + _raised("node-b", 12, "RuntimeError: NCCL error: unhandled system error")
    )
    found = _run(rows, _facts(["node-a", "node-b"], snapshots=snapshots))

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "TP12 on node-b (node rank 1, TP8–TP15) died during distributed init: RuntimeError: "
        "NCCL error: unhandled system error"
    )
    assert "could not connect to 10.0.0.1:43369 (Software caused connection abort)" in (
        found.summary
    )
    assert "node 0's --dist-init-addr host" in found.summary
    assert "node-b has no address on 10.0.0.1's network (eth0 10.1.0.5/24, lo 127.0.0.1/8)" in (
        found.summary
    )
    assert "`ip route get 10.0.0.1` on node-b" in found.remedy
    assert found.numbers["failing_rank"] == 12 and found.numbers["peer_port"] == 43369


def test_a_rank_that_raised_something_else_during_init_is_not_called_a_network_failure():
    rows = _begins("node-b", range(8, 16)) + _raised(
        "node-b", 9, "ValueError: invalid literal for int() with base 10: 'x'"
    )
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "unknown"
    assert (
        "the first rank to fail was TP9 on node-b (node rank 1, TP8–TP15): ValueError: invalid "
        "literal"
    ) in found.summary


# --- parted while serving --------------------------------------------------------------------

WATCHDOG = (
    "[rank{rank}]:[E1201 11:00:00.1 ProcessGroupNCCL.cpp:616] [Rank {rank}] Watchdog caught "
    "collective operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, NumelIn=1, "
    "NumelOut=1, Timeout(ms)=600000) ran for {ms} milliseconds before timing out."
)


def test_a_collective_that_timed_out_on_every_node_is_the_link_between_them():
    rows = [
        ("node-a", READY),
        ("node-a", WATCHDOG.format(rank=3, ms=600051)),
        ("node-b", WATCHDOG.format(rank=11, ms=600060)),
    ]
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "health-check-failure"
    assert "a NCCL ALLREDUCE across the nodes (SeqNum 9001) ran for 600051 ms" in found.summary
    assert (
        "node-a (node rank 0, TP0–TP7) and node-b (node rank 1, TP8–TP15) each waited"
        in found.summary
    )
    assert "the data between the nodes stopped" in found.summary
    assert "check the link between the nodes" in found.remedy
    assert [e.text[:8] for e in found.evidence] == ["[node-a]", "[node-a]", "[node-b]"]


def test_a_node_the_panel_could_not_reach_is_the_node_lost_mid_run():
    snapshots = {
        "node-b": [
            {"phase": "during", "notes": []},
            {
                "phase": "after_failure",
                "notes": ["panel: node-b did not answer over SSH (connection timed out)"],
            },
        ]
    }
    rows = [("node-a", READY), ("node-a", WATCHDOG.format(rank=3, ms=600051))]
    found = _run(rows, _facts(["node-a", "node-b"], snapshots=snapshots))

    assert found.category == "health-check-failure"
    assert "on node-a (node rank 0, TP0–TP7)" in found.summary
    assert (
        "node-b (node rank 1, TP8–TP15) (node-b did not answer over SSH (connection timed out)) "
        "reported nothing"
    ) in found.summary
    assert "the node was lost mid-run" in found.summary
    assert found.remedy.startswith("check node-b: whether it is up")
    assert found.evidence[-1].source == "snapshot"


def test_a_node_that_was_only_silent_is_not_called_lost():
    rows = [("node-a", READY), ("node-a", WATCHDOG.format(rank=3, ms=600051))]
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert "node-b (node rank 1, TP8–TP15) reported nothing" in found.summary
    assert "a hung rank or a node cut off mid-run" in found.summary
    assert "lost" not in found.summary


def test_a_rank_s_own_error_after_ready_is_that_error_with_its_node():
    rows = [
        ("node-a", READY),
        (
            "node-b",
            "[2026-12-01 11:00:00 TP12] torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB. GPU 4 has a total capacity of 139.81 GiB of which 1.10 GiB is "
            "free.",
        ),
        ("node-a", WATCHDOG.format(rank=3, ms=600051)),
    ]
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "mem-fraction-too-high"
    assert "line 2 is from node-b (node rank 1, TP8–TP15)" in found.summary


def test_a_kernel_oom_kill_on_another_node_is_evidence_with_that_node():
    snapshots = {
        "node-b": [
            {
                "phase": "after_failure",
                "kernel_log": ["Out of memory: Killed process 5121 (sglang::schedul)"],
                "notes": ["panel: sglang::scheduler_TP12 (PID 5121) died while serving"],
            }
        ]
    }
    found = _run([("node-a", READY)], _facts(["node-a", "node-b"], snapshots=snapshots))

    assert found.category == "health-check-failure"
    assert "sglang::scheduler_TP12 (PID 5121) died while serving" in found.summary
    assert "OOM killer" in found.summary
    assert "the snapshot facts are from node-b (node rank 1, TP8–TP15)" in found.summary
    assert any(
        e.text.startswith("[node-b] Out of memory: Killed process 5121") for e in found.evidence
    )


# --- the log's node tags ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "origin", "text"),
    [
        ("[node-a] [2026-12-01 10:00:00 TP0] x", "node-a", "[2026-12-01 10:00:00 TP0] x"),
        ("[node-a] ", "node-a", ""),
        ("[node-a]", "node-a", ""),
        ("[rank8]:[W1201 socket.cpp:752] y", "", "[rank8]:[W1201 socket.cpp:752] y"),
        ("[other] z", "", "[other] z"),
        ("[2026-12-01 10:00:00 TP0] w", "", "[2026-12-01 10:00:00 TP0] w"),
    ],
)
def test_only_the_group_s_node_names_are_taken_off_as_tags(line, origin, text):
    log = Log(line, ["node-a", "node-b"])

    assert (log.origin, log.lines) == ([origin], [text])


def test_tagged_lines_keep_the_rules_reading_sglang_s_prefix():
    """A hang the existing rule reads from SGLang's prefix (the seconds between two lines)
    reads the same on a tagged multi-node log, and says which node its lines came from."""
    rows = [
        ("node-a", "[2026-12-01 10:00:00 TP0] Init torch distributed begin."),
        ("node-b", "[2026-12-01 10:00:01 TP8] Init torch distributed begin."),
        ("node-a", "[2026-12-01 10:05:01] Rank 0 scheduler is dead. Please check if there are"),
        ("node-a", "Exit code: -9"),
    ]
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "nccl-init-hang"
    assert found.numbers["hang_seconds_until_kill"] == 300
    assert "line 2 is from node-b (node rank 1, TP8–TP15)" in found.summary
