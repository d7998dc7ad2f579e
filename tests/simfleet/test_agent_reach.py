"""The node agent's ``listen`` and ``reach`` on two simulated nodes (issue 22, pre-flight: the
dist-init port on node 0 reachable from every other node, checked from those nodes): node 0
listens, node 1 connects to node 0's address on the fleet's fabric, over the panel's own SSH
(``nodes.ssh``) and client (``nodes.remote.client``)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodes import ssh
from nodes.remote import client
from tests.fleet import bring_up, simfleet, wait_until

# What a connect from a node whose fabric is down meets: no answer to ARP (no route to host)
# or a silent wire (timed out), depending on the kernel's neighbour state.
CUT_OFF = ("timed out", "No route to host", "Network is unreachable")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    state = str(tmp_path_factory.mktemp("reach"))
    spec = {"nodes": [{"name": n, "gpus": 2, "gpu_memory": "80GiB", "speed": 8} for n in "ab"]}
    try:
        nodes = bring_up(state, spec)
        yield nodes["a"], nodes["b"], state
    finally:
        simfleet("down", "--state", state, check=False)


def _connect(node) -> ssh.Connection:
    """An SSH connection the panel's way, pinned to the host key the fleet announced."""
    key = ssh.fetch_host_key(node.host, node.port)
    assert key.fingerprint == node.host_key_fingerprint
    target = ssh.Target(node.host, node.port, node.user, Path(node.key_path).read_text(), None, key)
    return ssh.connect(target)


@pytest.fixture(scope="module")
def conns(pair):
    a, b, _ = pair
    first, second = _connect(a), _connect(b)
    try:
        yield first, second
    finally:
        first.close()
        second.close()


def _listening(conn, port: int) -> bool:
    return port in client.preflight(conn, "-", [port]).listening


def test_node_1_reaches_the_port_node_0_listens_on_over_the_fabric(pair, conns):
    a, _, _ = pair
    zero, one = conns
    began = time.monotonic()
    assert client.listen(zero, 5100, 60) == client.Listening(listening=True, port=5100, error=None)
    # The SSH command returned at once; the listener lives on, detached from it.
    assert time.monotonic() - began < 10
    assert _listening(zero, 5100)
    reached = client.reach(one, a.fabric["address"], 5100, 5)
    assert reached.reached and reached.error is None
    assert 0 <= reached.elapsed_s < 5
    # Again: the listener accepts (and closes) as many connections as come.
    assert client.reach(one, a.fabric["address"], 5100, 5).reached
    # On node 0 itself too, over IPv4 and, where the node has it, IPv6.
    assert client.reach(zero, "127.0.0.1", 5100, 5).reached
    if a.run("grep -q '^0\\{31\\}1 ' /proc/net/if_inet6")[0] == 0:
        assert client.reach(zero, "::1", 5100, 5).reached
        assert client.reach(zero, "[::1]", 5100, 5).reached


def test_the_listener_goes_away_after_its_seconds(pair, conns):
    a, _, _ = pair
    zero, one = conns
    assert client.listen(zero, 5101, 1).listening
    assert wait_until(lambda: not _listening(zero, 5101), 15)
    gone = client.reach(one, a.fabric["address"], 5101, 5)
    assert not gone.reached and gone.error == "[Errno 111] Connection refused"


def test_node_1_cut_off_from_the_fabric_does_not_reach_node_0_within_the_timeout(pair, conns):
    a, b, state = pair
    zero, one = conns
    assert client.listen(zero, 5102, 120).listening
    simfleet("link", "b", "down", "--fabric", "--state", state)
    try:
        began = time.monotonic()
        cut = client.reach(one, a.fabric["address"], 5102, 3)
        assert time.monotonic() - began < 3 + 10  # the answer came back over SSH, in time
        assert not cut.reached
        assert cut.error is not None and any(word in cut.error for word in CUT_OFF), cut
        assert cut.elapsed_s <= 3.5
        # Node 0's listener is there all along: only node 1's link is gone.
        assert client.reach(zero, a.fabric["address"], 5102, 3).reached
    finally:
        simfleet("link", "b", "up", "--fabric", "--state", state)
    # With the link back, node 1 reaches node 0 again (once its neighbour entry is relearnt).
    assert wait_until(lambda: client.reach(one, a.fabric["address"], 5102, 3).reached, 30)
    assert "state UP" in b.ok("ip link show eth1")


def test_a_taken_port_on_node_0_is_answered_listening_false_with_the_error(conns):
    zero, _ = conns
    assert client.listen(zero, 5103, 30).listening
    taken = client.listen(zero, 5103, 30)
    assert taken == client.Listening(listening=False, port=5103, error="Address already in use")
    # A port some other program holds: the node's own sshd.
    sshd = client.listen(zero, 22, 1)
    assert not sshd.listening and sshd.error == "Address already in use"


def test_a_port_nobody_listens_on_is_refused(pair, conns):
    a, _, _ = pair
    zero, one = conns
    assert not _listening(zero, 5104)
    refused = client.reach(one, a.fabric["address"], 5104, 5)
    assert refused == client.Reached(
        reached=False, error="[Errno 111] Connection refused", elapsed_s=refused.elapsed_s
    )
    assert refused.elapsed_s < 5


def test_bad_arguments_are_refused_with_the_reason(pair, conns):
    a, _, _ = pair
    zero, one = conns
    for call, words in (
        (lambda: client.listen(zero, 70000, 5), "port 70000 is outside 1..65535"),
        (lambda: client.listen(zero, 0, 5), "port 0 is outside 1..65535"),
        (lambda: client.listen(zero, 5105, float("nan")), "SECONDS must be a number"),
        (lambda: client.reach(one, a.fabric["address"], -1, 5), "port -1 is outside"),
        (lambda: client.reach(one, a.fabric["address"], 5105, float("nan")), "TIMEOUT must be"),
    ):
        with pytest.raises(ssh.RemoteError) as refused:
            call()
        assert refused.value.kind == "command_failed" and not refused.value.retryable
        assert words in str(refused.value), str(refused.value)
    assert not _listening(zero, 5105)
    # A name the node cannot resolve is an answer, not a failure.
    unknown = client.reach(one, "no-such-node.invalid", 5105, 2)
    assert not unknown.reached and unknown.error
