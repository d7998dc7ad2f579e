"""The diagnosis of a launch over several nodes (issue 22): what an operator reads names the node
and the ranks — a node whose ranks never joined the store, a node that could not reach it, a
rank that died during init on one node, a node without the interface NCCL_SOCKET_IFNAME or
GLOO_SOCKET_IFNAME names, nodes on different NCCL versions, the nodes parting while serving —
and any other diagnosis of such a bundle says which node its line came from.

Bundles are built as ``services.bundles`` writes them: each line after ``[NODE] ``, node 0's
facts with ``extra.group`` listing every node's TP ranks and snapshots.
"""

from __future__ import annotations

from typing import Any

import pytest

from nodes.domain.diagnosis import diagnose
from nodes.domain.diagnosis.evidence import Log
from nodes.domain.diagnosis.node_setup import nccl_selects, nccl_version
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


# --- an interface a node does not have --------------------------------------------------------

GLOO_ERROR = (
    "RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84] "
    "ifa != nullptr. Unable to find address for: {name}"
)
INVALID_USAGE = "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
NO_INTERFACE = (
    "{node}:6120:6120 [{dev}] bootstrap.cc:229 NCCL WARN Bootstrap : no socket interface found"
)


def _interfaces(*pairs: tuple[str, str]) -> list[dict[str, Any]]:
    listed = [{"name": "lo", "ipv4": "127.0.0.1/8", "default_route": False}]
    listed += [{"name": n, "ipv4": a, "default_route": i == 0} for i, (n, a) in enumerate(pairs)]
    return [{"phase": "before_launch", "network": {"interfaces": listed}}]


BOND_NODES = {
    "node-a": _interfaces(("eno1", "192.168.10.11/24"), ("bond1", "10.0.1.11/24")),
    "node-b": _interfaces(("eno1", "192.168.10.12/24"), ("bond0", "10.0.1.12/24")),
}


def _with_env(facts: dict[str, Any], **env: str) -> dict[str, Any]:
    return {**facts, "env": env}


def test_a_gloo_interface_one_node_lacks_names_the_node_what_it_has_and_the_shared_one():
    rows = (
        _begins("node-b", range(8, 16))
        + _begins("node-a", range(8))
        + _raised("node-b", 8, GLOO_ERROR.format(name="bond1"))
        + _raised("node-b", 11, GLOO_ERROR.format(name="bond1"))
    )
    facts = _facts(["node-a", "node-b"], snapshots=BOND_NODES)
    found = _run(rows, _with_env(facts, GLOO_SOCKET_IFNAME="bond1", NCCL_SOCKET_IFNAME="bond1"))

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "GLOO_SOCKET_IFNAME=bond1 names an interface node-b (node rank 1, TP8–TP15) does not "
        "have: Gloo found no address for bond1 when the world group was made, and node-b's "
        "ranks died (TP8 and TP11 in the log)"
    )
    assert (
        "node-b has eno1 192.168.10.12/24 and bond0 10.0.1.12/24 — bond0 is on 10.0.1.0/24, "
        "where node-a has bond1"
    ) in found.summary
    assert "NCCL_SOCKET_IFNAME=bond1 names nothing there either" in found.summary
    assert "node-a's ranks were left waiting for node-b's" in found.summary
    assert found.remedy.startswith(
        "name an interface every node has on the network they share (10.0.1.0/24)"
    )
    assert "NCCL_SOCKET_IFNAME=bond1,bond0 selects it on every node" in found.remedy
    assert "GLOO_SOCKET_IFNAME=bond1 on node-a, GLOO_SOCKET_IFNAME=bond0 on node-b" in found.remedy
    assert "leave them unset and let Rankwise pin each node's own interface" in found.remedy
    assert found.evidence[0].text.startswith("[node-b] [2026-12-01 10:10:01 TP8] Scheduler hit")
    assert found.evidence[1].text.endswith("Unable to find address for: bond1")
    assert found.evidence[-1].source == "snapshot"
    assert found.evidence[-1].text == (
        "[node-b] interfaces: lo 127.0.0.1/8, eno1 192.168.10.12/24, bond0 10.0.1.12/24"
    )


def test_without_snapshots_the_gloo_failure_still_names_the_node_and_the_interface():
    rows = _begins("node-b", range(8, 16)) + _raised("node-b", 9, GLOO_ERROR.format(name="ib0"))
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "GLOO_SOCKET_IFNAME=ib0 names an interface node-b (node rank 1, TP8–TP15) does not have"
    )
    assert "GLOO_SOCKET_IFNAME takes exact names, so set it per node" in found.remedy
    assert "`ip -br addr` on node-b" in found.remedy


def test_an_address_given_for_an_interface_name_is_said_to_be_one():
    rows = _begins("node-b", range(8, 16)) + _raised(
        "node-b", 8, GLOO_ERROR.format(name="10.0.1.12")
    )
    found = _run(rows, _with_env(_facts(["node-a", "node-b"]), GLOO_SOCKET_IFNAME="10.0.1.12"))

    assert found.summary.startswith(
        "GLOO_SOCKET_IFNAME=10.0.1.12 (an address: the variable takes an interface name) names "
        "an interface node-b"
    )


