"""The probe parser on the shapes NVML and nvidia-smi produce.

No real GPU node has been reachable from this project yet, so these inputs follow the vendors'
documentation rather than a capture: NVML's ``nvmlMemory_t`` (total/free/used in bytes) and
``nvmlProcessInfo_t`` (pid, usedGpuMemory in bytes) from the NVML API reference as exposed by
nvidia-ml-py, and ``nvidia-smi --query-gpu=… --format=csv,noheader,nounits`` (memory in MiB) from
``nvidia-smi --help-query-gpu``. Replace them with captured output once a GPU node is reachable.
"""

from __future__ import annotations

import json

import pytest

from nodes.domain.inventory import node_status
from nodes.domain.probe_parse import (
    NodeFacts,
    ProbeError,
    describe_changes,
    facts_from_json,
    parse_probe,
    parse_smi,
)

MiB = 2**20
H200_BYTES = 150_754_820_096  # 143,771 MiB as NVML reports an H200 141 GB


def probe_doc(**overrides: object) -> str:
    doc: dict[str, object] = {
        "probe": 1,
        "errors": {"sglang": None},
        "nvml": {
            "gpus": [
                {
                    "index": i,
                    "uuid": f"GPU-{i}",
                    "name": "NVIDIA H200",
                    "memory_total_bytes": H200_BYTES,
                    "memory_used_bytes": 4 * MiB,
                    "processes": [{"pid": 4242, "used_memory_bytes": 80 * 2**30}] if i == 1 else [],
                }
                for i in range(8)
            ],
            "driver_version": "570.133.20",
            "cuda_version": "12.8",
        },
        "process_names": {"4242": "sglang::scheduler_TP1"},
        "meminfo": {
            "MemTotal": 449_000_000_000 // 1024 * 1024,
            "MemAvailable": 400 * 10**9,
            "HugePages_Total": 0,
            "Hugepagesize": 2048 * 1024,
        },
        "cgroup_limit_bytes": None,
        "shm_bytes": 64 * 2**30,
        "cpu_count": 192,
        "os": "Ubuntu 22.04.4 LTS",
        "kernel": "5.15.0-119-generic",
        "sglang_version": "0.5.9",
    }
    doc.update(overrides)
    return json.dumps(doc)


def test_nvml_shape_becomes_bytes_and_processes():
    facts = parse_probe(probe_doc())
    assert facts.gpu_source == "nvml" and len(facts.gpus) == 8
    assert facts.gpus[0].memory_total_bytes == H200_BYTES
    assert facts.gpus[1].processes[0].name == "sglang::scheduler_TP1"
    assert facts.gpus[1].processes[0].used_memory_bytes == 80 * 2**30
    assert facts.host_ram_bytes == 448_999_999_488
    assert facts.hugepages_bytes == 0 and facts.problems == ()
    assert facts.gpus_detected


def test_nvidia_smi_csv_is_mib():
    csv = (
        "0, GPU-a, NVIDIA H200, 143771, 1, 570.133.20, 00000000:18:00.0\n"
        "1, GPU-b, NVIDIA H200, 143771, 81920, 570.133.20, 00000000:2A:00.0\n"
    )
    apps = "GPU-b, 4242, /usr/bin/python3, 81920\n"
    gpus = parse_smi(csv, apps)
    assert [g.memory_total_bytes for g in gpus] == [143771 * MiB] * 2
    assert gpus[1].memory_used_bytes == 81920 * MiB
    assert gpus[1].processes[0].pid == 4242 and gpus[0].processes == ()
    doc = json.loads(probe_doc())
    del doc["nvml"]
    doc["errors"]["nvml"] = "ModuleNotFoundError: No module named 'pynvml'"
    doc["nvidia_smi"] = {"gpu_csv": csv, "apps_csv": apps}
    facts = parse_probe(json.dumps(doc))
    assert facts.gpu_source == "nvidia-smi" and facts.driver_version == "570.133.20"
    assert "NVML unavailable" in facts.notes[0]


