"""Node faults and fleet operations: leaks that survive a crash, missing NVML or driver, links,
host keys, reboots."""

from __future__ import annotations

import paramiko
import pytest

from tests.fleet import simfleet, wait_until
from tests.simfleet.test_sglang_standin import INCIDENT, health, start

QWEN = "--model-path /srv/models/qwen2.5-7b --tp-size 2"


def _gpu_used_mib(node) -> list[int]:
    out = node.ok("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits")
    return [int(v) for v in out.split()]


def _ram_used(node) -> int:
    return int(node.ok("free -b").splitlines()[1].split()[2])


def test_leak_on_crash_keeps_memory_held_with_no_process_until_reboot(sim_fleet):
    node = sim_fleet["leaky"]
    node.reboot()
    start(node, QWEN + " --mem-fraction-static 0.5 --enable-hierarchical-cache --hicache-size 60")
    assert wait_until(lambda: health(node) == "200", 40), node.ok("tail -20 /root/server.log")
    idle = 4
    assert all(used > 10_000 for used in _gpu_used_mib(node)[:2])
    # The server dies hard (the operator kills everything with SIGKILL).
    node.ok("pkill -KILL -f '^sglang::'; true")
    assert wait_until(lambda: "sglang" not in node.ok("ps -eo args="), 10)
    assert all(used > 10_000 for used in _gpu_used_mib(node)[:2])
    assert node.ok("nvidia-smi --query-compute-apps=pid --format=csv,noheader").strip() == ""
    assert node.ok("fuser /dev/nvidia0 /dev/nvidia1 2>&1; true").strip() == ""
    assert _ram_used(node) > 2 * 60 * 10**9
    status, out, _ = node.run("nvidia-smi --gpu-reset -i 0")
    assert status != 0 and "not supported" in out
    node.reboot()
    assert _gpu_used_mib(node) == [idle] * 8
    assert _ram_used(node) < 5 * 10**9


def test_leak_on_crash_the_ranks_the_oom_killer_takes_leave_their_gpu_memory(sim_fleet):
    """The incident's own death path: ranks the kernel OOM-kills while they pin their HiCache
    pools leave their GPU memory behind with no process, and the kernel says so."""
    node = sim_fleet["leaky"]
    node.reboot()
    start(node, INCIDENT)
    # 0.5.9's launcher waits on its dead ranks (until NCCL's timeout), so the survivors stay.
    assert wait_until(lambda: "Out of memory: Killed process" in node.ok("dmesg"), 60)

    def orphaned() -> list[str]:
        used = node.ok("nvidia-smi --query-gpu=index,memory.used,uuid --format=csv,noheader")
        apps = node.ok("nvidia-smi --query-compute-apps=gpu_uuid --format=csv,noheader")
        return [
            index
            for index, mib, uuid in (line.split(", ") for line in used.splitlines())
            if int(mib.split()[0]) > 80_000 and uuid not in apps
        ]

    assert wait_until(orphaned, 20), node.ok("nvidia-smi; ps -eo pid,args")
    killed = node.ok("dmesg | grep -c 'Out of memory: Killed process'").strip()
    assert 1 <= len(orphaned()) <= int(killed)
    node.reboot()


def test_without_the_fault_a_killed_server_gives_memory_back(sim_fleet):
    node = sim_fleet["spare"]
    node.reboot()
    start(node, QWEN)
    assert wait_until(lambda: health(node) == "200", 40)
    node.ok("pkill -KILL -f '^sglang::'; true")
    assert wait_until(lambda: _gpu_used_mib(node) == [4, 4], 10)


def test_stuck_on_kill_leaves_ranks_in_d_state_holding_memory_until_reboot(sim_fleet):
    node = sim_fleet["stuck"]
    node.reboot()
    start(node, QWEN + " --mem-fraction-static 0.5 --enable-hierarchical-cache --hicache-size 40")
    assert wait_until(lambda: health(node) == "200", 40)
    node.ok("pkill -KILL -f '^sglang::http_server'")
    stuck = wait_until(
        lambda: (
            len(ps := node.ok("ps -eo stat=,args= | awk '$1 ~ /^D/ {print $2}'").split()) == 2
            and ps
        ),
        15,
    )
    assert stuck, node.ok("ps -eo pid,stat,args; tail -5 /root/server.log")
    assert sorted(stuck) == ["sglang::scheduler_TP0", "sglang::scheduler_TP1"]
    node.ok("pkill -KILL -f '^sglang::scheduler'; sleep 0.5")
    assert len(node.ok("ps -eo stat= | grep ^D; true").split()) == 2  # SIGKILL cannot end them
    assert _ram_used(node) > 2 * 40 * 10**9
    node.reboot()
    assert _ram_used(node) < 5 * 10**9 and _gpu_used_mib(node) == [4, 4]


def test_no_nvml_fails_nvml_init_but_nvidia_smi_answers(sim_fleet):
    node = sim_fleet["no-nvml"]
    out = node.ok(
        "python3 -c 'import pynvml\ntry:\n pynvml.nvmlInit()\n"
        "except pynvml.NVMLError as e: print(type(e).__name__, e)'"
    )
    assert out.strip() == "NVMLError_LibraryNotFound NVML Shared Library Not Found"
    assert len(node.ok("nvidia-smi -L").splitlines()) == 2


def test_no_driver_means_no_nvidia_smi_no_nvml_no_devices(sim_fleet):
    node = sim_fleet["no-driver"]
    status, _, _ = node.run("command -v nvidia-smi")
    assert status == 1
    assert node.ok("ls /dev | grep -c nvidia; true").strip() == "0"
    out = node.ok(
        "python3 -c 'import pynvml\ntry:\n pynvml.nvmlInit()\n"
        "except pynvml.NVMLError as e: print(type(e).__name__, e)'"
    )
    assert out.strip() == "NVMLError_DriverNotLoaded Driver Not Loaded"


def test_link_down_makes_the_node_unreachable_until_up(sim_fleet):
    node = sim_fleet["spare"]
    simfleet("link", "spare", "down", "--state", node.state)
    try:
        with pytest.raises((OSError, paramiko.SSHException)):
            node.connect(timeout=1.5)
        assert sim_fleet["incident"].ok("hostname").strip() == "incident"
    finally:
        simfleet("link", "spare", "up", "--state", node.state)
    assert node.ok("hostname").strip() == "spare"


def test_rekey_changes_the_host_key_the_node_presents(sim_fleet):
    node = sim_fleet["no-driver"]
    new = simfleet("rekey", "no-driver", "--state", node.state).stdout.strip()
    assert new.startswith("SHA256:") and new != node.host_key_fingerprint
    with pytest.raises(paramiko.SSHException, match="host key"):
        node.connect()
    node.host_key_fingerprint = new
    assert node.ok("hostname").strip() == "no-driver"


def test_status_reports_gpus_and_ram(sim_fleet):
    import json

    doc = json.loads(simfleet("status", "--json", "--state", sim_fleet["spare"].state).stdout)
    spare = next(n for n in doc["nodes"] if n["name"] == "spare")
    assert spare["running"] and spare["host_ram_bytes"] == 200 * 10**9
    assert [g["memory_total_bytes"] for g in spare["gpus"]] == [80 * 2**30] * 2
