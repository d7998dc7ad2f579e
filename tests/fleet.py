"""Helpers for tests that use the simulated fleet: bring it up, talk to nodes over real SSH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

ROOT = Path(__file__).resolve().parent.parent


def simfleet(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python -m simfleet ARGS`` as an operator would."""
    result = subprocess.run(
        [sys.executable, "-m", "simfleet", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"simfleet {' '.join(args)} failed: {result.stderr}")
    return result


@dataclass
class SimNode:
    """One node as ``simfleet up --json`` describes it."""

    name: str
    host: str
    port: int
    user: str
    key_path: str
    host_key_fingerprint: str
    fabric: dict[str, str]  # {"interface": "eth1", "address": …}: the nodes' own network
    models: dict[str, str]
    state: str

    def connect(self, timeout: float = 5) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(_ExpectFingerprint(self.host_key_fingerprint))
        client.connect(
            self.host,
            port=self.port,
            username=self.user,
            key_filename=self.key_path,
            timeout=timeout,
            allow_agent=False,
            look_for_keys=False,
        )
        return client

    def run(self, command: str, timeout: float = 60) -> tuple[int, str, str]:
        """Run a shell command on the node over SSH; ``(exit status, stdout, stderr)``."""
        with self.connect() as client:
            _, stdout, stderr = client.exec_command(command, timeout=timeout)
            out, err = stdout.read().decode(), stderr.read().decode()
            return stdout.channel.recv_exit_status(), out, err

    def ok(self, command: str, timeout: float = 60) -> str:
        status, out, err = self.run(command, timeout)
        assert status == 0, f"{command!r} exited {status}: {err}"
        return out

    def reboot(self) -> None:
        simfleet("reboot", self.name, "--state", self.state)

    def make_clean(self) -> None:
        """Reboot the node only if an earlier test left it otherwise than a reboot would (a
        server running, GPU memory held or leaked, kernel messages, a link down)."""
        from simfleet.fleet import Fleet

        if Fleet(self.state).dirt(self.name):
            self.reboot()


class _ExpectFingerprint(paramiko.MissingHostKeyPolicy):
    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def missing_host_key(self, client: Any, hostname: str, key: paramiko.PKey) -> None:
        if key.fingerprint != self.fingerprint:
            raise paramiko.SSHException(f"host key {key.fingerprint} != {self.fingerprint}")


def bring_up(state: str, spec: dict[str, Any]) -> dict[str, SimNode]:
    spec_file = os.path.join(state, "spec.json")
    os.makedirs(state, exist_ok=True)
    with open(spec_file, "w") as handle:
        json.dump(spec, handle)
    doc = json.loads(simfleet("up", "--state", state, "--spec", spec_file, "--json").stdout)
    return {n["name"]: SimNode(**n, state=state) for n in doc["nodes"]}


def wait_until(predicate: Any, timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)
