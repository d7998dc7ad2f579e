"""``up`` twice is safe, ``down`` on nothing is safe, and ``down`` leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.fleet import bring_up, simfleet, wait_until


def _leftovers(fleet_id: str, state: str) -> dict[str, list[str]]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    ps = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
    with open("/proc/mounts") as handle:
        mounts = handle.read()
    freezer = Path("/sys/fs/cgroup/freezer")
    groups = [p.name for p in freezer.glob(f"simfleet-{fleet_id}-*")] if freezer.is_dir() else []
    return {
        "cgroups": groups,
        "netns": [line for line in netns.splitlines() if f"sf-{fleet_id}-" in line],
        "links": [line for line in links.splitlines() if f"sf{fleet_id}" in line],
        "processes": [line for line in ps.splitlines() if state in line],
        "mounts": [line for line in mounts.splitlines() if state in line or fleet_id in line],
    }


def test_down_leaves_no_process_namespace_mount_or_link(tmp_path):
    state = str(tmp_path / "fleet")
    assert simfleet("down", "--state", state).returncode == 0  # nothing there yet: fine
    nodes = bring_up(
        state,
        {
            "nodes": [
                {"name": "a", "gpus": 1},
                {"name": "b", "gpus": 1, "faults": ["stuck-on-kill"]},
            ]
        },
    )
    again = json.loads(
        simfleet("up", "--state", state, "--spec", f"{state}/spec.json", "--json").stdout
    )
    assert [n["host"] for n in again["nodes"]] == [n.host for n in nodes.values()]
    nodes["a"].ok("setsid sleep 600 > /dev/null 2>&1 < /dev/null &")
    # The nodes reach each other on their fabric (eth1), as a cluster's nodes do; with b's port
    # on it down, a no longer reaches b there, and b still answers SSH on its own link.
    assert again["nodes"][1]["fabric"] == {"interface": "eth1", "address": "172.30.0.2"}
    nodes["b"].ok(
        "setsid python3 -c \"import socket; s = socket.create_server(('172.30.0.2', 7001));"
        ' [s.accept()[0].close() for _ in iter(int, 1)]" > /dev/null 2>&1 < /dev/null &'
    )
    reach = "python3 -c \"import socket; socket.create_connection(('172.30.0.2', 7001), 2)\""
    assert wait_until(lambda: nodes["a"].run(reach)[0] == 0, 10)
    simfleet("link", "b", "down", "--fabric", "--state", state)
    assert nodes["a"].run(reach)[0] != 0
    assert "eth1" in nodes["b"].ok("cat /proc/net/dev")
    simfleet("link", "b", "up", "--fabric", "--state", state)
    assert wait_until(lambda: nodes["a"].run(reach)[0] == 0, 10)
    fleet_id = json.loads(Path(state, "fleet.json").read_text())["fleet_id"]
    assert _leftovers(fleet_id, state)["netns"]
    simfleet("down", "--state", state)
    assert _leftovers(fleet_id, state) == {
        "cgroups": [],
        "netns": [],
        "links": [],
        "processes": [],
        "mounts": [],
    }
    simfleet("down", "--state", state)


def test_bad_requests_are_refused_with_a_reason(tmp_path):
    bad = simfleet("up", "--state", str(tmp_path), "--fault", "melt", check=False)
    assert bad.returncode == 2 and "invalid choice: 'melt'" in bad.stderr
    size = simfleet("up", "--state", str(tmp_path), "--host-ram", "449", check=False)
    assert size.returncode == 1 and "give a size with a unit" in size.stderr
    unknown = simfleet("reboot", "nope", "--state", str(tmp_path), check=False)
    assert unknown.returncode == 1 and "no node named 'nope'" in unknown.stderr
