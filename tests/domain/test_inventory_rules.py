from __future__ import annotations

import pytest

from nodes.domain import inventory as rules
from nodes.domain.units import GB, GiB, TiB


@pytest.mark.parametrize(
    "host",
    ["10.0.0.5", "gpu-01", "gpu-01.example.net", "fe80::1", "::1", "node.example.net."],
)
def test_accepts_hosts(host):
    assert rules.check_host(host) is None


@pytest.mark.parametrize(
    "host",
    [
        "",
        "bad host",
        "-oProxyCommand=sh",
        "a;rm -rf /",
        "$(reboot)",
        "node\nname",
        "node_1.example",
        "999.1.1.1",
        "x" * 64,
        "a..b",
    ],
)
def test_rejects_hosts(host):
    assert rules.check_host(host) is not None


@pytest.mark.parametrize("user", ["root", "ubuntu", "_svc", "ml-ops1"])
def test_accepts_users(user):
    assert rules.check_ssh_user(user) is None


@pytest.mark.parametrize("user", ["", "Root", "-o", "a b", "x;y", "a" * 33])
def test_rejects_users(user):
    assert rules.check_ssh_user(user) is not None


@pytest.mark.parametrize("name", ["gpu-01", "a", "h200.rack3", "node_7"])
def test_accepts_node_names(name):
    assert rules.check_node_name(name) is None


@pytest.mark.parametrize("name", ["", "GPU01", "-gpu", "gpu-", "gpu 01", "a/b", "x" * 64])
def test_rejects_node_names(name):
    assert rules.check_node_name(name) is not None


@pytest.mark.parametrize(
    ("size", "ok"),
    [(96 * GiB, True), (1 * GiB, True), (4 * TiB, True), (512 * 2**20, False), (5 * TiB, False)],
)
def test_gpu_memory_bounds(size, ok):
    assert (rules.check_gpu_memory(size) is None) is ok


@pytest.mark.parametrize(
    ("size", "ok"), [(449 * GB, True), (1 * GB, True), (10**8, False), (65 * TiB, False)]
)
def test_host_ram_bounds(size, ok):
    assert (rules.check_host_ram(size) is None) is ok


def test_labels_are_split_deduplicated_and_checked():
    assert rules.parse_labels("rack=a3, h200,,h200") == (["rack=a3", "h200"], None)
    labels, error = rules.parse_labels("ok, not ok")
    assert labels == [] and "not ok" in (error or "")


def test_gpu_summary_groups_identical_gpus():
    gpus = rules.uniform_gpus(8, "NVIDIA H200", 141 * GiB)
    assert rules.gpu_summary(gpus) == "8 × NVIDIA H200 · 141 GiB"


def test_gpu_summary_of_mixed_node_and_empty_node():
    gpus = rules.uniform_gpus(2, "NVIDIA A100", 80 * GiB) + [
        rules.GpuSpec(2, "NVIDIA H100", 80 * GiB)
    ]
    assert rules.gpu_summary(gpus) == "2 × NVIDIA A100 · 80 GiB + 1 × NVIDIA H100 · 80 GiB"
    assert rules.gpu_summary([]) == "no GPUs recorded"
