"""The memory budget engine: the incident, its fix, the failure cases, versions, geometry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.domain.budget import Neighbour, NodeMemory, check
from nodes.domain.geometry import from_config, kv_bytes_per_token
from nodes.domain.sglang_flags import parse_command, split_command, table_for
from nodes.flag_tables import table

GB, GiB = 10**9, 2**30
CASES = Path(__file__).resolve().parents[1] / "fixtures" / "cases"
KIMI = {
    "num_hidden_layers": 61,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "hidden_size": 7168,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
}
LLAMA_70B = {
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_size": 8192,
    "head_dim": 128,
}
INCIDENT = (
    "python3 -m sglang.launch_server --model-path /m --tp-size 8 --mem-fraction-static 0.93 "
    "--enable-hierarchical-cache --hicache-size 300"
)
NODE = NodeMemory((96 * GiB,) * 8, 449 * GB, mem_available_bytes=408 * GB)


def run(command: str, node: NodeMemory = NODE, version: str = "0.5.9", **kwargs: Any):
    argv, env = split_command(command)
    parsed = parse_command(argv, table(version))
    parsed.env = env
    return check(parsed, node, version=version, **kwargs)


def codes(report) -> set[str]:
    return {m.code for m in report.messages}


def text(report) -> str:
    return "\n".join([*report.lines, *(m.text for m in report.messages)])


def test_the_incident_is_blocked_with_the_arithmetic_and_both_fixes():
    report = run(INCIDENT, geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert report.verdict == "block" and "host_oom" in codes(report)
    assert report.ranks_per_node == 8
    assert report.host_pool_bytes_per_rank == 300 * GB // 70_272 * 70_272 + 70_272
    assert "8 × 300 GB = 2400 GB of pinned host memory" in text(report)
    assert "449 GB node" in text(report)
    assert "that is 37 GB per rank (300 GB ÷ 8 ranks)" in text(report)
    assert "At most 49 GB per rank fits the host budget" in text(report)
    assert report.suggestion == {"--hicache-size": 37}
    assert report.suggestion_verdict == "warn"
    assert "Suggested change: --hicache-size 37 (this check passes it: warn)" in text(report)


def test_the_corrected_incident_passes():
    report = run(INCIDENT.replace("300", "37"), geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert report.verdict in ("ok", "warn") and "host_oom" not in codes(report)
    assert report.host_pool_bytes_per_node < report.host_budget_bytes


def test_without_geometry_the_size_path_still_judges_the_host():
    report = run(INCIDENT)
    assert report.verdict == "block" and report.device_kv_tokens_per_rank is None


@pytest.mark.parametrize(
    ("case", "verdict", "code"),
    [
        ("S01", "block", "host_oom"),  # the incident as a case bundle
        ("C05", "block", "host_oom"),  # one rank: 40 GB vs 44.87 GB free − 10 GiB
        ("C02", "warn", "pinned_share"),  # 4 × 150 GB = 600 GB of 754 GB pinned
        ("C01", "warn", "host_unknown"),  # ratio path, but no RAM or geometry in the facts
        ("C04", "warn", "host_unknown"),  # no GPU sizes or weights: cannot judge the host pool
    ],
)
def test_case_bundles(case, verdict, code):
    facts = json.loads((CASES / case / "facts.json").read_text())
    node = facts["node"]
    snapshot: dict[str, int] = next(
        (s["meminfo"] for s in facts.get("snapshots", []) if s.get("meminfo")), {}
    )
    memory = NodeMemory(
        tuple(g["memory_total_bytes"] for g in node.get("gpus") or [] if g["memory_total_bytes"])
        or (80 * GiB,) * 8,
        node.get("host_ram_bytes"),
        mem_available_bytes=snapshot.get("MemAvailable"),
    )
    config = facts.get("model_config")
    geometry = from_config(config) if config else None
    report = run(
        " ".join(facts["command"]),
        memory,
        facts.get("engine_version") or "0.5.9",
        geometry=geometry,
        weights_bytes=facts.get("model_weights_bytes"),
    )
    assert report.verdict == verdict, text(report)
    assert code in codes(report)


def test_c05_states_the_shortfall():
    facts = json.loads((CASES / "C05" / "facts.json").read_text())
    memory = NodeMemory((80 * GiB,), 64 * GB, mem_available_bytes=44_870_000_000)
    report = run(" ".join(facts["command"]), memory)
    assert "1 × 40 GB = 40 GB of pinned host memory against a budget of 34.13 GB" in text(report)


@pytest.mark.parametrize(
    ("config", "tp", "pp", "dtype", "expected"),
    [
        (KIMI, 8, 1, "auto", 70_272),  # MLA: the same on every rank
        (KIMI, 1, 1, "auto", 70_272),
        (LLAMA_70B, 8, 1, "auto", 40_960),  # GQA: sharded by KV heads
        (LLAMA_70B, 16, 1, "auto", 40_960),  # TP > KV heads: heads replicated
        (LLAMA_70B, 8, 2, "auto", 20_480),  # pp splits the layers
        (LLAMA_70B, 8, 1, "fp8_e4m3", 20_480),  # fp8 KV halves it
    ],
)
def test_kv_bytes_per_token(config, tp, pp, dtype, expected):
    from nodes.domain.geometry import kv_elem_bytes

    geometry = from_config(config)
    assert kv_bytes_per_token(geometry, tp, pp, kv_elem_bytes(dtype)) == expected


def test_ratio_path_uses_the_default_ratio_and_the_device_pool():
    report = run(
        "--model-path /m --tp-size 8 --enable-hierarchical-cache",
        geometry=from_config(LLAMA_70B),
        weights_bytes=141 * GB,
    )
    assert report.host_pool_bytes_per_rank == 2 * report.device_kv_bytes_per_rank
    assert "ratio 2.0" in text(report)


def test_non_integer_hicache_size_is_refused_as_sglang_refuses_it():
    report = run(INCIDENT.replace("300", "37.5"))
    assert report.verdict == "block"
    assert "argument --hicache-size: invalid int value: '37.5'" in text(report)


@pytest.mark.parametrize(
    ("version", "flag", "expected"),
    [
        ("0.5.23", "--cuda-graph-max-bs 64", "ambiguous option: --cuda-graph-max-bs could match"),
        ("0.5.23", "--disable-hicache-numa-detect", "use nothing (removed)"),
        ("0.5.9", "--enable-ep-moe", "use --ep-size"),
        ("0.5.9", "--no-such-flag 1", "--no-such-flag is not a flag of SGLang 0.5.9"),
    ],
)
def test_flags_unknown_or_renamed_for_the_version(version, flag, expected):
    report = run(f"--model-path /m {flag}", version=version)
    assert report.verdict == "block" and expected in text(report)


def test_abbreviations_resolve_as_sglang_resolves_them():
    argv, _ = split_command("--model-path /m --tp 8")
    parsed = parse_command(argv, table("0.5.9"))
    assert parsed.get("tp_size", "tensor_parallel_size") == 8 and not parsed.issues


def test_cuda_visible_devices_limits_the_gpus():
    report = run(
        "CUDA_VISIBLE_DEVICES=0,1,2,3 python3 -m sglang.launch_server --model-path /m --tp-size 8"
    )
    assert report.verdict == "block" and "too_many_ranks" in codes(report)


def test_table_for_picks_the_newest_not_newer():
    assert table_for("0.5.19") == "0.5.9" and table_for("0.5.23") == "0.5.23"
    assert table_for("0.4.0") == "0.4.10.post2" and table_for("0.6.0") == "0.5.23"


@pytest.mark.parametrize(
    ("command", "code"),
    [
        ("--model-path /m --tp-size 16", "too_many_ranks"),
        ("--model-path /m --tp-size 3", "tp_heads"),
        ("--model-path /m --enable-hierarchical-cache --disable-radix-cache", "flag_invalid"),
        ("--model-path /m --tp-size 8 --mem-fraction-static 0.6", "no_kv_room"),
    ],
)
def test_profiles_the_node_cannot_run_are_blocked(command, code):
    report = run(command, geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert report.verdict == "block" and code in codes(report)


def test_old_versions_need_a_host_pool_larger_than_the_device_pool():
    report = run(
        "--model-path /m --tp-size 8 --enable-hierarchical-cache --hicache-size 5",
        geometry=from_config(KIMI),
        weights_bytes=544 * GB,
    )
    assert "host_not_larger" in codes(report)
    newer = run(
        "--model-path /m --tp-size 8 --enable-hierarchical-cache --hicache-size 5",
        version="0.5.23",
        geometry=from_config(KIMI),
        weights_bytes=544 * GB,
    )
    assert "host_not_larger" not in codes(newer) and "per_rank_check" not in codes(newer)


@settings(max_examples=60, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    size=st.integers(min_value=1, max_value=400),
    ram_gb=st.integers(min_value=16, max_value=4000),
)
def test_never_ok_when_the_node_total_exceeds_host_ram(tp, size, ram_gb):
    node = NodeMemory((96 * GiB,) * 8, ram_gb * GB)
    report = run(
        f"--model-path /m --tp-size {tp} --enable-hierarchical-cache --hicache-size {size}", node
    )
    if tp * size * GB > ram_gb * GB:
        assert report.verdict == "block"


@settings(max_examples=40, deadline=None)
@given(size=st.integers(min_value=1, max_value=200), ratio=st.floats(min_value=1.1, max_value=4))
def test_node_total_is_monotone_in_tp_size_and_ratio(size, ratio):
    def total(tp: int, command: str) -> int:
        report = run(
            f"--model-path /m --tp-size {tp} --enable-hierarchical-cache {command}",
            geometry=from_config(LLAMA_70B),
            weights_bytes=141 * GB,
        )
        return report.host_pool_bytes_per_node or 0

    assert total(2, f"--hicache-size {size}") <= total(4, f"--hicache-size {size}")
    assert total(8, f"--hicache-size {size}") <= total(8, f"--hicache-size {size + 1}")
    assert total(8, f"--hicache-ratio {ratio}") <= total(8, f"--hicache-ratio {ratio + 0.5}")


@pytest.mark.parametrize(
    "command",
    [
        "--model-path /m --tp-size 8 garbage positional",
        "--model-path /m -tp 8",
        "--model-path /m --enable-hierarchical-cache --hicache-ratio 0",
        "--model-path /m --enable-hierarchical-cache --hicache-size 300 --cpu-offload-gb -2000",
        "--model-path /m --mem-fraction-static 5",
        "--model-path /m --max-total-tokens -5",
        "--model-path /m --tp-size 8 --gpu-id-step 0",
        "--model-path /m --base-gpu-id -4",
        "CUDA_VISIBLE_DEVICES=0,1,9,10 python3 -m sglang.launch_server --model-path /m --tp-size 4",
        "env CUDA_VISIBLE_DEVICES=0,1 python3 -m sglang.launch_server --model-path /m --tp-size 4",
        "--model-path /m --enable-hierarchical-cache --hicache-size " + "9" * 30,
    ],
)
def test_values_sglang_or_the_node_cannot_run_are_blocked(command):
    assert run(command, geometry=from_config(LLAMA_70B), weights_bytes=141 * GB).verdict == "block"


def test_a_served_model_name_of_serve_is_not_a_launcher():
    report = run("--model-path /m --served-model-name serve --tp-size 8")
    assert "--model-path is required" not in text(report)


def test_autosize_with_no_host_memory_left_is_blocked():
    node = NodeMemory((96 * GiB,) * 8, 449 * GB, mem_available_bytes=5 * GB)
    report = run("--model-path /m --tp-size 8 --enable-hierarchical-cache", node, "0.5.23")
    assert report.verdict == "block" and "No host memory is left for HiCache" in text(report)


def test_offload_alone_suggests_an_offload_size():
    report = run("--model-path /m --tp-size 8 --cpu-offload-gb 100")
    assert report.verdict == "block" and report.suggestion == {"--cpu-offload-gb": 49}


@pytest.mark.parametrize(
    "config",
    [
        [],
        {
            "num_hidden_layers": -80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "head_dim": 128,
        },
        {
            "num_hidden_layers": 80,
            "num_attention_heads": 0,
            "num_key_value_heads": 0,
            "hidden_size": 8192,
        },
        {"num_hidden_layers": "abc", "num_attention_heads": 8, "head_dim": 8},
        {"num_hidden_layers": 1e400, "num_attention_heads": 8, "head_dim": 8},
    ],
)
def test_unusable_configs_are_a_geometry_error(config):
    from nodes.domain.geometry import GeometryError

    with pytest.raises(GeometryError):
        from_config(config)


@pytest.mark.parametrize(
    "args",
    [
        ["--api", "S3"],
        ["--api-k=S3"],
        ["--admin-api", "S3"],
        ["--ssl-keyfile-password", "S3"],
        ["--api-key-=S3"],
        ["--api-key", "S3"],
    ],
)
def test_secrets_are_masked_whatever_the_spelling(args):
    from nodes.domain.redact import redact_args

    assert "S3" not in " ".join(redact_args(["--model-path", "/m", *args]))


def test_on_big_gpus_the_fix_also_shrinks_the_device_pool_for_old_versions():
    # The demo's 141 GiB GPUs: Kimi-K2's device pool per rank outgrows any host pool that fits.
    node = NodeMemory((141 * GiB,) * 8, 449 * GB, mem_available_bytes=444 * GB)
    report = run(INCIDENT, node, geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert report.verdict == "block"
    size, mfs = report.suggestion["--hicache-size"], report.suggestion["--mem-fraction-static"]
    fixed = INCIDENT.replace("--hicache-size 300", f"--hicache-size {size}").replace(
        "--mem-fraction-static 0.93", f"--mem-fraction-static {mfs}"
    )
    again = run(fixed, node, geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert again.verdict != "block", text(again)


def test_when_a_larger_size_fits_it_is_the_suggestion():
    node = NodeMemory((96 * GiB,) * 8, 2000 * GB)
    command = INCIDENT.replace("--hicache-size 300", "--hicache-size 5")
    report = run(command, node, geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert "host_not_larger" in codes(report)
    size = report.suggestion["--hicache-size"]
    fixed = run(
        command.replace("--hicache-size 5", f"--hicache-size {size}"),
        node,
        geometry=from_config(KIMI),
        weights_bytes=544 * GB,
    )
    assert fixed.verdict != "block", text(fixed)


def test_a_size_without_the_cache_flag_is_pointed_out():
    report = run("--model-path /m --hicache-size 40")
    assert "hicache_ignored" in codes(report)


def test_a_busy_gpu_elsewhere_on_the_node_does_not_shrink_a_smaller_launch():
    busy = NodeMemory(
        (96 * GiB,) * 8, 449 * GB, gpu_used_bytes=(0, 0, 0, 0, 0, 0, 80 * GiB, 80 * GiB)
    )
    command = "python3 -m sglang.launch_server --model-path /m --tp-size 2"
    model: dict[str, Any] = {"geometry": from_config(LLAMA_70B), "weights_bytes": 141 * GB}
    assert run(command, busy, **model).verdict == run(command, NODE, **model).verdict == "ok"
    assert "− 0 GiB used" in text(run(command, busy, **model))
    assert "− 80 GiB used" in text(run(command.replace("2", "8"), busy, **model))


def test_other_launches_on_the_node_count_and_are_named():
    """The issue's experiment: two llama-3-70b launches at TP 4 with 105 GB per rank on one
    449 GB node, the first committed and not yet pinned: the second does not fit beside it."""
    flags = parse_command(
        split_command(
            "python3 -m sglang.launch_server --model-path /m --tp-size 4 "
            "--enable-hierarchical-cache --hicache-size 105"
        )[0],
        table("0.5.9"),
    )
    alone = NodeMemory((96 * GiB,) * 4, 449 * GB, mem_available_bytes=440 * GB)
    assert check(flags, alone, version="0.5.9").verdict != "block"
    first = Neighbour("#12 (llama@1)", 420 * GB, pinned=False)
    beside = replace(alone, neighbours=(first,))
    report = check(flags, beside, version="0.5.9")
    assert report.verdict == "block"
    assert any("#12 (llama@1)" in line and "not yet pinned" in line for line in report.lines)
    assert any("beside launch #12 (llama@1) (420 GB)" in m.text for m in report.messages)
    assert any("420 GB for launch #12 (llama@1), not yet pinned" in line for line in report.lines)
    # Once the first has pinned its pool, MemAvailable already counts it: not counted twice.
    pinned = replace(alone, mem_available_bytes=20 * GB, neighbours=(replace(first, pinned=True),))
    assert check(flags, pinned, version="0.5.9").host_budget_bytes == max(0, 20 * GB - 10 * GiB)


def test_with_no_host_pool_that_fits_the_suggestion_runs_without_hicache():
    """Beside another launch's 420 GB no --hicache-size fits; 0 would mean "size it by the
    ratio" to SGLang, so the change drops the hierarchical cache, and that passes."""
    node = replace(NODE, neighbours=(Neighbour("#12 (llama@1)", 420 * GB),))
    command = INCIDENT.replace("--tp-size 8", "--tp-size 4").replace("300", "105")
    report = run(command, node, geometry=from_config(LLAMA_70B), weights_bytes=141 * GB)
    assert report.verdict == "block" and "host_oom" in codes(report)
    assert report.suggestion == {"--enable-hierarchical-cache": None, "--hicache-size": None}
    assert "No host pool fits the host budget" in text(report)
    without = command.split(" --enable-hierarchical-cache")[0]
    assert run(without, node, geometry=from_config(LLAMA_70B), weights_bytes=141 * GB).verdict in (
        "ok",
        "warn",
    )