def test_nccl_s_warning_names_the_variable_the_interface_and_what_the_node_has():
    snapshots = {
        "ws-01": _interfaces(("eth0", "192.168.0.21/24")),
        "ws-02": _interfaces(("eno1", "192.168.0.22/24")),
    }
    rows = (
        _begins("ws-01", range(2))
        + _begins("ws-02", range(2, 4))
        + [("ws-01", "[2026-12-01 10:00:02 TP0] sglang is using nccl==2.27.5")]
        + [("ws-02", NO_INTERFACE.format(node="ws-02", dev=0))]
        + _raised("ws-02", 2, INVALID_USAGE)
    )
    facts = _facts(["ws-01", "ws-02"], tp=4, snapshots=snapshots)
    found = _run(rows, _with_env(facts, NCCL_SOCKET_IFNAME="eth0", NCCL_DEBUG="WARN"))

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "NCCL_SOCKET_IFNAME=eth0 matches no interface of ws-02 (node rank 1, TP2–TP3): NCCL's "
        "bootstrap found no socket interface there and its ranks failed ncclCommInitRank with "
        "invalid usage (TP2 in the log)"
    )
    assert "ws-02 has eno1 192.168.0.22/24 — eno1 is on 192.168.0.0/24, where ws-01 has eth0" in (
        found.summary
    )
    assert "ws-01's ranks were left waiting for ws-02's" in found.summary
    assert "NCCL_SOCKET_IFNAME=eth0,eno1 selects it on every node" in found.remedy
    assert "GLOO_SOCKET_IFNAME" not in found.remedy.split(" — ")[0]
    assert found.evidence[0].text.startswith("[ws-02] ws-02:6120:6120 [0] bootstrap.cc:229")


def test_without_nccl_s_warning_the_node_s_snapshot_shows_the_interface_it_lacks():
    """NCCL_DEBUG unset: only SGLang's "invalid usage"; the launch's NCCL_SOCKET_IFNAME against
    the interfaces node-b's snapshot lists says which."""
    snapshots = {
        "node-a": _interfaces(("eth0", "10.0.0.1/24")),
        "node-b": _interfaces(("ens5", "10.0.0.2/24")),
    }
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + _raised("node-b", 12, INVALID_USAGE)
    )
    facts = _facts(["node-a", "node-b"], snapshots=snapshots)
    found = _run(rows, _with_env(facts, NCCL_SOCKET_IFNAME="eth"))

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "NCCL_SOCKET_IFNAME=eth matches no interface of node-b (node rank 1, TP8–TP15): its "
        "ranks failed NCCL's communicator init with invalid usage (TP12 in the log)"
    )
    assert "what NCCL returns when NCCL_SOCKET_IFNAME selects no interface" in found.summary
    assert "node-b has ens5 10.0.0.2/24 — ens5 is on 10.0.0.0/24, where node-a has eth0" in (
        found.summary
    )
    assert "NCCL_SOCKET_IFNAME=eth0,ens5" in found.remedy


def test_a_node_that_has_the_interface_is_not_said_to_lack_it():
    """NCCL_SOCKET_IFNAME is a list of prefixes: ``eth`` selects eth1; node-b's failure is
    something else, read by the rank-died rule."""
    snapshots = {
        "node-a": _interfaces(("eth0", "10.0.0.1/24")),
        "node-b": _interfaces(("eth1", "10.0.0.2/24")),
    }
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + _raised("node-b", 12, "RuntimeError: NCCL error: unhandled system error")
    )
    facts = _facts(["node-a", "node-b"], snapshots=snapshots)
    found = _run(rows, _with_env(facts, NCCL_SOCKET_IFNAME="eth"))

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith("TP12 on node-b (node rank 1, TP8–TP15) died during")
    assert "matches no interface" not in found.summary


def test_on_one_node_a_wrong_gloo_interface_is_unset():
    facts = {
        "node": {"name": "gpu01"},
        "env": {"GLOO_SOCKET_IFNAME": "eth0"},
        "snapshots": _interfaces(("ens3", "192.168.10.25/24")),
    }
    log = "\n".join(
        ["[2026-12-01 10:00:00 TP0] Init torch distributed begin."]
        + [text for _, text in _raised("", 0, GLOO_ERROR.format(name="eth0"))]
    )
    found = diagnose(log, facts, {"tp_size": 2})

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "GLOO_SOCKET_IFNAME=eth0 names an interface gpu01 does not have"
    )
    assert "gpu01 has ens3 192.168.10.25/24" in found.summary
    assert found.remedy.startswith(
        "unset GLOO_SOCKET_IFNAME: a launch on one node needs no interface between nodes; or "
        "name one the node has (ens3)"
    )


