"""What a profile's command may hold: TCP ports only, the interpreter options that cannot run
code, and SGLang versions ordered as pip orders them (pre-, post-, dev and local releases)."""

from __future__ import annotations

import pytest
from packaging.version import Version

from nodes.domain.budget import NodeMemory, check
from nodes.domain.sglang_flags import (
    VERSION_TEXT,
    is_port_flag,
    parse_command,
    sglang_version,
    split_command,
    table_for,
)
from nodes.flag_tables import _tables, table

GB, GiB = 10**9, 2**30


def issues(version: str, flags: str) -> list[str]:
    parsed = parse_command(["--model-path", "/m", *flags.split()], table(version))
    return [i.message for i in parsed.issues if i.code == "invalid"]


@pytest.mark.parametrize(
    ("version", "flags", "message"),
    [
        ("0.5.9", "--port 70000", "--port 70000 is not a TCP port (1–65535)"),
        ("0.5.9", "--port 0", "--port 0 is not a TCP port"),
        ("0.5.9", "--port -1", "--port -1 is not a TCP port"),
        ("0.5.9", "--port=65536", "--port 65536 is not a TCP port"),
        ("0.5.9", "--nccl-port 70000", "--nccl-port 70000 is not a TCP port"),
        ("0.4.10.post2", "--disaggregation-bootstrap-port 0", "--disaggregation-bootstrap-port 0"),
        ("0.5.23", "--grpc-port 99999", "--grpc-port 99999 is not a TCP port"),
        (
            "0.5.23",
            "--remote-instance-weight-loader-send-weights-group-ports [8000,70000]",
            "--remote-instance-weight-loader-send-weights-group-ports 70000 is not a TCP port",
        ),
    ],
)
def test_a_port_no_server_can_listen_on_is_refused_by_the_parser(version, flags, message):
    found = issues(version, flags)
    assert found and found[0].startswith(message)


@pytest.mark.parametrize(
    ("version", "flags", "message"),
    [
        ("0.5.9", "--dist-init-addr 127.0.0.1:70000", "port 70000 is not a TCP port"),
        ("0.5.9", "--nccl-init-addr 127.0.0.1:0", "port 0 is not a TCP port"),
        ("0.5.2", "--dist-init-addr=[::1]:-5", "port -5 is not a TCP port"),
        ("0.4.10.post2", "--dist-init-addr node0:65536", "port 65536 is not a TCP port"),
        ("0.5.23", "--dist-init-addr 10.0.0.1:99999", "port 99999 is not a TCP port"),
    ],
)
def test_a_port_inside_an_address_flag_is_checked(version, flags, message):
    found = issues(version, flags)
    assert found and message in found[0] and found[0].startswith("--dist-init-addr")


@pytest.mark.parametrize(
    "address", ["localhost:0x50", "127.0.0.1:", "127.0.0.1", "127.0.0.1:80:90", "127.0.0.1:8O"]
)
def test_an_address_without_a_readable_port_is_refused(address):
    found = issues("0.5.9", f"--dist-init-addr {address}")
    assert found and "is not HOST:PORT" in found[0], found


@pytest.mark.parametrize(
    ("version", "flags", "top"),
    [
        # The re-run's case: ZMQ ports from 65535 + 233 on, past 65535.
        ("0.5.9", "--port 65535 --enable-dp-attention --dp-size 2 --tp-size 2", 65535 + 233 + 6),
        ("0.5.2", "--port 65300 --enable-dp-attention --dp-size 4 --tp-size 4", 65300 + 233 + 8),
        ("0.5.23", "--port 65400 --attn-dp-size 2 --tp-size 2", 65400 + 233 + 6),
        (
            "0.5.9",
            "--dist-init-addr 10.0.0.1:65533 --enable-dp-attention --dp-size 2 --tp-size 2",
            65533 + 6,
        ),
    ],
)
def test_ports_sglang_derives_past_65535_are_refused_at_save(version, flags, top):
    found = issues(version, flags)
    assert found and f"= {top}, beyond 65535" in found[0]