def test_every_suggested_change_says_what_it_costs_and_dropping_hicache_is_offered():
    """Found by a newcomer: the fix cut the device pool by ~40 % without a sentence saying
    so, and nothing offered turning hierarchical cache off (keeping 0.93) instead."""
    h200 = NodeMemory((141 * GiB,) * 8, 449 * GB, mem_available_bytes=440 * GB)
    report = run(INCIDENT, h200, geometry=from_config(KIMI), weights_bytes=544 * GB)
    assert report.verdict == "block" and report.suggestion
    priced = report.suggestion_cost
    assert priced is not None and priced["kv_tokens_before"] == report.device_kv_tokens_per_rank
    before, after = priced["kv_tokens_before"], priced["kv_tokens_after"]
    assert before and after and after != before
    assert priced["requests_before"] == before // 4096
    assert f"from {before:,} to {after:,} tokens per rank" in priced["text"]
    assert "It shrinks the device KV pool" in priced["text"]
    assert "requests of 4,096 tokens at once" in priced["text"]
    assert priced["text"] in text(report)
    # The alternative: remove HiCache and keep the fraction (and with it the whole pool).
    (drop,) = report.alternatives
    assert drop["change"] == {"--enable-hierarchical-cache": None, "--hicache-size": None}
    assert drop["verdict"] != "block" and drop["kv_tokens_per_rank"] == before
    assert drop["text"].startswith(
        "Or remove HiCache (drop --enable-hierarchical-cache and --hicache-size)"
    )
    assert f"It keeps the device KV pool at {before:,} tokens per rank" in drop["text"]
    assert drop["text"] in text(report)


def test_a_pool_it_cannot_size_says_its_cost_is_unavailable_not_a_number():
    report = run(INCIDENT)  # no geometry: the device pool cannot be sized
    assert report.suggestion
    assert report.suggestion_cost["kv_tokens_after"] is None
    assert "unavailable" in report.suggestion_cost["text"]


def test_without_hicache_nothing_is_offered_to_drop():
    report = run(
        "python3 -m sglang.launch_server --model-path /m --tp-size 8 --mem-fraction-static 0.99",
        geometry=from_config(KIMI),
        weights_bytes=544 * GB,
    )
    assert report.alternatives == []
