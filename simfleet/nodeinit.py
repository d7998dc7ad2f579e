"""PID 1 of a simulated node: builds the node's view of the machine, runs sshd, keeps the books.

Started by ``simfleet up`` as ``ip netns exec NS unshare --mount --pid --uts --fork
--mount-proc ... python3 -m simfleet.nodeinit NODE_DIR MODELS_DIR``, so everything it mounts is
private to the node: ``/run`` (with the node's state at ``/run/simfleet``), ``/dev`` (own shm,
``nvidia*`` device nodes), ``/proc/meminfo`` (generated), ``/sys/fs/cgroup`` (the node's limit),
``/usr/local`` (nvidia-smi, dmesg, the pynvml and sglang modules), ``/root``, ``/tmp``, ``/srv``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node", "site")
PYVER = f"python{sys.version_info.major}.{sys.version_info.minor}"
DIST = f"/usr/local/lib/{PYVER}/dist-packages"
HOST_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def mount(*argv: str) -> None:
    sh("mount", *argv)


def build_run(node_dir: str) -> None:
    mount("-t", "tmpfs", "-o", "mode=755,size=64m", "tmpfs", "/run")
    os.makedirs("/run/sshd", mode=0o755)
    os.makedirs("/run/simfleet")
    mount("--bind", node_dir, "/run/simfleet")


def build_dev(config: dict[str, object]) -> None:
    staging = "/run/.dev"
    os.makedirs(staging)
    mount("-t", "tmpfs", "-o", "mode=755,size=1m", "dev", staging)
    for name in HOST_DEVICES:
        target = os.path.join(staging, name)
        open(target, "w").close()
        mount("--bind", f"/dev/{name}", target)
    os.makedirs(os.path.join(staging, "pts"))
    os.makedirs(os.path.join(staging, "shm"))
    mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", f"{staging}/pts")
    os.symlink("pts/ptmx", os.path.join(staging, "ptmx"))
    mount("-t", "tmpfs", "-o", f"mode=1777,size={config['shm_bytes']}", "shm", f"{staging}/shm")
    os.symlink("/proc/self/fd", os.path.join(staging, "fd"))
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{number}", os.path.join(staging, name))
    if "no-driver" not in config["faults"]:  # type: ignore[operator]
        # Character devices with /dev/null's numbers: openable, so processes can hold them the way
        # CUDA holds the real ones, and fuser/lsof see who does.
        names = [f"nvidia{g['index']}" for g in config["gpus"]]  # type: ignore[attr-defined]
        for name in [*names, "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
            os.mknod(os.path.join(staging, name), 0o20666, os.makedev(1, 3))
            os.chmod(os.path.join(staging, name), 0o666)
    mount("--move", staging, "/dev")


def build_proc_and_cgroup(config: dict[str, object]) -> None:
    from simnode import state

    os.makedirs("/run/simfleet/cgroup", exist_ok=True)
    state.publish()
    mount("--bind", "/run/simfleet/meminfo", "/proc/meminfo")
    if "stuck-on-kill" in config["faults"]:  # type: ignore[operator]
        # A private handle on the machine's cgroup-v1 freezer hierarchy (ip netns exec hides the
        # host's /sys/fs/cgroup; mounting the same controller again shows the same hierarchy).
        os.makedirs("/run/.freezer")
        mount("-t", "cgroup", "-o", "freezer", "freezer", "/run/.freezer")
        os.makedirs(f"/run/.freezer/{config['freezer_cgroup']}", exist_ok=True)
    mount("-t", "tmpfs", "-o", "mode=755,size=1m", "cgroup", "/sys/fs/cgroup")
    for name in ("memory.max", "memory.current"):
        open(f"/sys/fs/cgroup/{name}", "w").close()
        mount("--bind", f"/run/simfleet/cgroup/{name}", f"/sys/fs/cgroup/{name}")


def build_usr_local(config: dict[str, object]) -> None:
    mount("-t", "tmpfs", "-o", "mode=755,size=16m", "usrlocal", "/usr/local")
    os.makedirs(DIST)
    os.makedirs("/usr/local/bin")
    if "no-pynvml" in config["faults"]:  # type: ignore[operator]
        # The node's Python has no pynvml: every module of the site but that one.
        for name in sorted(os.listdir(SITE)):
            if name == "pynvml.py" or name.startswith(("__pycache__", ".")):
                continue
            source, target = os.path.join(SITE, name), os.path.join(DIST, name)
            if os.path.isdir(source):
                os.makedirs(target)
            else:
                open(target, "w").close()
            mount("--bind", "-o", "ro", source, target)
    else:
        mount("--bind", "-o", "ro", SITE, DIST)
    tools = {"dmesg": "simnode.dmesg"}
    if "no-driver" not in config["faults"]:  # type: ignore[operator]
        tools["nvidia-smi"] = "simnode.nvidia_smi"
    for tool, module in tools.items():
        script = os.path.join("/usr/local/bin", tool)
        with open(script, "w") as handle:
            # -S skips site initialisation: these answer in milliseconds, even on 50 nodes.
            handle.write(
                f"#!/usr/bin/python3 -S\nimport sys\nsys.path.insert(0, {DIST!r})\n"
                f"from {module} import main\nsys.exit(main(sys.argv[1:]))\n"
            )
        os.chmod(script, 0o755)


def build_home(node_dir: str, models_dir: str) -> None:
    # /srv first: the fleet's state folder may itself live under /tmp or /root.
    mount("-t", "tmpfs", "-o", "mode=755,size=1m", "srv", "/srv")
    os.makedirs("/srv/models")
    mount("--bind", "-o", "ro", models_dir, "/srv/models")
    for name, target in (("home", "/root"), ("tmp", "/tmp")):
        source = os.path.join(node_dir, name)
        os.makedirs(source, exist_ok=True)
        mount("--bind", source, target)
    os.chmod("/tmp", 0o1777)


def open_driver_to_all_users() -> None:
    """Let any user of the node take GPU memory, as ``/dev/nvidia*`` (0666) let them on a real
    node: the ledger that stands in for the driver, and what it rewrites, are open to all."""
    for name in ("ledger", "leaked"):
        os.chmod(f"/run/simfleet/{name}", 0o777)  # no sticky bit: any process settles the dead
    for name in ("ledger.lock", "meminfo", "kmsg", "cgroup/memory.current", "cgroup/memory.max"):
        fd = os.open(f"/run/simfleet/{name}", os.O_WRONLY | os.O_CREAT, 0o666)
        os.fchmod(fd, 0o666)
        os.close(fd)


def start_sshd() -> subprocess.Popen[bytes]:
    log = open("/run/simfleet/sshd.log", "ab")  # noqa: SIM115
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", "/run/simfleet/sshd_config"],
        stdout=log,
        stderr=log,
        env=env,
    )
    with open("/run/simfleet/sshd.pid", "w") as handle:
        handle.write(str(proc.pid))
    return proc


def main() -> None:
    node_dir, models_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, SITE)
    os.environ.pop("PYTHONPATH", None)
    with open(os.path.join(node_dir, "node.json")) as handle:
        config = json.load(handle)
    socket.sethostname(config["name"])
    build_run(node_dir)
    build_dev(config)
    build_proc_and_cgroup(config)
    build_usr_local(config)
    build_home(node_dir, models_dir)
    open_driver_to_all_users()
    # The node's own host key where an operator looks for it (inside this node only).
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):
        if os.path.exists(f"/etc/ssh/{name}"):
            mount("--bind", f"/run/simfleet/{name}", f"/etc/ssh/{name}")
    sshd = start_sshd()
    from simnode import state

    state.kernel_log(f"Linux version 6.1.0-simfleet (node {config['name']})")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        # As PID 1: reap orphans (a real init does), restart sshd if it died, keep meminfo true.
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        if sshd.poll() is not None:
            sshd = start_sshd()
        with contextlib.suppress(OSError), state.locked():
            state.publish()
        time.sleep(0.1)


if __name__ == "__main__":
    main()
