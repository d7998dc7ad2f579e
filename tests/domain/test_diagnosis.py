"""The diagnosis engine on the case corpus and on cases written from SGLang's log formats.

Every case folder under tests/fixtures/cases is a test: adding a folder adds a case.
"""

from __future__ import annotations

import json
import re
from typing import cast

import pytest

from nodes.domain.diagnosis import diagnose
from tests.cases import CORPUS, case_dirs, case_ids, flags_of, run, states

CASES = CORPUS


def corpus() -> list[str]:
    return case_ids(CORPUS)


@pytest.mark.parametrize("name", corpus())
def test_corpus_cases_get_their_category_numbers_and_fix(name):
    expected = json.loads((CASES / name / "expected.json").read_text())
    found = run(CASES / name)
    assert found.category == expected["category"], found.summary
    missing = [k for k, v in expected["key_numbers"].items() if not states(found.summary, v)]
    assert not missing, (missing, found.summary)
    assert any(k.lower() in found.remedy.lower() for k in expected["remedy_keywords"]), found.remedy
    assert found.evidence and all(e.line for e in found.evidence if e.source == "log")


@pytest.mark.parametrize("name", corpus())
def test_without_the_signatures_a_case_is_unknown_not_wrong(name):
    expected = json.loads((CASES / name / "expected.json").read_text())
    facts = json.loads((CASES / name / "facts.json").read_text())
    log = (CASES / name / "launch.log").read_text()
    for signature in expected.get("signatures", []):
        log = "\n".join(line for line in log.splitlines() if signature not in line)
    assert diagnose(log, facts, flags_of(facts)).category in ("unknown", expected["category"])


def test_a_precheck_of_another_size_on_0_5_12_is_read_the_same_way():
    log = (
        "[2026-03-01 10:00:00 TP2] Scheduler hit an exception: Traceback (most recent call "
        "last):\nValueError: Not enough host memory available. Requesting 120.50 GB but only "
        "have 98.20 GB free. Please reduce the size of the hierarchical cache.\n"
    )
    found = diagnose(log, {"engine_version": "0.5.12"}, {})
    assert found.category == "host-mem-precheck"
    assert found.numbers["effective_free_gb"] == 87.46 and found.numbers["shortfall_gb"] == 33.04
    assert found.evidence[0].line == 2


def test_an_empty_log_is_unknown_and_says_what_would_help():
    found = diagnose("", {}, {})
    assert found.category == "unknown" and "dmesg" in found.remedy
    assert set(found.to_json()) == {
        "category",
        "secondary_categories",
        "summary",
        "evidence",
        "remedy",
        "numbers",
    }


def test_a_busy_nccl_port_with_its_holder_in_the_snapshot():
    log = (
        "[2026-05-02 08:00:00] server_args=ServerArgs(port=31000, ...)\n"
        "ValueError: nccl_port at 31417 is not available in 60 seconds. nccl_port is used by a "
        "process already.\n"
    )
    facts = {
        "snapshots": [
            {
                "phase": "after_failure",
                "listening_ports": [{"port": 31417, "pid": 777}],
                "processes": [{"pid": 777, "ppid": 1, "cmdline": "sglang::scheduler_TP1"}],
            }
        ]
    }
    found = diagnose(log, facts, {})
    assert (
        found.category == "port-in-use" and "defunct-zombie-process" in found.secondary_categories
    )
    assert found.numbers == {"port": 31417, "wait_seconds": 60, "holder_pid": 777}


def test_an_unbalanced_gpu_in_0_5_23_wording():
    log = (
        "RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other "
        "processes. min_per_gpu_memory=60.125, local_gpu_memory=139.5, local_gpu_memory * "
        "0.9=125.55\n"
    )
    found = diagnose(log, {}, {})
    assert found.category == "gpu-occupied-by-other-process"
    assert "60.12 GB vs 139.50 GB" in found.summary or "60.13 GB vs 139.50 GB" in found.summary


def test_no_corpus_case_gets_a_wrong_category():
    wrong = {}
    for case in sorted(p for p in CASES.iterdir() if p.is_dir()):
        expected = json.loads((case / "expected.json").read_text())["category"]
        found = run(case).category
        if found not in (expected, "unknown"):
            wrong[case.name] = (expected, found)
    assert not wrong


# --- one test per rule, from SGLang's log formats with other numbers than the corpus -----------


