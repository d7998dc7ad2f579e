"""``manage.py node add|list|show``: the node inventory from a shell.

With ``--json`` stdout holds exactly one JSON document (sizes in integer bytes); every message
goes to stderr. Bad input exits 1 with a one-line reason.
"""

from __future__ import annotations

import json
from typing import Any

from celery.exceptions import TimeoutError as CeleryTimeout
from django.core.management.base import CommandError, CommandParser
from django.db import transaction
from kombu.exceptions import OperationalError
from redis.exceptions import RedisError

from controlpanel.celery import app as celery_app
from nodes import ssh
from nodes.domain.units import UnitError, format_bytes, split_size
from nodes.forms.inventory import NodeForm
from nodes.management.cli import (
    OneLineCommand,
    OneLineParser,
    add_actor_argument,
    read_small,
    resolve_actor,
)
from nodes.models import Node, SshCredential
from nodes.models.choices import Role
from nodes.queue import QueueUnavailable, send
from nodes.services import hostkeys
from nodes.services.audit import record
from nodes.services.credentials import create_credential, readable, replace_key
from nodes.services.inventory import save_node
from nodes.workflows import discovery


class Command(OneLineCommand):
    help = "Add, list and show nodes in the inventory."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)

        add = sub.add_parser("add", help="Register a node by hand.")
        add.add_argument("name")
        add.add_argument("--host", required=True, help="SSH host name or IP address.")
        add.add_argument("--port", type=int, default=22, help="SSH port (default 22).")
        add.add_argument("--user", default="root", help="SSH user (default root).")
        add.add_argument(
            "--key-file", default="", help="Private key to store (encrypted) and use for this node."
        )
        add.add_argument("--passphrase-file", default="", help="File holding the key's passphrase.")
        add.add_argument("--credential", default="", help="Use a stored SSH key by name instead.")
        add.add_argument("--python", default="python3", help="The node's SGLang interpreter.")
        add.add_argument(
            "--trust-host-key",
            action="store_true",
            help="Fetch the node's SSH host key now and trust it (prints its fingerprint).",
        )
        add.add_argument("--gpus", type=int, default=0, help="Number of GPUs.")
        add.add_argument("--gpu-name", default="", help='GPU model, e.g. "NVIDIA H200".')
        add.add_argument("--gpu-memory", help="Memory per GPU with its unit: 96GiB or 103GB.")
        add.add_argument("--host-ram", help="Host RAM with its unit: 449GB or 418GiB.")
        add.add_argument("--labels", default="", help="Comma-separated labels.")
        add.add_argument("--notes", default="")
        add_actor_argument(add)

        trust = sub.add_parser(
            "trust-host-key",
            help="Show the host key a node presents; with --fingerprint, trust it if it matches.",
        )
        trust.add_argument("name")
        trust.add_argument(
            "--fingerprint", default="", help="The SHA256:… you checked on the node."
        )
        add_actor_argument(trust)

        discover = sub.add_parser("discover", help="Learn the node's hardware over SSH.")
        discover.add_argument("name")
        discover.add_argument(
            "--inline", action="store_true", help="Run here instead of through a Celery worker."
        )
        discover.add_argument("--json", action="store_true", help="Print one JSON document.")
        discover.add_argument("--timeout", type=float, default=180.0, help="Seconds (> 0).")
        add_actor_argument(discover)

        for verb, text in (("list", "List nodes."), ("show", "Show one node.")):
            p = sub.add_parser(verb, help=text)
            if verb == "show":
                p.add_argument("name")
            p.add_argument("--json", action="store_true", help="Print one JSON document.")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        if action == "add":
            self.add(options)
        elif action == "discover":
            self.discover(options)
        elif action == "trust-host-key":
            self.trust(options)
        elif action == "list":
            self.list(options)
        else:
            self.show(options)

    def add(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.ADMIN)
        data: dict[str, Any] = {
            "name": options["name"],
            "host": options["host"],
            "port": options["port"],
            "ssh_user": options["user"],
            "sglang_python": options["python"],
            "gpu_count": options["gpus"],
            "gpu_name": options["gpu_name"],
            "labels_text": options["labels"],
            "notes": options["notes"],
        }
        data.update(_size_data("gpu_memory", options["gpu_memory"], "--gpu-memory"))
        data.update(_size_data("host_ram", options["host_ram"], "--host-ram"))
        host_key = None
        if options["trust_host_key"]:
            precheck = NodeForm(data)
            if not precheck.is_valid():  # a bad host must not be contacted at all
                raise CommandError(_first_error(precheck))
            try:
                host_key = ssh.fetch_host_key(options["host"], options["port"])
            except ssh.RemoteError as exc:
                raise CommandError(f"--trust-host-key: {exc.message}") from None
        with transaction.atomic():
            credential = self._credential(options, actor)
            if credential is not None:
                data["credential"] = credential.pk
            form = NodeForm(data)
            if not form.is_valid():
                raise CommandError(_first_error(form))
            node = save_node(form.save, before=form.snapshot_before, actor=actor)
            if host_key is not None:
                offered = Node.objects.filter(pk=node.pk)
                offered.update(
                    offered_host_key=host_key.line,
                    offered_host_key_fingerprint=host_key.fingerprint,
                )
                node.refresh_from_db()
                hostkeys.trust_host_key(node, host_key.fingerprint, actor=actor)
        self.stderr.write(f"Added node {node.name} ({node.gpu_summary()}).")
        if host_key is not None:
            self.stderr.write(f"Trusted host key {host_key.fingerprint} of {node.host}.")

    def _credential(self, options: dict[str, Any], actor: Any) -> SshCredential | None:
        if options["credential"]:
            found = SshCredential.objects.filter(name=options["credential"]).first()
            if found is None:
                raise CommandError(
                    f"--credential: no stored SSH key named {options['credential']!r}"
                )
            return found
        if not options["key_file"]:
            return None
        text = read_small(options["key_file"], "--key-file")
        passphrase = (
            read_small(options["passphrase_file"], "--passphrase-file").removesuffix("\n")
            if options["passphrase_file"]
            else None
        )
        try:
            parsed = ssh.parse_private_key(text, passphrase)
        except ssh.RemoteError as exc:
            raise CommandError(f"--key-file: {exc.message}") from None
        existing = SshCredential.objects.filter(fingerprint=parsed.fingerprint).first()
        if existing is not None:
            if not readable(existing):
                replace_key(existing, text, passphrase, actor=actor)
            return existing
        return create_credential(_free_key_name(options["name"]), text, passphrase, actor=actor)

    def trust(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.ADMIN)
        node = Node.objects.filter(name=options["name"]).first()
        if node is None:
            raise CommandError(f"no node named {options['name']!r}")
        try:
            key = hostkeys.offer_host_key(node, actor=actor)
        except ssh.RemoteError as exc:
            raise CommandError(exc.message) from None
        if not options["fingerprint"]:
            self.stdout.write(key.fingerprint)
            self.stderr.write(
                f"{node.name} ({node.host}) presents {key.fingerprint}. Check it on the node "
                f"(ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), then run this again "
                f"with --fingerprint {key.fingerprint}"
            )
            return
        node.refresh_from_db()
        try:
            hostkeys.trust_host_key(node, options["fingerprint"], actor=actor)
        except ssh.RemoteError:
            raise CommandError(
                f"--fingerprint: {node.name} presents {key.fingerprint}, not "
                f"{options['fingerprint']}; nothing was trusted"
            ) from None
        self.stderr.write(f"Trusted host key {key.fingerprint} of {node.name}.")

    def discover(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.OPERATOR)
        if options["timeout"] <= 0:
            raise CommandError("--timeout: give a number of seconds above 0")
        node = Node.objects.filter(name=options["name"]).first()
        if node is None:
            raise CommandError(f"no node named {options['name']!r}")
        self.stderr.write(f"Discovering {node.name} ({node.ssh_user}@{node.host}:{node.port})…")
        try:
            doc = self._discovered(node, actor, options)
        except CommandError as exc:
            doc = {"error": str(exc), "kind": "not_run"}
        if options["json"]:
            self.stdout.write(json.dumps({"name": node.name, **doc}, indent=2))
        else:
            self._print_facts(node.name, doc)
        if "error" in doc:
            if not options["json"]:
                raise CommandError(f"{node.name}: {doc['error']}")
            self.stderr.write(f"{node.name}: {doc['error']}")
            raise SystemExit(1)

    def _discovered(self, node: Node, actor: Any, options: dict[str, Any]) -> dict[str, Any]:
        """The discovery's JSON, run here (``--inline``) or by a worker; errors as JSON too."""
        if options["inline"]:
            try:
                return discovery.discover(node.pk, actor=actor).to_json()
            except ssh.RemoteError as exc:
                return {"error": exc.message, "kind": exc.kind}
        try:
            if not celery_app.control.ping(timeout=1.0):
                raise CommandError(
                    "no Celery worker answers: start the panel (./run) or use --inline"
                )
            result = send("nodes.discover_node", node.pk)
        except (OperationalError, RedisError, QueueUnavailable):
            raise CommandError("the task queue (Redis) does not answer; try --inline") from None
        record("node.discover", actor=actor, obj=node)
        try:
            doc: dict[str, Any] = result.get(timeout=options["timeout"])
        except CeleryTimeout:
            raise CommandError(f"no result within {options['timeout']:g} s") from None
        return doc

    def list(self, options: dict[str, Any]) -> None:
        nodes = Node.objects.prefetch_related("gpus").select_related("credential")
        if options["json"]:
            self.stdout.write(json.dumps({"nodes": [n.audit_snapshot() for n in nodes]}, indent=2))
            return
        rows = [("NAME", "ADDRESS", "GPUS", "HOST RAM", "STATUS")]
        for n in nodes:
            ram = format_bytes(n.host_ram_bytes, "GB") if n.host_ram_bytes else "unknown"
            address = f"{n.ssh_user}@{n.host}:{n.port}"
            rows.append((n.name, address, n.gpu_summary(), ram, n.status))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))

    def show(self, options: dict[str, Any]) -> None:
        node = Node.objects.prefetch_related("gpus").filter(name=options["name"]).first()
        if node is None:
            raise CommandError(f"no node named {options['name']!r}")
        snapshot = node.audit_snapshot()
        if options["json"]:
            self.stdout.write(json.dumps(snapshot, indent=2))
            return
        ram = format_bytes(node.host_ram_bytes, "GB") if node.host_ram_bytes else "unknown"
        self.stdout.write(f"{node.name}  {node.ssh_user}@{node.host}:{node.port}  [{node.status}]")
        self.stdout.write(f"  GPUs:     {node.gpu_summary()}")
        self.stdout.write(f"  Host RAM: {ram}")
        self.stdout.write(f"  Status:   {node.status} {node.status_reason}".rstrip())
        self.stdout.write(f"  SSH key:  {snapshot['credential'] or 'none (agent)'}")
        self.stdout.write(f"  Host key: {node.host_key_fingerprint or 'not trusted'}")
        self.stdout.write(f"  SGLang:   {node.sglang_version or 'unknown'} ({node.sglang_python})")
        seen = node.last_seen.isoformat(timespec="seconds") if node.last_seen else "never"
        self.stdout.write(f"  Last seen: {seen}")
        for gpu in node.gpus.all():
            used = format_bytes(gpu.memory_used_bytes) if gpu.memory_used_bytes is not None else "?"
            self.stdout.write(
                f"    GPU {gpu.index}: {gpu.name}  {used} / {format_bytes(gpu.memory_total_bytes)}"
            )
        if node.labels:
            self.stdout.write(f"  Labels:   {', '.join(node.labels)}")

    def _print_facts(self, name: str, doc: dict[str, Any]) -> None:
        if "error" in doc:
            return
        self.stdout.write(f"{name}: {len(doc['gpus'])} GPUs via {doc['gpu_source'] or 'nothing'}")
        for gpu in doc["gpus"]:
            used, total = gpu["memory_used_bytes"], gpu["memory_total_bytes"]
            self.stdout.write(
                f"  GPU {gpu['index']}: {gpu['name']}  {format_bytes(used)} / {format_bytes(total)}"
            )
        if doc["host_ram_bytes"]:
            total, available = doc["host_ram_bytes"], doc["mem_available_bytes"] or 0
            self.stdout.write(
                f"  host RAM {format_bytes(total, 'GB')}, available {format_bytes(available, 'GB')}"
            )
        self.stdout.write(f"  SGLang {doc['sglang_version'] or 'not found'}")
        for problem in doc["problems"]:
            self.stdout.write(f"  PROBLEM: {problem}")


