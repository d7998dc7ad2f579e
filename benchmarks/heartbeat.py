"""Heartbeat of 50 simulated nodes: one sweep's wall time and the worker's CPU time, against
ansible-core's ad-hoc fact gathering (``ansible all -m setup``, default forks) on the same fleet.

Run as root from the project folder: ``.venv/bin/python benchmarks/heartbeat.py [--nodes 50]``.
It brings a fleet up in a temporary folder, registers it in a temporary SQLite database, installs
ansible-core (benchmarks/requirements.txt) into a virtualenv of its own, and tears all of it down.
Target: one sweep of 50 nodes in under 5 s on one worker, well ahead of ansible.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def bring_up(state: str, count: int) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "simfleet", "up", "--nodes", str(count), "--state", state, "--json"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return list(json.loads(out)["nodes"])


def register(nodes: list[dict[str, object]]) -> None:
    from django.core.management import call_command

    from nodes.management.cli import resolve_actor
    from nodes.models import Node
    from nodes.models.choices import Role
    from nodes.services.credentials import create_credential
    from nodes.services.hostkeys import offer_host_key, trust_host_key

    call_command("migrate", verbosity=0)
    actor = resolve_actor(None, Role.ADMIN)
    credential = create_credential(
        "bench", Path(str(nodes[0]["key_path"])).read_text(), None, actor=actor
    )
    for sim in nodes:
        node = Node.objects.create(
            name=str(sim["name"]), host=str(sim["host"]), ssh_user="root", credential=credential
        )
        key = offer_host_key(node, actor=actor)
        node.refresh_from_db()
        trust_host_key(node, key.fingerprint, actor=actor)


def rankwise_sweeps(rounds: int) -> list[tuple[float, float]]:
    from nodes.workflows.discovery import heartbeat_sweep

    figures = []
    for _ in range(rounds):
        cpu, wall = cpu_seconds(), time.perf_counter()
        outcomes = heartbeat_sweep()
        figures.append((time.perf_counter() - wall, cpu_seconds() - cpu))
        failed = [o for o in outcomes if o.facts is None]
        if failed:
            raise SystemExit(f"{len(failed)} nodes did not answer: {failed[0].error}")
    return figures


def ansible_sweep(nodes: list[dict[str, object]], work: Path) -> tuple[float, float]:
    venv = work / "ansible-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin/pip"),
            "install",
            "-q",
            "--require-hashes",
            "-r",
            str(ROOT / "benchmarks/requirements.txt"),
        ],
        check=True,
    )
    inventory = work / "inventory.ini"
    lines = ["[fleet]"] + [
        f"{n['name']} ansible_host={n['host']} ansible_user=root "
        f"ansible_ssh_private_key_file={n['key_path']} ansible_python_interpreter=/usr/bin/python3"
        for n in nodes
    ]
    inventory.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_STDOUT_CALLBACK": "json"}
    cpu, wall = cpu_seconds(resource.RUSAGE_CHILDREN), time.perf_counter()
    result = subprocess.run(
        [str(venv / "bin/ansible"), "all", "-i", str(inventory), "-m", "setup"],
        env=env,
        capture_output=True,
        text=True,
    )
    elapsed = time.perf_counter() - wall
    if result.returncode != 0:
        raise SystemExit(f"ansible failed: {result.stdout[-2000:]} {result.stderr[-2000:]}")
    return elapsed, cpu_seconds(resource.RUSAGE_CHILDREN) - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--skip-ansible", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rankwise-bench-") as tmp:
        work = Path(tmp)
        state = str(work / "fleet")
        os.environ.update(
            DATABASE_URL=f"sqlite:///{work / 'bench.sqlite3'}", RANKWISE_STATE_DIR=str(work / "var")
        )
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlpanel.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        try:
            nodes = bring_up(state, args.nodes)
            register(nodes)
            sweeps = rankwise_sweeps(args.rounds)
            ansible = None if args.skip_ansible else ansible_sweep(nodes, work)
        finally:
            subprocess.run([sys.executable, "-m", "simfleet", "down", "--state", state], cwd=ROOT)
    cold, warm = sweeps[0], sweeps[1:]
    warm_wall = sorted(w for w, _ in warm)[len(warm) // 2]
    warm_cpu = sorted(c for _, c in warm)[len(warm) // 2]
    print(f"nodes: {args.nodes}")
    print(f"rankwise first sweep (new connections): {cold[0]:.2f} s wall, {cold[1]:.2f} s CPU")
    print(
        f"rankwise sweep, connections reused (median of {len(warm)}): "
        f"{warm_wall:.2f} s wall, {warm_cpu:.2f} s CPU"
    )
    if ansible:
        print(
            f"ansible-core 'ansible all -m setup' (forks 5): {ansible[0]:.2f} s wall, "
            f"{ansible[1]:.2f} s CPU"
        )
        print(
            f"ratio ansible / rankwise (wall): {ansible[0] / warm_wall:.1f}x, "
            f"first sweep: {ansible[0] / cold[0]:.1f}x"
        )


if __name__ == "__main__":
    main()
