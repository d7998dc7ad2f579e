"""The node agent's ``watch``, run here as the panel runs it on a node (``python3 -c SOURCE``):
it says when a launch's process group changes, without re-reading the whole of /proc each
time, and the typed client reads its lines."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from nodes.remote import agent
from nodes.remote.client import AGENT, GroupStatus, _answer, parse_prepared
from tests.fleet import wait_until

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


def _group(folder: Path) -> subprocess.Popen[bytes]:
    """A session leader with two children, as a launch's supervisor, server and rank."""
    leader = subprocess.Popen(
        [PYTHON, "-c", "import subprocess,time\n"
         "a=subprocess.Popen(['sleep','60']); b=subprocess.Popen(['sleep','61'])\n"
         "time.sleep(60)"],
        start_new_session=True,
    )  # fmt: skip
    (folder / "pgid").write_text(str(leader.pid))
    (folder / "pid").write_text(str(leader.pid))
    return leader


def _wait_for_children(leader: subprocess.Popen[bytes]) -> None:
    """Until the leader's two children run (and the leader is past its imports)."""
    assert wait_until(lambda: len(agent.members(leader.pid)) == 3, 30), agent.members(leader.pid)


def _lines(watch: subprocess.Popen[str], count: int, timeout: float) -> list[GroupStatus]:
    found: list[GroupStatus] = []
    deadline = time.monotonic() + timeout
    assert watch.stdout is not None
    while len(found) < count and (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([watch.stdout], [], [], left)
        if ready and (line := watch.stdout.readline()).strip():
            found.append(_answer(GroupStatus, line, "the watch"))
    return found


def test_the_watch_reports_a_member_that_dies_and_stays_quiet_otherwise(tmp_path):
    leader = _group(tmp_path)
    try:
        _wait_for_children(leader)
        watch = subprocess.Popen(
            [PYTHON, "-c", AGENT, "watch", str(tmp_path), "0.2", "30"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            (first,) = _lines(watch, 1, 10)
            assert first.alive and len(first.members) == 3
            assert first.memory and first.memory["MemTotal"]
            children = sorted(m["pid"] for m in first.members if m["pid"] != leader.pid)
            os.kill(children[0], signal.SIGKILL)
            (second,) = _lines(watch, 1, 10)
            # The dead child shows defunct (its parent has not collected it), the other lives.
            states = {m["pid"]: m["state"] for m in second.members}
            assert states[children[0]] == "Z" and states[children[1]] != "Z"
            # Nothing changes now: no line until the 30 s beat.
            more = _lines(watch, 1, 1.5)
            assert more == [], [(m["pid"], m["state"], m["command"]) for m in more[0].members]
        finally:
            watch.kill()
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_the_watch_finds_the_group_from_its_known_processes_as_a_whole_read_does(tmp_path):
    leader = _group(tmp_path)
    try:
        _wait_for_children(leader)
        whole = agent.members(leader.pid)
        near = agent._members_near(leader.pid, [leader.pid])
        assert near is not None
        assert [p["pid"] for p in near] == [p["pid"] for p in whole]
        assert len(whole) == 3
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()


def test_every_command_answers_one_json_document_the_client_reads(tmp_path):
    for command in (["status", str(tmp_path)], ["preflight", str(tmp_path), "1"], ["holders"]):
        done = subprocess.run(
            [PYTHON, "-c", AGENT, *command], capture_output=True, text=True, check=True
        )
        assert isinstance(json.loads(done.stdout.strip().splitlines()[-1]), dict), command
    refused = subprocess.run([PYTHON, "-c", AGENT, "launch"], capture_output=True, text=True)
    assert refused.returncode != 0 and "unknown command" in refused.stderr


def _prepare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-c", AGENT, "prepare", *args], capture_output=True, text=True, check=True
    )


def test_prepare_reads_all_pre_flight_needs_in_one_run_and_only_the_group_of_a_running_one(
    tmp_path,
):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_hidden_layers": 2}))
    (model / "w.safetensors").write_bytes(b"\0" * 64)
    folder = tmp_path / "launch"
    listener = __import__("socket").create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        done = _prepare(str(folder), PYTHON, str(model), "-", str(port), "1")
    finally:
        listener.close()
    found = parse_prepared(done.stdout)
    assert found.status.pid is None and not found.status.exists
    assert found.facts is not None and found.facts.host_ram_bytes > 0
    assert found.model is not None and found.model.config == {
        "model_type": "qwen2",
        "num_hidden_layers": 2,
    }
    assert found.preflight is not None and found.preflight.model_found is True
    assert found.preflight.listening == [port]
    # Asked again with the stamp of what it read: the folder is unchanged.
    stamp = found.model.stamp or ""
    again = parse_prepared(_prepare(str(folder), PYTHON, str(model), stamp).stdout)
    assert again.model is not None and again.model.unchanged
    # A launch already running in the folder is adopted: nothing else is read.
    folder.mkdir()
    leader = _group(folder)
    try:
        running = parse_prepared(_prepare(str(folder), PYTHON, str(model), "-").stdout)
        assert running.status.pid == leader.pid and running.status.alive
        assert running.facts is None and running.model is None and running.preflight is None
    finally:
        os.killpg(leader.pid, signal.SIGKILL)
        leader.wait()
