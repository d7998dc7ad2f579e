"""The stand-in across two simulated nodes (issue 22, item 5): ranks on both nodes meet in torch's
store at ``--dist-init-addr`` over the nodes' own network, node 0 serves and node 1 answers a
dummy /health; with node 1 cut off, both fail the way torch does (simfleet/multinode-sources.md).
"""

from __future__ import annotations

import pytest

from tests.fleet import bring_up, simfleet, wait_until
from tests.simfleet.test_sglang_standin import health, log_of, start

FLAGS = "--model-path /srv/models/qwen2.5-7b --tp 4 --nnodes 2 --dist-init-addr {addr}"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("pair"))
    spec = {"nodes": [{"name": n, "gpus": 2, "gpu_memory": "80GiB", "speed": 8} for n in "ab"]}
    try:
        nodes = bring_up(state, spec)
        yield nodes["a"], nodes["b"], state
    finally:
        simfleet("down", "--state", state, check=False)


def _ranks(node) -> list[str]:
    return sorted(node.ok("ps -eo args= | grep '^sglang::scheduler' || true").split())


def test_two_nodes_meet_at_the_store_and_node_0_serves(pair):
    a, b, _ = pair
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
    a, b, state = pair
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