def test_pools_that_fit_at_start_but_are_pinned_when_the_kernel_oom_kills_on_0_5_21():
    log = (
        "[2026-02-01 09:00:00] server_args=ServerArgs(model_path='/m', tp_size=2, "
        "enable_hierarchical_cache=True, hicache_size=96, ...)\n"
        "[2026-02-01 09:03:00 TP0] Allocating kv hierarchical KV host pool: 2000000 tokens, "
        "96.00 GB host memory.\n"
        "[2026-02-01 09:03:00 TP1] Allocating kv hierarchical KV host pool: 2000000 tokens, "
        "96.00 GB host memory.\n"
        "[2026-02-01 09:03:30] The server is fired up and ready to roll!\n"
    )
    facts = {
        "command": ["python3", "-m", "sglang.launch_server", "--tp-size", "2"],
        "snapshots": [
            {"phase": "before_launch", "meminfo": {"MemAvailable": 300 * 10**9}},
            {
                "phase": "after_failure",
                "kernel_log": ["Out of memory: Killed process 999 (sglang::schedul) total-vm:1kB"],
            },
        ],
    }
    found = diagnose(log, facts, {"tp_size": 2, "hicache_size": 96})
    assert found.category == "host-oom-hicache"
    assert found.numbers["hicache_gb_total"] == 192 and found.numbers["tp_size"] == 2
    assert found.numbers["fraction_of_budget_pinned"] == 0.64
    assert "--hicache-size 96 GB = 96.00 GB pinned per rank x 2 ranks" in found.summary
    assert [e.line for e in found.evidence if e.source == "log"] == [2, 3]


def test_a_container_oom_kill_with_hicache_inside_the_limit():
    log = "\n".join(
        [
            "[2026-02-02 10:00:00] server_args=ServerArgs(tp_size=4, hicache_ratio=1.5, ...)",
            *(
                f"[2026-02-02 10:02:00 TP{r}] Allocating 8.00 GB host memory for hierarchical KV "
                "cache."
                for r in range(4)
            ),
            "[2026-02-02 10:05:00 TP0] Prefill batch. #new-seq: 16, #new-token: 8192, "
            "#cached-token: 0, token usage: 0.40, #running-req: 4, #queue-req: 9",
        ]
    )
    limit = 64 * 2**30
    facts = {
        "snapshots": [
            {"phase": "during", "cgroup_memory": {"max_bytes": limit, "current_bytes": 40 * 2**30}},
            {"phase": "during", "cgroup_memory": {"max_bytes": limit, "current_bytes": 63 * 2**30}},
            {
                "phase": "after_failure",
                "notes": ["kubectl: Last State Terminated, Reason OOMKilled"],
            },
        ]
    }
    found = diagnose(log, facts, {"tp_size": 4, "hicache_ratio": 1.5})
    assert found.category == "host-oom-cgroup"
    assert found.secondary_categories == ["host-oom-hicache"]
    assert found.numbers["cgroup_limit_gib"] == 64 and found.numbers["peak_usage_gib"] == 63
    assert found.numbers["idle_fraction_of_limit"] == 0.62 and found.numbers["concurrency"] == 20
    assert "4 x 8.00 GB = 32.00 GB" in found.summary and "--hicache-size" in found.remedy


def test_the_http_port_already_bound_names_its_holder():
    log = (
        "[2026-02-03 11:00:00] server_args=ServerArgs(port=8080, ...)\n"
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 8080): "
        "address already in use\n"
    )
    facts = {
        "snapshots": [
            {
                "phase": "after_failure",
                "listening_ports": [{"port": 8080, "pid": 4242}],
                "processes": [{"pid": 4242, "ppid": 900, "cmdline": "python3 -m http.server 8080"}],
            }
        ]
    }
    found = diagnose(log, facts, {"port": 8080})
    assert found.category == "port-in-use" and found.secondary_categories == []
    assert found.numbers == {"colliding_port": 8080, "holder_pid": 4242}
    assert found.evidence[0].line == 2