@pytest.mark.parametrize(
    "flags",
    [
        "--port 1", "--port 65535", "--nccl-port 29500", "",
        "--dist-init-addr 10.0.0.1:5000", "--dist-init-addr [fe80::1]:5000",
        "--port 65290 --enable-dp-attention --dp-size 2 --tp-size 2",  # tops at 65529
        "--port 65535 --dp-size 2 --tp-size 2",  # replicas without DP attention: IPC sockets
    ],
)  # fmt: skip
def test_real_ports_and_the_defaults_pass(flags):
    assert issues("0.5.9", flags) == []


def test_every_port_flag_of_every_table_is_checked():
    # Read from the tables, not listed by hand: a new version's new port flag is covered.
    for version, flag_table in _tables().items():
        named = {s.dest for s in flag_table.flags if {"port", "ports"} & set(s.dest.split("_"))}
        checked = {s.dest for s in flag_table.flags if is_port_flag(s)}
        assert named <= checked, version
        assert "port" in checked and "nccl_port" in checked


@pytest.mark.parametrize(
    ("pasted", "reason"),
    [
        ("python3 '-cimport os;os.system(\"id\")' -m sglang.launch_server --model-path /m", "-c"),
        ("python3 -c 'import os' -m sglang.launch_server --model-path /m", "-c runs the code"),
        ("python3 -uc 'import os' -m sglang.launch_server --model-path /m", "-c runs the code"),
        ("python3 -W ignore::antigravity.x -m sglang.launch_server --model-path /m", "-W"),
        ("python3 -Wignore::antigravity.x -m sglang.launch_server --model-path /m", "-W"),
        ("python3 -X pycache_prefix=/etc -m sglang.launch_server --model-path /m", "-X"),
        ("python3 -Ximporttime -m sglang.launch_server --model-path /m", "-X"),
        ("python3 -O -m sglang.launch_server --model-path /m", "-O is refused"),
        ("python3 -i -m sglang.launch_server --model-path /m", "-i is refused"),
        ("python3 --version -m sglang.launch_server --model-path /m", "--version is refused"),
        ("python3 evil.py -m sglang.launch_server --model-path /m", "would run 'evil.py'"),
        ("python3 -m sglang.bench_one -m sglang.launch_server --model-path /m", "not SGLang's"),
    ],
)
def test_interpreter_options_that_could_run_other_code_are_refused_not_dropped(pasted, reason):
    with pytest.raises(ValueError, match="refused|would run|not SGLang's|not given") as refused:
        split_command(pasted)
    assert reason in str(refused.value)


@pytest.mark.parametrize(
    "pasted",
    [
        "python3 -m sglang.launch_server --model-path /m",
        "/opt/venv/bin/python3.11 -u -B -m sglang.launch_server --model-path /m",
        "python3 -uB -E -s -I -P -msglang.launch_server --model-path /m",
        "python -X faulthandler -Xutf8 -m sglang.launch_server --model-path /m",
        "HF_HOME=/x python3 -u -m sglang.launch_server --model-path /m",
    ],
)
def test_harmless_interpreter_options_are_accepted(pasted):
    assert split_command(pasted)[0] == ["--model-path", "/m"]


@pytest.mark.parametrize(
    ("version", "chosen"),
    [
        ("0.5.9", "0.5.9"),
        ("0.5.9rc0", "0.5.2"),  # a candidate comes before its release (was 0.5.23's table)
        ("0.5.9rc1", "0.5.2"),
        ("0.5.9a1", "0.5.2"),
        ("0.5.9b2", "0.5.2"),
        ("0.5.9.dev0", "0.5.2"),
        ("0.5.9.post1", "0.5.9"),
        ("0.5.9+cu124", "0.5.9"),  # a local build of 0.5.9 (was 0.5.23's table)
        ("0.5.9.post1+local.2", "0.5.9"),
        ("0.5.10rc0", "0.5.9"),
        ("0.5.23rc1", "0.5.9"),
        ("0.5.23.post1", "0.5.23"),
        ("0.5.2rc2", "0.4.10.post2"),
        ("0.4.10", "0.4.10.post2"),  # older than every table: the oldest
        ("0.4.10.post3", "0.4.10.post2"),
        ("0.5.9-custom", "0.5.9"),  # not PEP 440: its release numbers
        ("0.5.9_custom.2", "0.5.9"),
        ("0.5.9-candidate", "0.5.9"),  # a word that only starts like "c" is no marker
        # Not PEP 440 but marked as a pre-release: before its release, as pip would put it.
        ("0.5.9rc1-custom", "0.5.2"),
        ("0.5.9rc1custom", "0.5.2"),
        ("0.5.9.rc1.custom", "0.5.2"),
        ("0.5.9~rc1", "0.5.2"),
        ("0.5.9-rc.1", "0.5.2"),
        ("0.5.9-RC1-build7", "0.5.2"),
        ("0.5.9beta-x", "0.5.2"),
        ("0.5.9.dev3-custom", "0.5.2"),
        ("0.5.23~alpha.2", "0.5.9"),
    ],
)
def test_each_version_form_gets_the_table_of_the_newest_release_not_after_it(version, chosen):
    assert table_for(version) == chosen


