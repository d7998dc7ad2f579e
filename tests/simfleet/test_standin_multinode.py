"""The stand-in across two simulated nodes (issue 22, item 5): ranks on both nodes meet in torch's
store at ``--dist-init-addr`` over the nodes' own network, node 0 serves and node 1 answers a
dummy /health; with node 1 cut off, with an interface name node 1 lacks, with flags that give the
nodes different worlds and with SGLang releases whose NCCL differ, they fail the way torch, Gloo
and NCCL do (simfleet/multinode-sources.md).
"""

from __future__ import annotations

import pytest

from tests.fleet import bring_up, simfleet, wait_until
from tests.simfleet.test_sglang_standin import health, log_of, start

FLAGS = "--model-path /srv/models/qwen2.5-7b --tp 4 --nnodes 2 --dist-init-addr {addr}"
# One rank a node: a failing rank cannot take down a sibling before that one reaches the store.
ONE_EACH = "--model-path /srv/models/qwen2.5-7b --tp 2 --nnodes 2 --dist-timeout 20"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("pair"))
    spec = {"nodes": [{"name": n, "gpus": 2, "gpu_memory": "80GiB", "speed": 8} for n in "ab"]}
    # "c" runs another SGLang release, with another torch and so another NCCL.
    spec["nodes"].append({**spec["nodes"][0], "name": "c", "sglang_version": "0.5.23"})
    try:
        nodes = bring_up(state, spec)
        yield nodes["a"], nodes["b"], state, nodes["c"]
    finally:
        simfleet("down", "--state", state, check=False)


def _ranks(node) -> list[str]:
    return sorted(node.ok("ps -eo args= | grep '^sglang::scheduler' || true").split())


def _nothing_left(node) -> bool:
    return "sglang" not in node.ok("ps -eo args=")


def _stop(node) -> None:
    """SIGTERM to the server's main process, as a stop does."""
    node.ok("pkill -TERM -f '^(sglang::http_server|python3 -m sglang.launch_server)'")


def _keeps_waiting(node, ranks: list[str], seconds: float) -> bool:
    """Its ranks stay up, unready and silent for ``seconds`` (several scaled --dist-timeout)."""
    return not wait_until(
        lambda: _ranks(node) != ranks or "Error" in log_of(node) or health(node) != "000",
        seconds,
    )


def test_two_nodes_meet_at_the_store_and_node_0_serves(pair):
    a, b, _, _ = pair
    a.reboot(), b.reboot()
    flags = FLAGS.format(addr=f"{a.fabric['address']}:5000")
    start(b, flags + " --node-rank 1")
    start(a, flags + " --node-rank 0")
    assert wait_until(lambda: health(a) == "200", 60), log_of(a)
    assert wait_until(lambda: health(b) == "200", 10), log_of(b)
    assert "The server is fired up and ready to roll!" in log_of(a)
    node_1 = log_of(b)
    assert "Dummy health check server started in background thread at 127.0.0.1:30000" in node_1
    assert "fired up" not in node_1 and "[" in node_1
    # Each node runs its share of the TP ranks, named by their global rank.
    assert _ranks(a) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    assert _ranks(b) == ["sglang::scheduler_TP2", "sglang::scheduler_TP3"]
    assert " TP3] Load weight end." in node_1 and " TP1] Load weight end." in log_of(a)
    # The dummy /health of node 1 serves nothing else.
    assert b.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/generate")[1] == (
        "404"
    )


def test_a_node_cut_off_from_the_store_fails_both_nodes_with_torchs_words(pair):
    a, b, state, _ = pair
    a.reboot(), b.reboot()
    simfleet("link", "b", "down", "--fabric", "--state", state)
    try:
        flags = FLAGS.format(addr=f"{a.fabric['address']}:5000") + " --dist-timeout 20"
        start(a, flags + " --node-rank 0")
        start(b, flags + " --node-rank 1")
        said = "DistStoreError: Timed out after 21 seconds waiting for clients. 2/4 clients joined."
        assert wait_until(lambda: said in log_of(a), 30), log_of(a)
        lost = (
            "torch.distributed.DistNetworkError: The client socket has timed out after 20s while "
            f"trying to connect to ({a.fabric['address']}, 5000)."
        )
        assert wait_until(lambda: lost in log_of(b), 30), log_of(b)
        # Neither node is left with a server or a rank.
        assert wait_until(lambda: not _ranks(a) and not _ranks(b), 20)
        assert health(a) == "000" and health(b) == "000"
    finally:
        simfleet("link", "b", "up", "--fabric", "--state", state)