def test_a_zmq_port_in_the_derived_block_with_oversized_host_pools_behind_it():
    log = (
        "[2026-02-04 12:00:00 DP0 TP0] KV Cache is allocated. #tokens: 500000, K size: 30.00 GB, "
        "V size: 30.00 GB\n"
        "[2026-02-04 12:00:05 DP0 TP0] Allocating 128.85 GB host memory for hierarchical KV "
        "cache.\n"
        "[2026-02-04 12:00:05 DP1 TP1] Allocating 128.85 GB host memory for hierarchical KV "
        "cache.\n"
        "zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:40234')\n"
    )
    facts = {
        "node": {"host_ram_bytes": 400 * 10**9, "gpus": [{"index": i} for i in range(4)]},
        "command": ["python3", "-m", "sglang.launch_server", "--tp-size", "2", "--port", "40000"],
    }
    flags = {"tp_size": 2, "dp_size": 2, "enable_dp_attention": True, "port": 40000}
    found = diagnose(log, facts, {**flags, "enable_hierarchical_cache": True, "hicache_ratio": 2.0})
    assert found.category == "port-in-use"
    assert found.secondary_categories == ["host-oom-hicache"]
    assert found.numbers["colliding_port"] == 40234 and found.numbers["offset_from_port"] == 234
    assert found.numbers["hicache_gb_total"] == 257.7 and found.numbers["host_share_gb"] == 200
    assert "the default --hicache-ratio 2" in found.summary
    assert "ports 40000/41000" in found.remedy and "--hicache-size" in found.remedy


def test_a_four_node_init_that_never_ends_in_0_5_9_wording():
    log = (
        "[2026-02-05 08:00:00] server_args=ServerArgs(tp_size=16, nnodes=4, node_rank=0, "
        "dist_init_addr='172.16.0.1:5000', ...)\n"
        "[2026-02-05 08:00:10 TP1] Init torch distributed begin.\n"
        "[2026-02-05 08:00:11 TP1] sglang is using nccl==2.21.5\n"
        "[2026-02-05 08:10:11] Rank 1 scheduler is dead. Please check if there are relevant logs.\n"
        "[2026-02-05 08:10:11] Exit code: -9\n"
    )
    facts = {
        "nodes_in_launch": 4,
        "snapshots": [
            {
                "phase": "during",
                "network": {
                    "interfaces": [
                        {"name": "eth0", "ipv4": "192.168.1.5/24", "default_route": True},
                        {"name": "ib0", "ipv4": "172.16.0.5/16", "default_route": False},
                    ]
                },
            }
        ],
    }
    found = diagnose(log, facts, {})
    assert found.category == "nccl-init-hang"
    assert found.numbers == {
        "nnodes": 4,
        "tp_size": 16,
        "hang_seconds_until_kill": 600,
        "exit_code": -9,
    }
    assert "NCCL_SOCKET_IFNAME=ib0" in found.remedy and "SGLANG_HOST_IP" in found.remedy
    assert "default route is eth0 (192.168.1.5/24)" in found.summary


def test_a_rank_that_raised_during_distributed_init_is_not_a_hang():
    log = (
        "[2026-02-05 08:00:10 TP0] Init torch distributed begin.\n"
        "[2026-02-05 08:00:12 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        "RuntimeError: something else\n"
        "[2026-02-05 08:00:13] Rank 0 scheduler died during initialization (exit code: 1).\n"
    )
    assert diagnose(log, {}, {}).category == "unknown"


def test_a_load_barrier_takes_the_tp_size_from_the_rank_tags_in_0_5_23_wording():
    log = "\n".join(
        [
            "[2026-02-06 07:02:00 TP0] Load weight begin. avail mem=78.00 GB",
            *(
                f"[2026-02-06 07:10:00 TP{r}] Load weight end. elapsed=480.00 s, "
                "type=LlamaForCausalLM, avail mem=40.00 GB, mem usage=38.00 GB."
                for r in (1, 2)
            ),
            "[2026-02-06 07:40:00 TP2] Scheduler hit an exception: Traceback (most recent call "
            "last):",
            "ValueError: TP rank 2 could finish the model loading, but there are other ranks that "
            "didn't finish loading. It is likely due to unexpected failures (e.g., OOM) or a slow "
            "node.",
            "[2026-02-06 07:40:00 TP3] Init torch distributed ends. mem usage=0.5 GB",
        ]
    )
    found = diagnose(log, {}, {})
    assert found.category == "startup-timeout"
    assert found.numbers == {"tp_size": 4, "barrier_timeout_s": 1800, "normal_rank_load_min": 8}
    assert "2 of 4 TP ranks" in found.summary
    assert "SGLANG_MODEL_LOADING_TIMEOUT_S=5400" in found.remedy