@pytest.mark.parametrize(
    ("text", "read"),
    [("0.5.9rc1-custom", "0.5.9rc1"), ("0.5.9~rc1", "0.5.9rc1"), ("0.5.9.dev3-x", "0.5.9.dev3"),
     ("0.5.9-custom", "0.5.9"), ("0.5.9preview", "0.5.9rc0")],
)  # fmt: skip
def test_an_odd_version_is_read_as_its_release_and_pre_release_marker(text, read):
    assert sglang_version(text) == Version(read)


HICACHE_NODE = NodeMemory((96 * GiB,) * 8, 2000 * GB, mem_available_bytes=1900 * GB)


def codes(version: str, flags: str) -> set[str]:
    parsed = parse_command(["--model-path", "/m", *flags.split()], table(version))
    return {m.code for m in check(parsed, HICACHE_NODE, version=version).messages}


@pytest.mark.parametrize(
    ("version", "autosized"),
    [
        ("0.5.21", True),
        ("0.5.21.post1", True),
        ("0.5.21+cu128", True),
        ("0.5.22rc0", True),
        ("0.5.21rc1", False),  # before 0.5.21
        ("0.5.21.dev3", False),
        ("0.5.2rc2", False),  # was read as 0.5.22
        ("0.5.20", False),
    ],
)
def test_the_hicache_autosize_rule_follows_pep_440_order(version, autosized):
    found = codes(version, "--tp-size 2 --enable-hierarchical-cache")
    assert ("hicache_autosize" in found) is autosized


@pytest.mark.parametrize(
    ("version", "per_rank"),
    [
        ("0.5.18", True),
        ("0.5.18.post1", True),  # a fix of 0.5.18 keeps its rules
        ("0.5.19rc0", True),
        ("0.5.19", False),
        ("0.5.19+local", False),
        ("0.5.1rc9", True),  # was read as 0.5.19
    ],
)
def test_the_per_rank_host_check_rule_follows_pep_440_order(version, per_rank):
    found = codes(version, "--tp-size 2 --enable-hierarchical-cache --hicache-size 10")
    assert ("per_rank_check" in found) is per_rank


@pytest.mark.parametrize(
    ("text", "readable"),
    [
        ("0.5.9", True),
        ("0.5.0rc1", True),
        ("0.5.9.dev0", True),
        ("0.5.9.post1+local.2", True),  # refused by the hand-written pattern
        ("0.5.9+cu124.torch2.9", True),
        ("0.5.9-custom", False),  # not PEP 440: an import or bundle cannot name it
        ("0.5.9\n", False),
        ("1." * 20 + "1", False),  # longer than the 32-character column
    ],
)
def test_version_text_from_imports_and_bundles_is_pep_440(text, readable):
    assert bool(VERSION_TEXT.fullmatch(text)) is readable


@pytest.mark.parametrize(
    ("text", "table"),
    [
        ("v0.5.9-x", "0.5.9"),
        ("V0.5.9rc1-x", "0.5.2"),
        ("0.5.9 rc1", "0.5.2"),
        ("v0.5.23", "0.5.23"),
    ],
)
def test_a_leading_v_and_a_spaced_marker_read_as_pip_would_mean_them(text, table):
    from nodes.domain.sglang_flags import table_for

    assert table_for(text) == table