def _free_key_name(node_name: str) -> str:
    """``<node>-key``, or ``<node>-key-2``, … : the first free, valid credential name."""
    base = f"{node_name[:54].rstrip('-._')}-key"
    for n in range(1, 1000):
        name = base if n == 1 else f"{base}-{n}"
        if not SshCredential.objects.filter(name=name).exists():
            return name
    raise CommandError("too many stored keys named after this node; use --credential")


def _size_data(field: str, text: str | None, flag: str) -> dict[str, Any]:
    """Turn ``"96GiB"`` into the size field's two form inputs; a missing unit is an error."""
    if text is None:
        return {}
    try:
        number, unit = split_size(text)
    except UnitError as exc:
        if "unknown unit" in str(exc):
            raise CommandError(f"{flag}: {text!r}: give the size in GB or GiB") from None
        raise CommandError(f"{flag}: {exc}") from None
    if unit not in ("GB", "GiB"):
        raise CommandError(f"{flag}: {text!r}: give the size in GB or GiB, not {unit}")
    return {f"{field}_0": str(number), f"{field}_1": unit}


def _first_error(form: NodeForm) -> str:
    """One line naming the first bad field the way the CLI spells it."""
    flags = {
        "name": "NAME",
        "host": "--host",
        "port": "--port",
        "ssh_user": "--user",
        "credential": "--key-file",
        "sglang_python": "--python",
        "gpu_count": "--gpus",
        "gpu_name": "--gpu-name",
        "gpu_memory": "--gpu-memory",
        "host_ram": "--host-ram",
        "labels_text": "--labels",
    }
    field, errors = next(iter(form.errors.items()))
    return f"{flags.get(field, field)}: {' '.join(str(e) for e in errors)}"