def test_an_automatic_fraction_at_prefill_graph_capture_in_0_5_23():
    log = (
        "[2026-02-07 06:00:00] server_args=ServerArgs(tp_size=4, mem_fraction_static=0.85, ...)\n"
        "[2026-02-07 06:00:20 TP1] Load weight begin. avail mem=78.50 GB\n"
        "Capturing batches (bs=512 avail_mem=9.10 GB):   1%|          | 1/52\n"
        "[2026-02-07 06:03:00 TP1] Exception: Capture prefill CUDA graph failed: CUDA out of "
        "memory. Tried to allocate 1.50 GiB. GPU 1 has a total capacity of 79.19 GiB of which "
        "0.80 GiB is free.\n"
    )
    facts = {"node": {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}]}}
    found = diagnose(log, facts, {"tp_size": 4})
    assert found.category == "gpu-oom-cuda-graph"
    assert found.numbers["reserve_gib_of_total"] == 11.88
    assert found.numbers["cuda_graph_max_bs"] == 512 and found.numbers["tp_size"] == 4
    assert "(H100 80GB HBM3, TP 4)" in found.summary and "the automatic" in found.summary
    assert "--mem-fraction-static to 0.81" in found.remedy
    assert "--cuda-graph-max-bs 256" in found.remedy and "HiCache" not in found.remedy


def test_a_fraction_window_names_the_card_and_its_free_memory():
    attempt = (
        "[2026-02-08 05:0{m}:00] server_args=ServerArgs(tp_size=1, mem_fraction_static={f}, ...)\n"
        "[2026-02-08 05:0{m}:05] Load weight begin. avail mem=21.70 GB\n"
    )
    log = (
        attempt.format(m=0, f=0.9)
        + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB.\n"
        + attempt.format(m=5, f=0.88)
        + "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.\n"
    )
    facts = {"node": {"gpus": [{"name": "NVIDIA A10G", "memory_total_bytes": 23836229632}]}}
    found = diagnose(log, facts, {"mem_fraction_static": 0.88})
    assert found.category == "mem-fraction-window"
    assert "on A10G 24GB (22.20 GiB, 21.70 GiB free before the weights)" in found.summary
    assert found.numbers["mfs_oom"] == 0.9 and found.numbers["avail_before_load_gib"] == 21.7


def test_a_weight_load_oom_naming_a_process_of_another_user():
    log = (
        "[2026-02-09 04:00:00 TP2] Load weight begin. avail mem=18.40 GB\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 2 has a "
        "total capacity of 79.15 GiB of which 512.00 MiB is free. Process 77 has 60.10 GiB memory "
        "in use. Including non-PyTorch memory, this process has 18.50 GiB memory in use.\n"
    )
    found = diagnose(log, {}, {})
    assert found.category == "gpu-occupied-by-other-process" and not found.secondary_categories
    assert found.numbers["holder_pid"] == 77 and found.numbers["free_gib"] == 0.5
    assert "pre-launch GPU idle check" in found.remedy


def test_an_orphaned_vllm_engine_holding_the_gpu_is_the_root_cause():
    log = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 44.39 GiB of which 1.00 GiB is free. Process 5150 has 40.00 GiB memory "
        "in use.\n"
    )
    facts = {
        "snapshots": [
            {
                "phase": "after_failure",
                "gpu_processes": [
                    {
                        "gpu_index": 0,
                        "pid": 5150,
                        "name": "VLLM::EngineCore",
                        "used_memory_bytes": 42949672960,
                    }
                ],
                "processes": [
                    {"pid": 5150, "ppid": 1, "state": "S", "cmdline": "VLLM::EngineCore"}
                ],
            }
        ]
    }
    found = diagnose(log, facts, {})
    assert found.category == "gpu-occupied-by-other-process"
    assert found.secondary_categories == ["defunct-zombie-process"]
    assert found.numbers["orphans"] == 1 and "40960 MiB" in found.summary


def test_a_gpu_held_from_another_container_seen_by_fuser_only():
    log = (
        "$ nvidia-smi\n"
        "| N/A   41C    P0    70W / 400W |  30001MiB / 81920MiB |     87%      Default |\n"
        "$ sudo fuser -v /dev/nvidia3\n"
        "/dev/nvidia3:         alice     918273 F...m python\n"
    )
    found = diagnose(log, {}, {})
    assert found.category == "gpu-occupied-by-other-process"
    assert found.numbers == {
        "gpu_index": 3,
        "holder_pid": 918273,
        "held_mib": 30001,
        "util_percent": 87,
    }
    assert "fuser -v /dev/nvidia*" in found.remedy


def test_a_live_gpu_holder_without_gpu_evidence_in_the_log_is_not_claimed():
    facts = {
        "snapshots": [
            {
                "phase": "after_failure",
                "gpu_processes": [{"gpu_index": 0, "pid": 1, "used_memory_bytes": 2**34}],
                "processes": [{"pid": 1, "ppid": 0, "state": "S", "cmdline": "python3"}],
            }
        ]
    }
    assert diagnose("Traceback (most recent call last):\n", facts, {}).category == "unknown"