@pytest.mark.parametrize(
    ("value", "names", "selected"),
    [
        ("eth0", ["lo", "eth0"], ["eth0"]),
        ("eth", ["eth1", "eno1"], ["eth1"]),
        ("eno1,eth0", ["eth0"], ["eth0"]),
        ("^lo,docker", ["lo", "docker0", "ens5"], ["ens5"]),
        ("=eth", ["eth0"], []),
        ("=eth0", ["eth0", "eth01"], ["eth0"]),
        ("bond1", ["bond0"], []),
    ],
)
def test_nccl_socket_ifname_selects_as_nccl_does(value, names, selected):
    assert nccl_selects(value, names) == selected


# --- NCCL versions that differ between the nodes ----------------------------------------------

MISMATCH = (
    "{node}:4100:4100 [{dev}] init.cc:1087 NCCL WARN Mismatched NCCL version detected : rank "
    "{peer} version {peer_code} rank {rank} version {code}"
)


def test_nccl_s_version_warnings_name_each_node_s_nccl():
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + [("node-a", "[2026-12-01 10:00:02 TP0] sglang is using nccl==2.27.5")]
        + [
            (
                "node-a",
                MISMATCH.format(node="node-a", dev=0, peer=8, peer_code=22703, rank=0, code=22705),
            ),
            (
                "node-b",
                MISMATCH.format(node="node-b", dev=1, peer=0, peer_code=22705, rank=9, code=22703),
            ),
        ]
        + _raised("node-a", 0, INVALID_USAGE)
        + _raised("node-b", 9, INVALID_USAGE)
    )
    facts = _facts(["node-a", "node-b"])
    facts["extra"]["checks"] = [
        {"name": "sglang", "passed": True, "detail": "every node runs SGLang 0.5.9", "override": ""}
    ]
    found = _run(rows, facts)

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "the nodes run different NCCL versions: node-a (node rank 0, TP0–TP7) runs NCCL 2.27.5 "
        "(version code 22705), node-b (node rank 1, TP8–TP15) 2.27.3 (22703); NCCL compares "
        "every rank's version when a communicator is made"
    )
    assert "node 0's SGLang says it uses NCCL 2.27.5" in found.summary
    assert (
        "the pre-flight found the same SGLang on every node (every node runs SGLang 0.5.9), so "
        "the NCCL library itself differs"
    ) in found.summary
    assert found.remedy.startswith(
        "run the same NCCL on every node (node-b has 2.27.3, node-a (node 0) 2.27.5)"
    )
    assert "torch.cuda.nccl.version()" in found.remedy
    assert [e.text[:8] for e in found.evidence[:2]] == ["[node-a]", "[node-b]"]
    assert found.numbers["nccl_version_code_node1"] == 22703


def test_without_nccl_s_warnings_invalid_usage_on_every_node_is_the_version_check():
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + _raised("node-a", 0, INVALID_USAGE)
        + _raised("node-b", 9, INVALID_USAGE)
    )
    facts = _facts(["node-a", "node-b"])
    facts["extra"]["checks"] = [
        {
            "name": "sglang",
            "passed": False,
            "detail": "node-b runs SGLang 0.5.2 but node-a (node 0) runs 0.5.9: every node must "
            "run the same version (node-a 0.5.9, node-b 0.5.2)",
            "override": "same minor release",
        }
    ]
    found = _run(rows, facts)

    assert found.category == "nccl-init-hang"
    assert found.summary.startswith(
        "ranks of node-a (node rank 0, TP0–TP7) and node-b (node rank 1, TP8–TP15) all failed "
        "NCCL's communicator init with invalid usage (TP0, TP9"
    )
    assert "most likely NCCL's version check — the nodes run different NCCL" in found.summary
    assert (
        "the pre-flight's version check was overridden: node-b runs SGLang 0.5.2 but node-a "
        "(node 0) runs 0.5.9"
    ) in found.summary
    assert found.remedy.startswith("run the same NCCL on every node: the same SGLang and torch")
    assert found.remedy.endswith("(with NCCL_DEBUG=WARN, which prints NCCL's own reason)")


def test_invalid_usage_on_one_node_only_is_not_called_a_version_mismatch():
    rows = (
        _begins("node-a", range(8))
        + _begins("node-b", range(8, 16))
        + _raised("node-b", 9, INVALID_USAGE)
    )
    found = _run(rows, _facts(["node-a", "node-b"]))

    assert found.category == "nccl-init-hang"
    assert "NCCL versions" not in found.summary
    assert found.summary.startswith("TP9 on node-b (node rank 1, TP8–TP15) died during")


@pytest.mark.parametrize(
    ("code", "release"), [(22705, "2.27.5"), (23007, "2.30.7"), (21003, "2.10.3"), (2803, "2.8.3")]
)
def test_nccl_version_codes_read_as_releases(code, release):
    assert nccl_version(code) == release
