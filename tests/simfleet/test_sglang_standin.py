"""The SGLang stand-in on simulated nodes: the incident, its fix, and failures that emerge from
the memory arithmetic (shared/reference/sglang.md §2–§6)."""

from __future__ import annotations

import re

import pytest

from tests.fleet import wait_until

KIMI = "/srv/models/kimi-k2"
INCIDENT = (
    f"--model-path {KIMI} --tp-size 8 --mem-fraction-static 0.93 "
    "--enable-hierarchical-cache --hicache-size 300 --trust-remote-code"
)


def start(node, flags: str, log: str = "/root/server.log", env: str = "") -> None:
    node.ok(
        f"cd /root; {env} setsid python3 -m sglang.launch_server {flags} "
        f"> {log} 2>&1 < /dev/null & echo started"
    )


def health(node, port: int = 30000) -> str:
    """The HTTP status of /health, or "000" when nothing listens (curl's convention)."""
    _, out, _ = node.run(f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{port}/health")
    return str(out)


def log_of(node, log: str = "/root/server.log") -> str:
    return str(node.ok(f"cat {log}"))


@pytest.fixture
def fresh(sim_fleet):
    """A node with nothing running and nothing leaked."""

    def get(name: str):
        node = sim_fleet[name]
        node.reboot()
        return node

    return get


def test_incident_pins_300_gb_in_every_rank_and_never_becomes_ready(fresh):
    node = fresh("incident")
    start(node, INCIDENT)
    assert wait_until(lambda: "Out of memory: Killed process" in node.ok("dmesg"), 30)
    text = wait_until(
        lambda: (t := log_of(node)).count("Allocating 300.00 GB host memory") == 8 and t, 20
    )
    assert text, log_of(node)
    assert (
        re.findall(
            r"\[[\d\- :]+ TP(\d)\] Allocating 300\.00 GB host memory for hierarchical "
            r"KV cache\.",
            text,
        ).__len__()
        == 8
    )
    kills = node.ok("dmesg | grep 'Out of memory: Killed process'").splitlines()
    assert all("(sglang::schedul)" in line for line in kills)
    defunct = wait_until(
        lambda: node.ok("ps -eo stat=,comm= | awk '$1 ~ /^Z/ {print $2}'").split(), 10
    )
    assert defunct and set(defunct) == {"sglang::schedul"}
    assert health(node) == "000"  # nothing listens: the server hangs before serving
    assert "fired up and ready" not in log_of(node)
    # The surviving rank still holds its pool: the node is nearly out of RAM.
    used = int(node.ok("free -b").splitlines()[1].split()[2])
    assert used > 300 * 10**9


def test_per_rank_size_that_fits_becomes_ready(fresh):
    node = fresh("incident")
    start(node, INCIDENT.replace("--hicache-size 300", "--hicache-size 37"))
    assert wait_until(lambda: health(node) == "200", 40), log_of(node)
    text = log_of(node)
    assert text.count("Allocating 37.00 GB host memory for hierarchical KV cache.") == 8
    assert "The server is fired up and ready to roll!" in text
    assert "Out of memory" not in node.ok("dmesg")
    titles = node.ok("ps -eo args=").splitlines()
    assert sum(t.startswith("sglang::scheduler_TP") for t in titles) == 8
    assert "sglang::detokenizer" in titles
    info = node.ok("curl -s http://127.0.0.1:30000/get_server_info")
    assert '"hicache_size": 37' in info and '"tp_size": 8' in info
    assert '"max_total_num_tokens"' in node.ok("curl -s http://127.0.0.1:30000/server_info")
    assert node.ok("curl -s http://127.0.0.1:30000/v1/models").count(KIMI) >= 1
    apps = node.ok(
        "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits"
    ).splitlines()
    assert len(apps) == 8 and all("sglang::scheduler_TP" in a for a in apps)
    assert "sglang::schedul" in node.ok("fuser -v /dev/nvidia3 2>&1")
    pinned = int(node.ok("free -b").splitlines()[1].split()[2])
    assert pinned >= 8 * 37 * 10**9
    node.ok("pkill -TERM -f '^sglang::http_server'")
    assert wait_until(lambda: "sglang" not in node.ok("ps -eo args="), 15)
    assert int(node.ok("free -b").splitlines()[1].split()[2]) < 10 * 10**9


def test_newer_sglang_splits_the_host_budget_and_fails_fast(fresh):
    node = fresh("modern")
    start(node, INCIDENT)
    assert wait_until(lambda: "sglang" not in node.ok("ps -eo args="), 40), log_of(node)
    text = log_of(node)
    assert "Not enough host memory available. Requesting 300.00 GB but only have" in text
    assert "Scheduler hit an exception" in text
    assert "Received sigquit from a child process" in text
    assert "Allocating" not in text
    assert "Out of memory" not in node.ok("dmesg")


@pytest.mark.parametrize(
    ("flags", "expected", "code"),
    [
        ("--model-path /srv/models/nope", "is not a local folder and is not a valid model", 1),
        (
            f"--model-path {KIMI} --tp-size 8 --no-such-flag",
            "unrecognized arguments: --no-such-flag",
            2,
        ),
        (
            f"--model-path {KIMI} --hicache-size 37.5",
            "argument --hicache-size: invalid int value: '37.5'",
            2,
        ),
    ],
)
def test_bad_launches_fail_with_sglangs_words(sim_fleet, flags, expected, code):
    node = sim_fleet["spare"]
    status, _, err = node.run(f"python3 -m sglang.launch_server {flags}")
    assert status == code
    assert expected in err


def test_renamed_flag_is_ambiguous_on_new_versions(sim_fleet):
    status, _, err = sim_fleet["modern"].run(
        f"python3 -m sglang.launch_server --model-path {KIMI} --cuda-graph-max-bs 64"
    )
    assert status == 2
    assert (
        "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill" in err
    )


def _fails_with(node, flags: str, expected: str) -> str:
    start(node, flags)
    assert wait_until(lambda: "sglang" not in node.ok("ps -eo args="), 40), log_of(node)
    text = log_of(node)
    assert expected in text, text[-3000:]
    return text


def test_weights_bigger_than_the_gpu_are_a_cuda_oom_at_load(fresh):
    node = fresh("spare")
    text = _fails_with(
        node,
        "--model-path /srv/models/llama-3-70b --tp-size 1",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
    )
    assert text.index("Load weight begin") < text.index("OutOfMemoryError")


def test_weights_leaving_no_kv_room_ask_for_more_mem_fraction(fresh):
    node = fresh("incident")
    _fails_with(
        node,
        f"--model-path {KIMI} --tp-size 8 --mem-fraction-static 0.6",
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
    )


def test_busy_port_is_the_bind_error(fresh):
    node = fresh("spare")
    node.ok("setsid python3 -m http.server 30000 --bind 127.0.0.1 > /dev/null 2>&1 < /dev/null &")
    wait_until(lambda: health(node) != "000", 5)
    _fails_with(
        node,
        "--model-path /srv/models/qwen2.5-7b",
        "error while attempting to bind on address ('127.0.0.1', 30000): address already in use",
    )


def test_gpus_already_holding_memory_are_unbalanced(fresh):
    node = fresh("spare")
    from tests.fleet import simfleet

    simfleet("hold", "spare", "--gpu", "1", "--memory", "30GiB", "--state", node.state)
    apps = node.ok("nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits")
    assert apps.strip().endswith(", 30720")
    _fails_with(
        node,
        "--model-path /srv/models/qwen2.5-7b --tp-size 2",
        "The memory capacity is unbalanced. Some GPUs may be occupied by other processes.",
    )
    simfleet("release", "spare", "--state", node.state)
    assert node.ok("nvidia-smi --query-compute-apps=pid --format=csv,noheader").strip() == ""


def test_version_reported_to_python(sim_fleet):
    version = "python3 -c 'import sglang; print(sglang.__version__)'"
    assert sim_fleet["incident"].ok(version).strip() == "0.5.9"
    assert sim_fleet["modern"].ok(version).strip() == "0.5.23"


def test_chatter_is_in_sglangs_words_and_stamped_only_when_a_reader_asks(fresh):
    """``SGLANG_STANDIN_CHATTER`` plays decode-batch lines as SGLang prints them (the engine's
    line); the write times and the closing count are added only with ``..._STAMPS=1`` (a
    benchmark measuring delays), so what a demo or a test reads is SGLang's format."""
    node = fresh("spare")
    decode = re.compile(
        r"\] Decode batch, #running-req: 1, #token: (\d+), token usage: 0\.01, cuda graph: True, "
        r"gen throughput \(token/s\): 50\.00, #queue-req: 0, $"
    )
    chatter = "SGLANG_STANDIN_CHATTER=50 SGLANG_STANDIN_CHATTER_SECONDS=1"
    start(node, "--model-path /srv/models/qwen2.5-7b --tp-size 2", env=chatter)
    text = wait_until(lambda: (t := log_of(node)).count("Decode batch,") >= 10 and t, 40)
    assert text, log_of(node)
    lines = [line for line in text.splitlines() if "Decode batch" in line]
    assert all(decode.search(line) for line in lines), lines[:3]
    assert "written_ns" not in text and "batches done" not in text
    node.ok("pkill -f '^sglang::' ; true")
    node.reboot()
    start(node, "--model-path /srv/models/qwen2.5-7b --tp-size 2",
          env=f"{chatter} SGLANG_STANDIN_CHATTER_STAMPS=1")  # fmt: skip
    text = wait_until(lambda: "Decode batches done:" in (t := log_of(node)) and t, 40)
    assert text and re.search(r"#queue-req: 0, written_ns=\d+$", text, re.MULTILINE)