@pytest.mark.parametrize(
    "odd",
    [
        None,
        {"node": None, "snapshots": None, "command": None, "env": None, "exit": None},
        {"node": {"gpus": [None, "x", {"name": None}]}, "snapshots": [None, "x", 3]},
        {"snapshots": [{"gpu_processes": [{"pid": "x"}], "processes": [None], "notes": None}]},
        {"snapshots": [{"cgroup_memory": "x", "meminfo": [], "kernel_log": "x", "network": 1}]},
    ],
)
def test_odd_facts_never_raise(odd):
    for case in corpus():
        found = diagnose((CASES / case / "launch.log").read_text(), odd, {"tp_size": "x"})
        assert found.category and isinstance(found.numbers, dict)


# --- a server that died after it was ready --------------------------------------------------

READY = "[2026-06-01 09:00:00] The server is fired up and ready to roll!"


def test_a_nccl_watchdog_after_ready_is_a_runtime_failure_with_the_collective():
    log = "\n".join(
        [
            "[2026-06-01 08:58:00 TP0] Load weight end. avail mem=20.10 GB, mem usage=60.2 GB.",
            READY,
            "[2026-06-01 09:40:00 TP5] Watchdog caught collective operation timeout: "
            "WorkNCCL(SeqNum=98123, OpType=ALLGATHER, NumelIn=1, NumelOut=4, "
            "Timeout(ms)=1800000) ran for 1800047 milliseconds before timing out.",
        ]
    )
    found = diagnose(log, {}, {"tp_size": 4})
    assert found.category == "health-check-failure"
    assert "ALLGATHER" in found.summary and "1800 s" in found.summary
    assert found.numbers["nccl_timeout_s"] == 1800 and [e.line for e in found.evidence] == [2, 3]
    assert "--dist-timeout" in found.remedy


def test_a_rank_the_panel_saw_die_after_ready_names_it_and_the_oom_kill():
    facts = {
        "snapshots": [
            {
                "phase": "after_failure",
                "kernel_log": ["Out of memory: Killed process 5121 (sglang::schedul)"],
                "notes": ["panel: sglang::scheduler_TP2 (PID 5121) died while serving"],
            }
        ]
    }
    found = diagnose(READY + "\n", facts, {"tp_size": 4})
    assert found.category == "health-check-failure"
    assert "sglang::scheduler_TP2 (PID 5121) died while serving" in found.summary
    assert "OOM killer" in found.summary and found.numbers["dead_pid"] == 5121


def test_health_failing_while_the_http_server_answers():
    facts = {
        "snapshots": [
            {"notes": ["panel: health check failed 3 times in a row: /health answered 503"]}
        ]
    }
    found = diagnose("x\n" + READY + "\n", facts, {})
    assert found.category == "health-check-failure" and "(line 2)" in found.summary
    assert "/health failed 3 times in a row (/health answered 503)" in found.summary


def test_a_watchdog_before_ready_is_not_a_runtime_failure():
    log = (
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE, "
        "Timeout(ms)=600000) ran for 600012 milliseconds before timing out.\n"
    )
    assert diagnose(log, {}, {}).category != "health-check-failure"


def test_a_new_one_line_signature_is_one_entry_of_data():
    from nodes.domain.diagnosis.evidence import Bundle, Log
    from nodes.domain.diagnosis.signatures import Signature

    disk = Signature(
        "model-not-found",
        re.compile(r"No such file or directory: '(?P<path>[^']+)/config\.json'"),
        summary="model config missing at {path}",
        remedy="copy the weights to {path} on the node",
    )
    log = "x\nFileNotFoundError: [Errno 2] No such file or directory: '/srv/m/config.json'\n"
    found = disk(Bundle(Log(log), {"exit": {"code": 1}}, {}))
    # The template's words, then what the bundle says of the launch.
    assert (
        found is not None and found.summary == "model config missing at /srv/m (TP 1, exit code 1)"
    )
    assert found.evidence[0].line == 2 and "/srv/m" in found.remedy
    assert disk(Bundle(Log("all fine"), {}, {})) is None


def test_the_trust_remote_code_signature_from_the_table():
    log = (
        "ValueError: The repository for /srv/models/x contains custom code which must be executed "
        "to correctly load the model.\n"
    )
    found = diagnose(log, {}, {})
    assert found.category == "trust-remote-code" and "--trust-remote-code" in found.remedy