def test_no_gpu_source_is_a_problem_with_both_reasons():
    doc = json.loads(probe_doc())
    del doc["nvml"]
    doc["errors"]["nvml"] = "NVMLError_DriverNotLoaded: Driver Not Loaded"
    doc["errors"]["nvidia_smi"] = (
        "FileNotFoundError: [Errno 2] No such file or directory: 'nvidia-smi'"
    )
    facts = parse_probe(json.dumps(doc))
    assert facts.gpus == () and not facts.gpus_detected
    assert facts.problems == (
        "GPUs not detected: NVML: Driver Not Loaded; nvidia-smi is not installed (no NVIDIA "
        "driver?)",
    )


def test_nvml_with_no_devices_is_a_problem_too():
    doc = json.loads(probe_doc())
    doc["nvml"]["gpus"] = []
    assert parse_probe(json.dumps(doc)).problems == (
        "GPUs not detected: nvml reports no GPU devices",
    )


def test_missing_sglang_is_a_problem():
    facts = parse_probe(
        probe_doc(
            sglang_version=None,
            errors={
                "sglang": "/opt/sglang/bin/python: ModuleNotFoundError: No module named 'sglang'"
            },
        )
    )
    assert facts.problems == (
        "SGLang not found: /opt/sglang/bin/python: ModuleNotFoundError: No module named 'sglang'",
    )


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"probe": 2}', "Welcome to node!\n{}"])
def test_other_output_is_a_probe_error(text):
    with pytest.raises(ProbeError):
        parse_probe(text)


def test_bad_smi_row_is_a_probe_error():
    with pytest.raises(ProbeError, match="unexpected nvidia-smi row"):
        parse_smi("0, GPU-a, NVIDIA H200, [N/A], 1\n", "")


def test_facts_round_trip_through_json():
    facts = parse_probe(probe_doc())
    assert facts_from_json(json.loads(json.dumps(facts.to_json()))) == facts


def test_changes_are_described():
    before = parse_probe(probe_doc())
    doc = json.loads(probe_doc())
    doc["nvml"]["gpus"].pop()
    doc["nvml"]["driver_version"] = "575.51.03"
    doc["meminfo"]["MemTotal"] = 200 * 10**9
    after = parse_probe(json.dumps(doc))
    changes = describe_changes(before, after)
    assert "GPU 7 (NVIDIA H200, GPU-7) disappeared" in changes
    assert "driver changed: 570.133.20 → 575.51.03" in changes
    assert "host RAM (bytes) changed: 448,999,999,488 → 200,000,000,000" in changes
    assert describe_changes(None, after) == [] and describe_changes(after, after) == []


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"reachable": True, "maintenance": False, "problems": []}, ("ready", "")),
        (
            {"reachable": True, "maintenance": False, "problems": ["GPUs not detected: x"]},
            ("degraded", "GPUs not detected: x"),
        ),
        (
            {"reachable": False, "maintenance": False, "problems": [], "error": "timed out"},
            ("unreachable", "timed out"),
        ),
        ({"reachable": False, "maintenance": True, "problems": []}, ("maintenance", "")),
    ],
)
def test_node_status(kwargs, expected):
    assert node_status(**kwargs) == expected


def test_empty_facts_are_not_detected():
    assert not NodeFacts().gpus_detected


def test_the_nodes_addresses_are_read_for_a_multi_node_launch_and_kept():
    # The probe's ``ip -j addr`` pairs (issue 22): what node_group.meeting chooses from.
    pairs = [["lo", "127.0.0.1/8"], ["eth1", "172.30.0.2/24"], ["ib0", "fd00::2/64"]]
    junk = [["eth2"], ["eth3", "not an address"], "eth4", ["eth5", 7]]
    facts = parse_probe(probe_doc(interfaces=pairs + junk))
    assert facts.interfaces == (
        ("lo", "127.0.0.1/8"),
        ("eth1", "172.30.0.2/24"),
        ("ib0", "fd00::2/64"),
    )
    assert facts_from_json(json.loads(json.dumps(facts.to_json()))) == facts
    assert parse_probe(probe_doc()).interfaces == ()  # an older agent said nothing
    stored = facts.to_json()
    del stored["interfaces"]  # facts stored before the field existed
    assert facts_from_json(stored).interfaces == ()
