"""One server over several nodes (issue 22): ranks per node, the ports each node needs, where the
nodes meet, and each node's flags from one revision."""

from __future__ import annotations

import pytest

from nodes.domain import node_group as group
from nodes.domain.launch_plan import PlanError
from nodes.domain.sglang_flags import ParsedCommand


def flags(**values) -> ParsedCommand:
    return ParsedCommand(values=values, given=set(values))


def node(name: str, *interfaces: tuple[str, str]) -> group.GroupNode:
    return group.GroupNode(name, tuple(group.Interface(n, a) for n, a in interfaces))


LO = ("lo", "127.0.0.1/8")


def test_each_node_runs_its_share_of_the_ranks_in_order():
    kimi = flags(tp_size=16, nnodes=2)
    assert group.ranks_per_node(kimi, 2) == 8
    assert list(group.tp_ranks(kimi, 2, 0)) == list(range(8))
    assert list(group.tp_ranks(kimi, 2, 1)) == list(range(8, 16))
    assert group.ranks_per_node(flags(tp_size=8, pp_size=2, nnodes=4), 4) == 4


@pytest.mark.parametrize(
    ("values", "nodes", "words"),
    [
        ({"tp_size": 16, "nnodes": 2}, 3, "--nnodes 2 but the launch names 3"),
        ({"tp_size": 16}, 2, "--nnodes 1 but the launch names 2"),
        ({"tp_size": 8, "nnodes": 1}, 1, "at least two nodes"),
        ({"tp_size": 6, "nnodes": 4}, 4, "6 is not divisible by --nnodes 4"),
        ({"tp_size": 8, "dp_size": 2, "nnodes": 2}, 2, "needs --enable-dp-attention"),
    ],
)
def test_a_command_that_does_not_split_over_the_group_is_refused_with_why(values, nodes, words):
    with pytest.raises(PlanError, match=words):
        group.ranks_per_node(flags(**values), nodes)


def test_every_node_needs_the_http_port_and_node_0_the_store_and_its_derived_ports():
    plain = flags(tp_size=16, nnodes=2, port=30000)
    assert group.node_ports(plain, 0) == [5000, 30000]
    assert group.node_ports(plain, 1) == [30000]
    given = flags(tp_size=16, nnodes=2, dist_init_addr="10.0.0.1:6123", nccl_port=31000)
    assert group.node_ports(given, 0) == [6123, 30000, 31000]
    dp = flags(tp_size=16, nnodes=2, dp_size=2, enable_dp_attention=True)
    # ZMQ over TCP from the store's port: + 1 … + 4 + dp (sglang.md §1b).
    assert group.node_ports(dp, 0) == [5000, 5001, 5002, 5003, 5004, 5005, 5006, 30000]


def test_the_nodes_meet_on_the_first_network_node_0_shares_with_every_node():
    nodes = [
        node("a", LO, ("eth0", "192.168.1.10/24"), ("ib0", "10.10.0.1/16")),
        node("b", LO, ("eth0", "192.168.7.20/24"), ("ib0", "10.10.3.4/16")),
        node("c", LO, ("ens5", "10.10.9.9/16")),
    ]
    met = group.meeting(flags(tp_size=24, nnodes=3), nodes, {})
    assert (met.host, met.port, met.address) == ("10.10.0.1", 5000, "10.10.0.1:5000")
    assert met.interfaces == {"a": "ib0", "b": "ib0", "c": "ens5"}
    assert met.warnings == []


def test_nodes_that_share_no_network_are_refused_with_every_nodes_addresses():
    nodes = [node("a", LO, ("eth0", "192.168.1.10/24")), node("b", LO, ("eth0", "10.0.0.2/24"))]
    with pytest.raises(PlanError, match=r"share no network.*a: lo 127\.0\.0\.1/8, eth0"):
        group.meeting(flags(tp_size=16, nnodes=2), nodes, {})


def test_an_interface_pinned_by_the_environment_is_used_and_warned_about():
    nodes = [
        node("a", LO, ("eth0", "192.168.1.10/24"), ("ib0", "10.10.0.1/24")),
        node("b", LO, ("eth0", "192.168.1.11/24"), ("ib0", "10.20.0.2/24")),
    ]
    met = group.meeting(flags(tp_size=16, nnodes=2), nodes, {"NCCL_SOCKET_IFNAME": "ib0"})
    assert met.host == "10.10.0.1" and met.interfaces == {"a": "ib0", "b": "ib0"}
    assert met.warnings == [
        "b's ib0 (10.20.0.2/24) is not in a's subnet 10.10.0.0/24: its ranks reach node 0 only "
        "if something routes between the two"
    ]
    loop = group.meeting(flags(tp_size=16, nnodes=2), nodes, {"GLOO_SOCKET_IFNAME": "lo"})
    assert loop.warnings[0] == "lo is a loopback interface: other nodes cannot reach a on it"
    no_ib = [nodes[0], node("b", LO, ("eth0", "192.168.1.11/24"))]
    with pytest.raises(
        PlanError,
        match="b has no interface that NCCL_SOCKET_IFNAME=ib0 names .*its interfaces: lo, eth0$",
    ):
        group.meeting(flags(tp_size=16, nnodes=2), no_ib, {"NCCL_SOCKET_IFNAME": "ib0"})