@pytest.mark.parametrize(
    ("pattern", "needle"),
    [
        (r"Load weight end\..*?avail mem=(?P<a>[\d.]+)", ("Load weight end.",)),
        (r"\(?(?P<pid>\d+)\)? - No such process", (" - No such process",)),
        (r"[\]abcdef]+ tail", (" tail",)),
        (r"abcdx? more", (" more",)),
        (r"one thing|another (?:a|b) thing", ("one thing", "another ")),
        (r"one thing|x\d", None),
        (r"(?:TP rank (?P<r>\d+) )?could finish", ("could finish",)),
    ],
)
def test_the_literal_a_pattern_needs_is_read_from_its_source(pattern, needle):
    from nodes.domain.diagnosis.evidence import needles_of

    assert needles_of(re.compile(pattern)) == needle


def test_every_rule_pattern_finds_what_it_found_without_the_literal_shortcut():
    """The shortcut only skips lines that cannot match: on every corpus log, each pattern finds
    the same lines as a plain search of every line."""
    import importlib
    import pkgutil

    import nodes.domain.diagnosis as package
    from nodes.domain.diagnosis.evidence import Log

    patterns = [
        value
        for info in pkgutil.iter_modules(package.__path__)
        for value in vars(importlib.import_module(f"{package.__name__}.{info.name}")).values()
        if isinstance(value, re.Pattern)
    ]
    # A long log of repeated status lines (read through the index of line shapes) with the
    # corpus's lines among them, one decoy of the same shape as a real line but other digits.
    status = [
        f"[2026-12-01 10:00:{i % 60:02d} TP{i % 8}] Decode batch. #token: {i}" for i in range(30000)
    ]
    decoy = "remote=[127.0.0.2]:99999 Gloo connectFullMesh failed"
    logs = {case.name: (case / "launch.log").read_text() for case in case_dirs()}
    for name, text in list(logs.items())[:4]:
        logs[f"{name}+status"] = "\n".join([*status, decoy, text, *status])
    for name, text in logs.items():
        log = Log(text)
        for pattern in patterns:
            plain = [n for n, line in enumerate(log.lines, 1) if pattern.search(line)]
            assert [n for n, _ in log.find(pattern)] == plain, (name, pattern.pattern)


def test_a_gpu_oom_while_serving_is_a_fraction_too_high():
    log = READY + (
        "\n[2026-06-01 10:00:00 TP3] torch.OutOfMemoryError: CUDA out of memory. Tried to "
        "allocate 1.50 GiB. GPU 3 has a total capacity of 79.19 GiB of which 0.91 GiB is free.\n"
    )
    found = diagnose(log, {}, {"mem_fraction_static": 0.92})
    assert found.category == "mem-fraction-too-high" and "1.50 GiB" in found.summary
    assert found.numbers["suggested_mem_fraction_static"] == 0.87
    assert "--mem-fraction-static 0.87" in found.remedy


def test_a_server_killed_while_serving_says_what_is_known_and_stays_unknown():
    facts = {
        "exit": {"code": -9, "signal": "SIGKILL"},
        "snapshots": [
            {
                "phase": "after_failure",
                "gpus": [{"index": 4, "memory_used_bytes": 130 * 2**30}],
                "gpu_processes": [],
            }
        ],
    }
    found = diagnose(READY + "\n", facts, {})
    assert found.category == "unknown" and "killed by SIGKILL while serving" in found.summary
    assert (
        found.secondary_categories == ["leaked-gpu-memory"]
        and "memory stays on GPU 4" in found.summary
    )


