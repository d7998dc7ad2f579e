"""Over real SSH, a simulated node answers like a GPU machine and hides the real one."""

from __future__ import annotations

import json
import os

import pytest

GiB = 2**30
MiB = 2**20


def test_up_describes_each_node(sim_fleet):
    node = sim_fleet["incident"]
    assert node.port == 22 and node.user == "root" and os.path.exists(node.key_path)
    assert node.host_key_fingerprint.startswith("SHA256:")
    assert set(node.models) == {"kimi-k2", "llama-3-70b", "qwen2.5-7b", "qwen3-next-80b-a3b"}
    addresses = {n.host for n in sim_fleet.values()}
    assert len(addresses) == len(sim_fleet)
    assert node.ok("hostname").strip() == "incident"
    assert (
        node.ok(
            f"cat {node.models['kimi-k2']}/config.json | python3 -c "
            '\'import json,sys; print(json.load(sys.stdin)["text_config"]["kv_lora_rank"])\''
        ).strip()
        == "512"
    )


def test_nvidia_smi_and_nvml_agree(sim_fleet):
    node = sim_fleet["incident"]
    csv = node.ok(
        "nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,driver_version "
        "--format=csv,noheader,nounits"
    )
    rows = [line.split(", ") for line in csv.strip().splitlines()]
    assert [int(r[0]) for r in rows] == list(range(8))
    assert {r[2] for r in rows} == {"NVIDIA H200"}
    assert {int(r[3]) for r in rows} == {96 * GiB // MiB}
    nvml = json.loads(
        node.ok(
            "python3 -c 'import json, pynvml as n; n.nvmlInit(); "
            "hs=[n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]; "
            'print(json.dumps({"driver": n.nvmlSystemGetDriverVersion(), "gpus": '
            "[[n.nvmlDeviceGetUUID(h), n.nvmlDeviceGetName(h), n.nvmlDeviceGetMemoryInfo(h).total, "
            "n.nvmlDeviceGetMemoryInfo(h).used] for h in hs]})); n.nvmlShutdown()'"
        )
    )
    assert nvml["driver"] == rows[0][5]
    assert [g[0] for g in nvml["gpus"]] == [r[1] for r in rows]
    assert [g[2] // MiB for g in nvml["gpus"]] == [int(r[3]) for r in rows]
    assert [g[3] // MiB for g in nvml["gpus"]] == [int(r[4]) for r in rows]
    listing = node.ok("nvidia-smi -L").splitlines()
    assert listing[0] == f"GPU 0: NVIDIA H200 (UUID: {rows[0][1]})"


def test_nvml_errors_behave_like_nvml(sim_fleet):
    out = sim_fleet["incident"].ok(
        "python3 -c 'import pynvml as n\n"
        'try:\n n.nvmlDeviceGetCount()\nexcept n.NVMLError_Uninitialized as e: print("uninit", e)\n'
        "n.nvmlInit()\n"
        "try:\n n.nvmlDeviceGetHandleByIndex(99)\n"
        "except n.NVMLError as e: print(type(e).__name__, e)'"
    )
    assert out.splitlines() == [
        "uninit Uninitialized",
        "NVMLError_InvalidArgument Invalid Argument",
    ]


def test_host_is_the_nodes_own(sim_fleet):
    node = sim_fleet["spare"]
    free = node.ok("free -b").splitlines()[1].split()
    assert int(free[1]) // 1024 == 200 * 10**9 // 1024
    meminfo = node.ok("grep MemTotal /proc/meminfo").split()
    assert int(meminfo[1]) == 200 * 10**9 // 1024
    processes = node.ok("ps -e -o comm=").split()
    assert "sshd" in processes and "pytest" not in " ".join(processes)
    assert "redis-server" not in processes and "postgres" not in processes
    shm = node.ok("df -B1 --output=size,used /dev/shm").splitlines()[1].split()
    assert int(shm[0]) == 64 * GiB and int(shm[1]) == 0
    assert node.ok("ls /dev/nvidia0 /dev/nvidiactl").split() == ["/dev/nvidia0", "/dev/nvidiactl"]
    assert "Linux version" in node.ok("dmesg")


def test_host_ram_moves_when_memory_is_pinned(sim_fleet):
    node = sim_fleet["spare"]
    before = int(node.ok("free -b").splitlines()[1].split()[2])
    node.ok(
        "python3 -c 'from simnode import state; import time; state.pin_host(5 * 10**9); "
        'print(open("/proc/meminfo").read())\' > /tmp/pinned.txt'
    )
    after = int(node.ok("free -b").splitlines()[1].split()[2])
    # The pinning process has exited: its memory came back.
    assert after == before
    pinned = node.ok("grep Mlocked /tmp/pinned.txt").split()
    assert int(pinned[1]) * 1024 == pytest.approx(5 * 10**9, abs=1024)


def test_a_configured_cgroup_limit_is_what_the_node_sees(sim_fleet):
    node = sim_fleet["no-nvml"]
    assert node.ok("cat /sys/fs/cgroup/memory.max").strip() == str(100 * 10**9)
    assert node.ok("cat /sys/fs/cgroup/memory.max", timeout=5) != "max"
    current = int(node.ok("cat /sys/fs/cgroup/memory.current"))
    assert 0 < current < 100 * 10**9
    assert sim_fleet["spare"].ok("cat /sys/fs/cgroup/memory.max").strip() == "max"


@pytest.mark.parametrize("command", ["/dev/shm", "/root"])
def test_shm_and_home_are_per_node(sim_fleet, command):
    sim_fleet["spare"].ok(f"touch {command}/only-on-spare")
    status, _, _ = sim_fleet["incident"].run(f"test -e {command}/only-on-spare")
    assert status == 1
    assert not os.path.exists(f"{command}/only-on-spare")