def test_each_node_runs_the_revisions_flags_with_its_rank_and_the_meeting_point():
    met = group.Meeting("fd00::1", 5000, {})
    args = ["--model-path", "/m", "--tp", "16", "--nnodes", "2", "--node-rank", "0"]
    assert group.node_args(args, 1, met) == [
        *args,
        "--node-rank",
        "1",
        "--dist-init-addr",
        "[fd00::1]:5000",
    ]


def test_every_node_must_run_node_0s_sglang_and_the_check_names_the_one_that_does_not():
    same = group.check_versions([("a", "0.5.9"), ("b", "0.5.9")])
    assert same.passed and same.detail == "every node runs SGLang 0.5.9"
    other = group.check_versions([("a", "0.5.9"), ("b", "0.5.9"), ("c", "0.5.23")])
    assert not other.passed and other.node == "c"
    assert other.detail.startswith("c runs SGLang 0.5.23 but a (node 0) runs 0.5.9")
    missing = group.check_versions([("a", "0.5.9"), ("b", None)])
    assert not missing.passed and "none found" in missing.detail


def test_a_node_whose_config_differs_is_named_and_an_unread_one_is_left_to_its_own_check():
    assert group.check_same_model("/m", [("a", "h1"), ("b", "h1")]).passed
    assert group.check_same_model("/m", [("a", "h1"), ("b", None)]).passed
    differs = group.check_same_model("/m", [("a", "h1"), ("b", "h2")])
    assert not differs.passed and differs.node == "b" and "/m/config.json on b" in differs.detail


def test_the_network_check_says_where_the_nodes_meet_and_warns_of_loopback():
    nodes = [node("a", LO, ("eth1", "10.0.0.1/24")), node("b", LO, ("eth1", "10.0.0.2/24"))]
    check, met = group.check_network(flags(tp_size=16, nnodes=2), nodes, {})
    assert check.passed and met is not None and met.address == "10.0.0.1:5000"
    assert "a eth1, b eth1" in check.detail
    pinned, _ = group.check_network(flags(), nodes, {"NCCL_SOCKET_IFNAME": "lo"})
    assert pinned.passed and "warning: lo is a loopback interface" in pinned.detail
    apart = [node("a", ("eth1", "10.0.0.1/24")), node("b", ("eth1", "10.9.0.2/24"))]
    refused, none = group.check_network(flags(), apart, {})
    assert not refused.passed and none is None and "share no network" in refused.detail


def test_a_node_that_cannot_reach_the_store_is_named_with_the_address():
    assert group.check_reach("b", "10.0.0.1:5000", True, None).passed
    cut = group.check_reach("b", "10.0.0.1:5000", False, "timed out")
    assert not cut.passed and cut.node == "b"
    assert cut.detail.startswith("b cannot reach 10.0.0.1:5000 (node 0's --dist-init-addr): timed")


def test_the_revisions_own_dist_init_addr_is_kept_when_it_is_node_0s():
    nodes = [node("a", LO, ("eth1", "10.0.0.1/24")), node("b", LO, ("eth1", "10.0.0.2/24"))]
    own = flags(tp_size=16, nnodes=2, dist_init_addr="10.0.0.1:6000")
    check, met = group.check_network(own, nodes, {})
    assert check.passed and met is not None and met.address == "10.0.0.1:6000"
    foreign = flags(tp_size=16, nnodes=2, dist_init_addr="10.0.0.9:6000")
    refused, _ = group.check_network(foreign, nodes, {})
    assert not refused.passed and "is not an address of a (node 0)" in refused.detail
    named = flags(tp_size=16, nnodes=2, dist_init_addr="head-node:6000")
    warned, met = group.check_network(named, nodes, {})
    assert warned.passed and "every node resolves it itself" in warned.detail
    assert met is not None and met.address == "head-node:6000"


@pytest.mark.parametrize(
    ("spec", "exact", "names"),
    [
        ("eth", False, ["eth0", "eth1"]),  # NCCL: a prefix
        ("=eth1", False, ["eth1"]),  # exact after "="
        ("^lo,docker", False, ["eth0", "eth1", "ib0"]),  # excluded after "^"
        ("ib0,eth1", False, ["eth1", "ib0"]),
        ("eth1", True, ["eth1"]),  # Gloo: exact names
    ],
)
def test_interface_names_are_read_as_nccl_and_gloo_read_them(spec, exact, names):
    every = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert [n for n in every if group.interface_matches(spec, n, exact=exact)] == names


def test_both_variables_are_checked_and_nccls_prefix_finds_the_interface():
    nodes = [node("a", LO, ("eth1", "10.0.0.1/24")), node("b", LO, ("eth1", "10.0.0.2/24"))]
    met = group.meeting(flags(), nodes, {"NCCL_SOCKET_IFNAME": "eth"})
    assert met.host == "10.0.0.1" and met.interfaces == {"a": "eth1", "b": "eth1"}
    env = {"NCCL_SOCKET_IFNAME": "eth1", "GLOO_SOCKET_IFNAME": "bogus0"}
    with pytest.raises(PlanError, match="a has no interface that GLOO_SOCKET_IFNAME=bogus0"):
        group.meeting(flags(), nodes, env)
    forced = group.fallback_meeting(flags(), nodes)
    assert forced is not None and forced.address == "10.0.0.1:5000"