def test_a_gloo_interface_node_1_lacks_fails_its_rank_and_leaves_node_0_in_gloos_wait(pair):
    a, b, _, _ = pair
    a.reboot(), b.reboot()
    flags = f"{ONE_EACH} --dist-init-addr {a.fabric['address']}:5000"
    start(a, flags + " --node-rank 0", env="GLOO_SOCKET_IFNAME=eth1")  # one node 0 has
    start(b, flags + " --node-rank 1", env="GLOO_SOCKET_IFNAME=bond0")
    said = (
        "RuntimeError: [enforce fail at /pytorch/third_party/gloo/gloo/transport/tcp/device.cc:84]"
        " ifa != nullptr. Unable to find address for: bond0"
    )
    # Node 1's rank fails after the store, creating the world's Gloo group; node 1 exits.
    assert wait_until(lambda: said in log_of(b), 30), log_of(b)
    assert "Received sigquit from a child process." in log_of(b)
    assert wait_until(lambda: _nothing_left(b), 20), b.ok("ps -eo args=")
    # Node 0's rank saw both join the store and waits in Gloo's full mesh for node 1's address:
    # SGLang gives that wait 2 hours, far past --dist-timeout.
    assert _keeps_waiting(a, ["sglang::scheduler_TP0"], 8), log_of(a)
    assert "Init torch distributed ends" not in log_of(a)
    _stop(a)
    assert wait_until(lambda: _nothing_left(a), 30), a.ok("ps -eo args=")


def test_an_nccl_interface_node_1_lacks_fails_its_rank_and_node_0_hangs_in_nccl_init(pair):
    a, b, _, _ = pair
    a.reboot(), b.reboot()
    flags = f"{ONE_EACH} --dist-init-addr {a.fabric['address']}:5000"
    start(a, flags + " --node-rank 0", env="NCCL_SOCKET_IFNAME=eth NCCL_DEBUG=WARN")  # a prefix
    start(b, flags + " --node-rank 1", env="NCCL_SOCKET_IFNAME=ib0 NCCL_DEBUG=WARN")
    said = "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
    assert wait_until(lambda: said in log_of(b), 30), log_of(b)
    assert " bootstrap.cc:229 NCCL WARN Bootstrap : no socket interface found\n" in log_of(b)
    assert wait_until(lambda: _nothing_left(b), 20), b.ok("ps -eo args=")
    # Node 0's rank, NCCL's bootstrap root, waits for node 1's to check in without a timeout: a
    # hang, with nothing said.
    assert _keeps_waiting(a, ["sglang::scheduler_TP0"], 8), log_of(a)
    assert "NCCL WARN" not in log_of(a)
    _stop(a)
    assert wait_until(lambda: _nothing_left(a), 30), a.ok("ps -eo args=")


@pytest.mark.parametrize("node_1", ["--tp 2 --nnodes 2", "--tp 4 --nnodes 4"])
def test_node_1_with_another_world_times_out_node_0s_store_and_loses_it(pair, node_1):
    a, b, _, _ = pair
    a.reboot(), b.reboot()
    addr = f"--dist-init-addr {a.fabric['address']}:5000 --dist-timeout 20"
    start(a, f"--model-path /srv/models/qwen2.5-7b --tp 4 --nnodes 2 {addr} --node-rank 0")
    start(b, f"--model-path /srv/models/qwen2.5-7b {node_1} {addr} --node-rank 1")
    # Node 1 runs one rank, TP1 of its world: the store counts 3 joins of node 0's 4.
    assert wait_until(lambda: _ranks(b) == ["sglang::scheduler_TP1"], 20), log_of(b)
    said = "DistStoreError: Timed out after 21 seconds waiting for clients. 3/4 clients joined."
    assert wait_until(lambda: said in log_of(a), 30), log_of(a)
    # The store died with node 0; node 1's rank, waiting in it for rank 0, loses it.
    lost = (
        "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely "
        "closed. Did the remote server shutdown or crash?"
    )
    assert wait_until(lambda: lost in log_of(b), 20), log_of(b)
    assert "[W TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=" in log_of(b)
    assert wait_until(lambda: _nothing_left(a) and _nothing_left(b), 20)


def test_sglang_releases_with_different_nccl_fail_every_rank_at_nccl_init(pair):
    a, _, _, c = pair
    a.reboot(), c.reboot()
    flags = FLAGS.format(addr=f"{a.fabric['address']}:5000") + " --dist-timeout 20"
    start(a, flags + " --node-rank 0")  # 0.5.9: torch 2.9.1, NCCL 2.27.5
    start(c, flags + " --node-rank 1")  # 0.5.23: torch 2.14.1, NCCL 2.30.7
    said = "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"
    # Nothing compares versions before NCCL's own check; it fails every rank of both nodes.
    assert wait_until(lambda: said in log_of(a) and said in log_of(c), 30), log_of(a) + log_of(c)
    assert wait_until(lambda: _nothing_left(a) and _nothing_left(c), 20)
    assert "fired up" not in log_of(a)