OOM_HEAD = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.06 GiB is free. "
)
OOM_TAIL = (
    "Of the allocated memory 46.50 GiB is allocated by PyTorch, and 1.10 GiB is reserved by "
    "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
SELF = "Including non-PyTorch memory, this process has 48.10 GiB memory in use. "


@pytest.mark.parametrize(
    ("text", "pids", "held_gib"),
    [
        # The wording: the other process first, then this one.
        (OOM_HEAD + "Process 4242 has 30.00 GiB memory in use. " + SELF + OOM_TAIL, [4242], 30.0),
        # NVML lists this process first: the order is not fixed.
        (OOM_HEAD + SELF + "Process 4242 has 30.00 GiB memory in use. " + OOM_TAIL, [4242], 30.0),
        # Several other processes, in MiB and GiB.
        (
            OOM_HEAD
            + "Process 4242 has 20.00 GiB memory in use. Process 4243 has 10240.00 MiB memory "
            "in use. " + SELF + OOM_TAIL,
            [4242, 4243],
            30.0,
        ),
        # A small card: capacity and free memory in MiB, torch.cuda's older exception name.
        (
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 "
            "has a total capacity of 23.68 GiB of which 310.56 MiB is free. "
            + SELF.replace("48.10", "12.00")
            + "Process 4242 has 11.30 GiB memory in use. "
            + OOM_TAIL,
            [4242],
            11.3,
        ),
        # PyTorch 2.1 spelled "capacty".
        (
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
            "has a total capacty of 79.15 GiB of which 1.06 GiB is free. "
            + SELF
            + "Process 4242 has 30.00 GiB memory in use. "
            + OOM_TAIL,
            [4242],
            30.0,
        ),
    ],
)
def test_an_oom_with_another_process_listed_on_the_gpu_in_any_order_and_unit(text, pids, held_gib):
    log = "[2026-01-01 00:00:00 TP0] Scheduler hit an exception: Traceback:\n" + text + "\n"
    found = diagnose(log, {}, {})
    assert found.category == "gpu-occupied-by-other-process"
    assert all(f"PID {pid}" in found.summary for pid in pids)
    assert found.numbers["holder_pid"] == pids[0]
    assert found.numbers["others_held_gib"] == held_gib
    assert "this process" not in found.summary  # this launch's own use is not a holder


def test_an_oom_where_only_this_process_holds_memory_is_not_blamed_on_another():
    log = OOM_HEAD + SELF + OOM_TAIL + "\n"
    assert diagnose(log, {}, {}).category != "gpu-occupied-by-other-process"


# PyTorch before 2.1 (c10/cuda/CUDACachingAllocator.cpp): no "Process N has" list, only this
# process's figures; what is neither free nor reserved by it is held outside its PyTorch.
OLD_OOM = (
    "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate {tried} (GPU {gpu}; "
    "{total} total capacity; {allocated} already allocated; {free} free; {reserved} reserved in "
    "total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb "
    "to avoid fragmentation."
)


@pytest.mark.parametrize(
    ("figures", "gpu", "held_gib"),
    [
        # The re-run's wording: 79.15 − 1.00 − 21.00 = 57.15 GiB held by something else.
        (
            {"tried": "2.00 GiB", "total": "79.15 GiB", "allocated": "20.00 GiB",
             "free": "1.00 GiB", "reserved": "21.00 GiB"},
            0,
            57.15,
        ),
        # A small card, free memory in MiB: 23.69 − 0.02 − 3.25 = 20.42 GiB.
        (
            {"tried": "512.00 MiB", "total": "23.69 GiB", "allocated": "3.10 GiB",
             "free": "20.48 MiB", "reserved": "3.25 GiB"},
            1,
            20.42,
        ),
        # Everything in MiB, "0 bytes free".
        (
            {"tried": "20.00 MiB", "total": "16160.00 MiB", "allocated": "2048.00 MiB",
             "free": "0 bytes", "reserved": "2100.00 MiB"},
            2,
            13.73,
        ),
    ],
)  # fmt: skip
def test_an_oom_in_older_pytorch_wording_with_memory_held_outside_this_process(
    figures, gpu, held_gib
):
    log = (
        "[2026-01-01 00:00:00 TP0] Load weight begin. avail mem=20.40 GB\n"
        + OLD_OOM.format(gpu=gpu, **figures)
        + "\n"
    )
    found = diagnose(log, {}, {})
    assert found.category == "gpu-occupied-by-other-process"
    assert found.numbers["others_held_gib"] == held_gib
    assert found.numbers["gpu"] == gpu
    assert states(found.summary, held_gib) and f"GPU {gpu}" in found.summary
    assert "holder_pid" not in found.numbers  # the old wording names no process
    assert "nvidia-smi" in found.remedy


def test_an_oom_in_older_wording_where_this_process_holds_the_card_keeps_its_category():
    figures = {
        "tried": "2.00 GiB", "total": "79.15 GiB", "allocated": "74.00 GiB",
        "free": "1.00 GiB", "reserved": "76.50 GiB",
    }  # fmt: skip
    served = READY + "\n[2026-06-01 10:00:00 TP0] " + OLD_OOM.format(gpu=0, **figures) + "\n"
    found = diagnose(served, {}, {"mem_fraction_static": 0.92})
    assert found.category == "mem-fraction-too-high"  # 1.65 GiB outside PyTorch: its own
    graph = (
        "[2026-02-07 06:03:00 TP0] Exception: Capture cuda graph failed: "
        + OLD_OOM.format(gpu=0, **figures).split(": ", 1)[1]
        + "\n"
    )
    assert diagnose(graph, {}, {"mem_fraction_static": 0.9}).category == "gpu-oom-cuda-graph"


def _beside_another(**where: object) -> tuple[str, dict]:
    """The issue-17 experiment without the ledger: two llama-3-70b launches at TP 4 with
    ``--hicache-size 105`` on GPUs 0–3 and 4–7 of one 449 GB node. Each passed alone against
    433.8 GB available; this one pinned its pools second and the kernel OOM-killed a rank.
    ``where`` says the other launch: ``extra`` (the panel's facts) and/or ``notes``."""
    log = "\n".join(
        [
            "[2026-12-01 10:00:00] server_args=ServerArgs(model_path='/srv/models/llama-3-70b', "
            "tp_size=4, enable_hierarchical_cache=True, hicache_size=105, ...)",
            *(
                f"[2026-12-01 10:04:00 TP{r}] Allocating 105.00 GB host memory for hierarchical "
                "KV cache."
                for r in range(4)
            ),
        ]
    )
    after: dict = {
        "phase": "after_failure",
        "kernel_log": ["Out of memory: Killed process 4242 (sglang::schedul) total-vm:1kB"],
        "notes": list(cast(list[str], where.get("notes") or [])),
    }
    facts = {
        "node": {"name": "gpu-01", "host_ram_bytes": 449 * 10**9,
                 "gpus": [{"index": i, "memory_total_bytes": 96 * 2**30} for i in range(8)]},
        "command": ["python3", "-m", "sglang.launch_server", "--tp-size", "4",
                    "--enable-hierarchical-cache", "--hicache-size", "105"],
        "env": {"CUDA_VISIBLE_DEVICES": "4,5,6,7"},
        "snapshots": [
            {"phase": "before_launch", "meminfo": {"MemAvailable": 433_800_000_000}}, after
        ],
        "extra": {k: v for k, v in where.items() if k != "notes"},
    }  # fmt: skip
    return log, facts


@pytest.mark.parametrize(
    "where",
    [
        {
            "other_launches_on_node": [
                {"label": "#12 (llama@1)", "host_bytes": 420 * 10**9, "pinned": True}
            ]
        },  # fmt: skip
        {
            "notes": [
                "other launches on the node with host memory committed: "
                "#12 (llama@1) 420 GB (pinned)"
            ]
        },  # fmt: skip
    ],
    ids=["panel-facts", "plain-words"],
)
def test_a_host_oom_beside_another_launch_names_it_and_its_share(where):
    log, facts = _beside_another(**where)
    found = diagnose(log, facts, {"tp_size": 4, "hicache_size": 105})
    assert found.category == "host-oom-hicache"
    assert "#12 (llama@1)" in found.summary and "420" in found.summary, found.summary
    assert "840" in found.summary and "449" in found.summary, found.summary
    assert "GPU share" not in found.summary, found.summary
    assert found.numbers["other_launches_gb"] == 420
    assert found.numbers["node_aggregate_gb"] == 840
    # What fits beside the other launch: (449 − 10.74 − 420) / 4 ranks → 4 GB per rank.
    assert found.numbers["suggested_hicache_size_gb"] == 4
    assert "#12 (llama@1)" in found.remedy, found.remedy


def test_a_host_oom_with_no_other_launch_said_keeps_the_gpu_share():
    log, facts = _beside_another()
    found = diagnose(log, facts, {"tp_size": 4, "hicache_size": 105})
    assert found.category == "host-oom-hicache"
    assert "other_launches_gb" not in found.numbers


def test_a_figure_that_cannot_be_read_still_names_the_failure_and_says_so():
    """Evidence first: the capture OOM's line shows the failure even when one of its sizes is
    garbled; the rule cannot compute its arithmetic, and says which figure it could not read."""
    log = (
        "[2026-01-01 00:08:43 TP0] Capture cuda graph begin. This can take up to several minutes.\n"
        "[2026-01-01 00:08:51 TP0] Exception: Capture cuda graph failed: CUDA out of memory. "
        "Tried to allocate 1.2.3 GiB. GPU 0 has a total capacity of 95.00 GiB of which 1.12 GiB "
        "is free.\n"
    )
    found = diagnose(log, {}, {"mem_fraction_static": 0.95})
    assert found.category == "gpu-oom-cuda-graph", found.summary
    assert "could not be read" in found.summary and "1.2.3" in found.summary
    assert found.evidence[0].line == 2
