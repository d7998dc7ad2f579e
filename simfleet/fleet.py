"""Bring a fleet of simulated nodes up and down, and act on its nodes (host side, as root).

A fleet lives in a state folder. Its id (a hash of the folder's real path) names its network
namespaces (``sf-<id>-<n>``), links (``sf<id><n>h``/``n``) and addresses (``10.A.B.0/24``, a /30
per node), so fleets with different state folders never collide. Traffic only ever goes to these
addresses: the nodes exist only inside this machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from simfleet import load as loading
from simfleet import models
from simfleet.spec import NodeSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE_PYTHON = "/usr/bin/python3"
FREEZER = "/sys/fs/cgroup/freezer"  # cgroup-v1 freezer: how the stuck-on-kill fault makes D state
#: The nodes' own network, as a cluster's fabric between its nodes: one bridge in the fleet's
#: switch namespace, each node's ``eth1`` on it at 172.30.0.(number + 1)/24. It is separate from
#: the link each node has to this machine (SSH), so a node's fabric can fail while the panel
#: still reaches it; each fleet's switch is its own, so two fleets' fabrics never meet.
FABRIC_LINK = "eth1"
FABRIC_NET = "172.30.0"


class FleetError(RuntimeError):
    """Something the operator of the fleet must fix; the message says what."""


@dataclass
class NodeRecord:
    """Where a node lives: names and addresses derived from the fleet id and its number."""

    name: str
    number: int
    netns: str
    host_link: str
    node_link: str
    host_address: str
    address: str
    spec: dict[str, Any]


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise FleetError(f"{' '.join(argv)}: {result.stderr.strip() or result.stdout.strip()}")
    return result


class Fleet:
    """A fleet in ``state_dir``. Every method is safe to repeat."""

    def __init__(self, state_dir: str) -> None:
        self.state_dir = os.path.realpath(state_dir)
        digest = hashlib.sha1(self.state_dir.encode()).digest()
        self.fleet_id = digest[:3].hex()
        self.subnet = (10, 64 + digest[3] % 128, digest[4])
        self.manifest_path = os.path.join(self.state_dir, "fleet.json")

    # --- records -------------------------------------------------------------------------------

    def records(self) -> list[NodeRecord]:
        try:
            with open(self.manifest_path) as handle:
                return [NodeRecord(**n) for n in json.load(handle)["nodes"]]
        except FileNotFoundError:
            return []

    def record(self, name: str) -> NodeRecord:
        for record in self.records():
            if record.name == name:
                return record
        raise FleetError(f"no node named {name!r} in the fleet at {self.state_dir}")

    def _save(self, records: list[NodeRecord]) -> None:
        os.makedirs(self.state_dir, exist_ok=True)
        tmp = self.manifest_path + ".tmp"
        with open(tmp, "w") as handle:
            json.dump({"fleet_id": self.fleet_id, "nodes": [asdict(r) for r in records]}, handle)
        os.replace(tmp, self.manifest_path)

    def default_name(self, number: int) -> str:
        return f"sim-{self.fleet_id[:4]}-{number:02d}"

    def _new_record(self, number: int, spec: NodeSpec) -> NodeRecord:
        if number > 62:
            raise FleetError("a fleet holds at most 63 nodes")
        a, b, c = self.subnet
        tag = f"{self.fleet_id}{number:02d}"
        return NodeRecord(
            name=spec.name,
            number=number,
            netns=f"sf-{self.fleet_id}-{number}",
            host_link=f"sf{tag}h",
            node_link=f"sf{tag}n",
            host_address=f"{a}.{b}.{c}.{4 * number + 1}",
            address=f"{a}.{b}.{c}.{4 * number + 2}",
            spec=asdict(spec),
        )

    @property
    def switch_netns(self) -> str:
        return f"sf-{self.fleet_id}-sw"

    @staticmethod
    def fabric_address(record: NodeRecord) -> str:
        """The node's address on the fleet's fabric (``FABRIC_LINK``, a /24)."""
        return f"{FABRIC_NET}.{record.number + 1}"

    def node_dir(self, name: str) -> str:
        return os.path.join(self.state_dir, "nodes", name)

    @property
    def key_path(self) -> str:
        return os.path.join(self.state_dir, "id_ed25519")

    @property
    def models_dir(self) -> str:
        return os.path.join(self.state_dir, "models")

    # --- up / down -------------------------------------------------------------------------------

    def up(self, specs: list[NodeSpec]) -> dict[str, Any]:
        """Start every node that is not running; return the fleet's JSON document."""
        _check_tools()
        if any("stuck-on-kill" in s.faults for s in specs) and not os.path.isdir(FREEZER):
            raise FleetError(f"the stuck-on-kill fault needs the cgroup-v1 freezer at {FREEZER}")
        os.makedirs(self.state_dir, exist_ok=True)
        if not os.path.exists(self.key_path):
            _run(
                "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "simfleet", "-f", self.key_path
            )
        models.create(self.models_dir)
        # One fleet at a time picks its addresses and makes its links, so that fleets started at
        # once (a test run's processes, two runs) never take the same subnet.
        with _host_lock():
            known = {r.name: r for r in self.records()}
            if known:
                first = next(iter(known.values())).host_address.split(".")
                self.subnet = (int(first[0]), int(first[1]), int(first[2]))
            else:
                self.subnet = _free_subnet(self.subnet)
            records = []
            for number, spec in enumerate(specs):
                record = known.get(spec.name) or self._new_record(number, spec)
                if not self._running(record):
                    record.spec = asdict(spec)  # a stopped node comes back as now asked
                records.append(record)
            self._save(records)
            for record in records:
                if not self._running(record):
                    self._start(record)
        for record in records:
            self._wait_for_ssh(record)
        return self.document()

    def document(self) -> dict[str, Any]:
        """``{"nodes": [{name, host, port, user, key_path, host_key_fingerprint, fabric:
        {interface, address}, models}]}``."""
        model_paths = {name: f"/srv/models/{name}" for name in models.MODELS}
        return {
            "nodes": [
                {
                    "name": r.name,
                    "host": r.address,
                    "port": 22,
                    "user": "root",
                    "key_path": self.key_path,
                    "host_key_fingerprint": self.fingerprint(r.name),
                    "fabric": {"interface": FABRIC_LINK, "address": self.fabric_address(r)},
                    "models": model_paths,
                }
                for r in self.records()
            ]
        }

    def fingerprint(self, name: str) -> str:
        """The node's host key fingerprint, ``SHA256:…``."""
        key = os.path.join(self.node_dir(name), "ssh_host_ed25519_key.pub")
        out = _run("ssh-keygen", "-l", "-E", "sha256", "-f", key).stdout
        return out.split()[1]

    def down(self) -> None:
        """Stop every process the fleet started and remove its namespaces and links."""
        for record in self.records():
            self._stop(record)
            _run("ip", "netns", "delete", record.netns, check=False)
            _run("ip", "link", "delete", record.host_link, check=False)
        _run("ip", "netns", "delete", self.switch_netns, check=False)

    # --- one node --------------------------------------------------------------------------------

    def _pid_file(self, record: NodeRecord) -> str:
        return os.path.join(self.node_dir(record.name), "init.pid")

    def _pid(self, record: NodeRecord) -> int | None:
        try:
            with open(self._pid_file(record)) as handle:
                pid = int(handle.read())
        except (FileNotFoundError, ValueError):
            return None
        return pid if _is_ours(pid, record.netns) else None

    def _running(self, record: NodeRecord) -> bool:
        return self._pid(record) is not None

    def init_pid(self, name: str) -> int:
        """Host PID of the node's PID 1 (for nsenter)."""
        record = self.record(name)
        pid = self._pid(record)
        if pid is None:
            raise FleetError(f"node {name} is not running")
        children = _children(pid)
        if not children:
            raise FleetError(f"node {name} has no init process")
        return children[0]

    def _start(self, record: NodeRecord) -> None:
        spec = NodeSpec(**record.spec)
        folder = self.node_dir(record.name)
        for sub in ("ledger", "leaked", "holds", "cgroup", "home", "tmp"):
            os.makedirs(os.path.join(folder, sub), exist_ok=True)
        for stale in ("ledger", "leaked", "holds"):
            for name in os.listdir(os.path.join(folder, stale)):
                os.unlink(os.path.join(folder, stale, name))
        open(os.path.join(folder, "kmsg"), "w").close()
        settings = spec.node_json(boot_time=time.time())
        settings["freezer_cgroup"] = self._freezer_name(record)
        with open(os.path.join(folder, "node.json"), "w") as handle:
            json.dump(settings, handle, indent=2)
        host_key = os.path.join(folder, "ssh_host_ed25519_key")
        if not os.path.exists(host_key):
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", record.name, "-f", host_key)
        shutil.copyfile(self.key_path + ".pub", os.path.join(folder, "authorized_keys"))
        with open(os.path.join(folder, "sshd_config"), "w") as handle:
            handle.write(_SSHD_CONFIG)
        self._network(record)
        log = open(os.path.join(folder, "init.log"), "ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                record.netns,
                "unshare",
                "--mount",
                "--pid",
                "--uts",
                "--fork",
                "--kill-child",
                "--mount-proc",
                "--propagation",
                "private",
                NODE_PYTHON,
                "-m",
                "simfleet.nodeinit",
                folder,
                self.models_dir,
            ],
            cwd=REPO,
            env={
                "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
                "PYTHONPATH": REPO,
            },
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        with open(self._pid_file(record), "w") as handle:
            handle.write(str(proc.pid))

    def _network(self, record: NodeRecord) -> None:
        if _run("ip", "netns", "pids", record.netns, check=False).returncode != 0:
            _run("ip", "netns", "add", record.netns)
        if _run("ip", "link", "show", record.host_link, check=False).returncode != 0:
            _run(
                "ip",
                "link",
                "add",
                record.host_link,
                "type",
                "veth",
                "peer",
                "name",
                record.node_link,
            )
            _run("ip", "link", "set", record.node_link, "netns", record.netns)
            _run("ip", "addr", "add", f"{record.host_address}/30", "dev", record.host_link)
            ns = ("ip", "netns", "exec", record.netns)
            _run(*ns, "ip", "addr", "add", f"{record.address}/30", "dev", record.node_link)
            _run(*ns, "ip", "link", "set", record.node_link, "up")
            _run(*ns, "ip", "link", "set", "lo", "up")
            _run(*ns, "ip", "route", "add", "default", "via", record.host_address)
        _run("ip", "link", "set", record.host_link, "up")
        self._fabric(record)

    def _fabric(self, record: NodeRecord) -> None:
        """The node's ``eth1`` on the fleet's switch (created with the first node)."""
        switch = ("ip", "netns", "exec", self.switch_netns)
        if _run("ip", "netns", "pids", self.switch_netns, check=False).returncode != 0:
            _run("ip", "netns", "add", self.switch_netns)
            _run(*switch, "ip", "link", "add", "fabric", "type", "bridge")
            _run(*switch, "ip", "link", "set", "fabric", "up")
        ns = ("ip", "netns", "exec", record.netns)
        if _run(*ns, "ip", "link", "show", FABRIC_LINK, check=False).returncode == 0:
            return
        # Both ends are made on this machine under names unique to the fleet, then moved.
        tag = f"{self.fleet_id}{record.number:02d}"
        node_end, switch_end, port = f"sf{tag}a", f"sf{tag}b", f"p{record.number}"
        _run("ip", "link", "delete", node_end, check=False)
        _run("ip", "link", "add", node_end, "type", "veth", "peer", "name", switch_end)
        _run("ip", "link", "set", node_end, "netns", record.netns)
        _run("ip", "link", "set", switch_end, "netns", self.switch_netns)
        _run(*ns, "ip", "link", "set", node_end, "name", FABRIC_LINK)
        _run(*ns, "ip", "addr", "add", f"{self.fabric_address(record)}/24", "dev", FABRIC_LINK)
        _run(*ns, "ip", "link", "set", FABRIC_LINK, "up")
        _run(*switch, "ip", "link", "set", switch_end, "name", port)
        _run(*switch, "ip", "link", "set", port, "master", "fabric")
        _run(*switch, "ip", "link", "set", port, "up")

    def _freezer_name(self, record: NodeRecord) -> str:
        return f"simfleet-{self.fleet_id}-{record.number}"

    def _thaw(self, record: NodeRecord) -> None:
        """Frozen (D-state) processes cannot die until thawed; the node's end needs them gone."""
        group = os.path.join(FREEZER, self._freezer_name(record))
        if os.path.isdir(group):
            with open(os.path.join(group, "freezer.state"), "w") as handle:
                handle.write("THAWED")

    def _stop(self, record: NodeRecord) -> None:
        self._thaw(record)
        pid = self._pid(record)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _wait(lambda: not _exists(pid), 10, f"node {record.name} did not stop")
        # Helpers started with nsenter (holds) die with the node's PID namespace.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._pid_file(record))
        group = os.path.join(FREEZER, self._freezer_name(record))
        if os.path.isdir(group):
            _wait(lambda: _emptied(group), 30, f"{group} still has processes")

    def _wait_for_ssh(self, record: NodeRecord, timeout: float = 30) -> None:
        def banner() -> bool:
            try:
                with socket.create_connection((record.address, 22), timeout=1) as conn:
                    return conn.recv(16).startswith(b"SSH-")
            except OSError:
                return False

        log = os.path.join(self.node_dir(record.name), "init.log")
        _wait(banner, timeout, f"node {record.name} did not accept SSH; see {log}")

    def reboot(self, name: str) -> None:
        """All of the node's processes gone, leaked memory freed, kernel log cleared; back up."""
        record = self.record(name)
        self._stop(record)
        self._start(record)
        self._wait_for_ssh(record)

    def dirt(self, name: str) -> list[str]:
        """What differs on node ``name`` from how a reboot leaves it, from the host side and in
        milliseconds: a process beyond its init and sshd (a server, a hold, a zombie, a frozen
        rank), GPU memory taken or leaked, kernel messages since boot, a link down. Empty when
        the node is as booted (open SSH sessions, files in its home and ``/tmp`` aside, which a
        reboot keeps too)."""
        record = self.record(name)
        pid = self._pid(record)
        if pid is None:
            return ["not running"]
        found = []
        for descendant in _descendants(pid):
            try:
                with open(f"/proc/{descendant}/cmdline", "rb") as handle:
                    argv = handle.read().split(b"\0")
            except FileNotFoundError:
                continue
            state = _state(descendant)
            if state is None:
                continue
            if state == "Z" or not _as_booted(argv):
                found.append(f"process {descendant} ({state}): {b' '.join(argv).decode()[:80]}")
        folder = self.node_dir(name)
        for sub in ("ledger", "leaked", "holds"):
            if os.listdir(os.path.join(folder, sub)):
                found.append(f"{sub}/ is not empty")
        with open(os.path.join(folder, "kmsg")) as handle:
            if len(handle.read().splitlines()) > 1:
                found.append("kernel messages since boot")
        with open(f"/sys/class/net/{record.host_link}/operstate") as handle:
            if handle.read().strip() == "down":
                found.append("its link is down")
        port = _run("ip", "netns", "exec", self.switch_netns, "ip", "-o", "link", "show",
                    f"p{record.number}", check=False).stdout  # fmt: skip
        if "state DOWN" in port:
            found.append("its fabric port is down")
        return found

    def link(self, name: str, state: str, fabric: bool = False) -> None:
        """The node's link to this machine (SSH) up or down; with ``fabric``, its port on the
        fleet's fabric instead (the other nodes lose it; the panel still reaches it)."""
        if state not in ("up", "down"):
            raise FleetError("link state is up or down")
        record = self.record(name)
        if fabric:
            switch = ("ip", "netns", "exec", self.switch_netns)
            _run(*switch, "ip", "link", "set", f"p{record.number}", state)
        else:
            _run("ip", "link", "set", record.host_link, state)

    def rekey(self, name: str) -> str:
        """Give the node a new host key (sshd reloads it); return the new fingerprint."""
        folder = self.node_dir(name)
        key = os.path.join(folder, "ssh_host_ed25519_key")
        fresh = os.path.join(folder, "rekey.tmp")
        for path in (fresh, fresh + ".pub"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", fresh)
        # Rewrite in place: the node sees these files through bind mounts of their inodes.
        for suffix in ("", ".pub"):
            with open(fresh + suffix, "rb") as src, open(key + suffix, "r+b") as dst:
                data = src.read()
                dst.seek(0)
                dst.write(data)
                dst.truncate()
            os.unlink(fresh + suffix)
        self.node_exec(name, ["sh", "-c", "kill -HUP $(cat /run/simfleet/sshd.pid)"])
        time.sleep(0.3)
        return self.fingerprint(name)

    def node_exec(self, name: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node (its PID, mount, UTS and network namespaces)."""
        pid = self.init_pid(name)
        return _run("nsenter", "-t", str(pid), "-m", "-p", "-u", "-n", "--", *argv)

    def hold(self, name: str, gpu: int, size: int) -> None:
        """Start a foreign process on the node holding ``size`` bytes on GPU ``gpu``."""
        pid = self.init_pid(name)
        spec = NodeSpec(**self.record(name).spec)
        if not 0 <= gpu < spec.gpus:
            raise FleetError(f"node {name} has GPUs 0..{spec.gpus - 1}")
        if not 0 < size <= spec.gpu_memory_bytes:
            raise FleetError(
                f"GPU {gpu} of {name} has {spec.gpu_memory_bytes:,} bytes; cannot hold {size:,}"
            )
        holds = os.path.join(self.node_dir(name), "holds")
        before = set(os.listdir(holds))
        with tempfile.TemporaryFile() as errors:
            holder = subprocess.Popen(
                [
                    "nsenter",
                    "-t",
                    str(pid),
                    "-m",
                    "-p",
                    "-u",
                    "-n",
                    "--",
                    NODE_PYTHON,
                    "-m",
                    "simnode.hold",
                    "--gpu",
                    str(gpu),
                    "--bytes",
                    str(size),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=errors,
                start_new_session=True,
            )
            # Until it has registered, or has died saying why (a loaded machine starts a Python
            # process inside a namespace in seconds, not always in ten).
            deadline = time.monotonic() + 120
            while not set(os.listdir(holds)) - before:
                if holder.poll() is not None:
                    errors.seek(0)
                    said = errors.read().decode(errors="replace").strip()[-500:]
                    raise FleetError(f"the holding process exited {holder.returncode}: {said}")
                if time.monotonic() > deadline:
                    raise FleetError("the holding process did not register within 120 s")
                time.sleep(0.05)

    def load(self, name: str, port: int, **load: Any) -> dict[str, Any]:
        """Drive a bounded load (``simfleet.load.drive``'s arguments) at the server on ``port``
        of node ``name``, from inside the node's network namespace; its summary."""
        loading.check(
            load["concurrency"], load["input_tokens"], load["output_tokens"],
            load.get("shared_prefix", 0.0), load["seconds"],
        )  # fmt: skip
        argv = [f"--port={port}"] + [f"--{k.replace('_', '-')}={v}" for k, v in load.items()]
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        done = subprocess.run(
            ["nsenter", "-t", str(self.init_pid(name)), "-n", "--",
             sys.executable, "-m", "simfleet.load", *argv],
            capture_output=True, text=True, cwd=root, timeout=float(load["seconds"]) + 60,
            env={**os.environ, "PYTHONPATH": root},
        )  # fmt: skip
        if done.returncode != 0:
            raise FleetError(f"the load on {name}:{port} failed: {done.stderr.strip()[-500:]}")
        return dict(json.loads(done.stdout))

    def release(self, name: str) -> None:
        self.node_exec(name, [NODE_PYTHON, "-m", "simnode.hold", "--release"])
        holds = os.path.join(self.node_dir(name), "holds")
        _wait(lambda: not os.listdir(holds), 10, "the holding processes did not stop")

    def status(self) -> list[dict[str, Any]]:
        """Each node's GPUs and RAM as the node itself reports them."""
        rows = []
        for record in self.records():
            row: dict[str, Any] = {"name": record.name, "host": record.address}
            if not self._running(record):
                rows.append({**row, "running": False})
                continue
            out = self.node_exec(record.name, [NODE_PYTHON, "-m", "simnode.status"]).stdout
            rows.append({**row, "running": True, **json.loads(out)})
        return rows


_SSHD_CONFIG = """\
# sshd of a simulated node (simfleet); paths are inside the node's own /run.
Port 22
ListenAddress 0.0.0.0
HostKey /run/simfleet/ssh_host_ed25519_key
PidFile none
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AuthorizedKeysFile /run/simfleet/authorized_keys
StrictModes no
UseDNS no
MaxSessions 100
MaxStartups 200:30:400
LogLevel INFO
Subsystem sftp internal-sftp
"""


def _check_tools() -> None:
    if os.geteuid() != 0:
        raise FleetError("simfleet needs root (network and mount namespaces)")
    missing = [
        t
        for t in ("ip", "unshare", "nsenter", "ssh-keygen", "/usr/sbin/sshd", NODE_PYTHON)
        if shutil.which(t) is None
    ]
    if missing:
        raise FleetError(
            f"missing {', '.join(missing)}: install openssh-server, iproute2, util-linux, python3"
        )


def _emptied(group: str) -> bool:
    """Remove a node's freezer cgroup once nothing is in it; until then thaw it again and kill
    what it holds (a process frozen mid-exit, or one that joined after the first thaw, outlives
    the node's PID namespace until it runs again: seen on a loaded machine)."""
    if _rmdir(group):
        return True
    with contextlib.suppress(FileNotFoundError):
        with open(os.path.join(group, "freezer.state"), "w") as handle:
            handle.write("THAWED")
        with open(os.path.join(group, "cgroup.procs")) as handle:
            for pid in handle.read().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
    return _rmdir(group)


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def _state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``Z``…, proc(5)), ``None`` once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            # The name in parentheses may hold spaces and ")": the state follows the last one.
            return handle.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


def _exists(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


def _is_ours(pid: int, netns: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            cmdline = handle.read().split(b"\0")
    except FileNotFoundError:
        return False
    return _exists(pid) and b"simfleet.nodeinit" in cmdline


def _children(pid: int) -> list[int]:
    """The processes ``pid`` started, whichever of its threads started them (each thread has
    its own ``children`` list), in the order the kernel lists them."""
    try:
        tasks = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except FileNotFoundError:
        return []
    found: list[int] = []
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(p) for p in handle.read().split()]
        except FileNotFoundError:
            continue
    return found


LOCK_FILE = "/run/lock/simfleet.lock"


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """This machine's lock for choosing addresses and making links (``flock``)."""
    os.makedirs(os.path.dirname(LOCK_FILE), exist_ok=True)
    with open(LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _free_subnet(preferred: tuple[int, int, int]) -> tuple[int, int, int]:
    """``preferred`` (from the fleet's id), or the next 10.64–191.x.0/24 that no address on this
    machine is in (another fleet's, or anything else's)."""
    out = _run("ip", "-o", "-4", "addr", "show").stdout
    taken = {tuple(int(p) for p in a.split("/")[0].split(".")[:3]) for a in out.split()
             if a.count(".") == 3 and "/" in a}  # fmt: skip
    a, b, c = preferred
    for step in range(128 * 256):
        index = ((b - 64) * 256 + c + step) % (128 * 256)
        candidate = (a, 64 + index // 256, index % 256)
        if candidate not in taken:
            return candidate
    raise FleetError("no free 10.64.0.0/10 subnet on this machine for another fleet")


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    found: list[int] = []
    todo = [pid]
    while todo:
        children = _children(todo.pop())
        found += children
        todo += children
    return found


def _as_booted(argv: list[bytes]) -> bool:
    """A process every booted node has: the namespace wrappers, its init, sshd and the sessions
    sshd keeps for connected clients."""
    head = argv[0]
    return (
        head in (b"ip", b"unshare", b"/usr/sbin/sshd")
        or b"simfleet.nodeinit" in argv
        or head.startswith((b"sshd:", b"sshd-session", b"/usr/lib/openssh/sshd-session"))
    )


def _wait(predicate: Any, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise FleetError(message)
        time.sleep(0.05)
