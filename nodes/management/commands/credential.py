"""``manage.py credential add|list``: SSH private keys, stored encrypted."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from nodes import ssh
from nodes.domain.inventory import check_node_name
from nodes.management.cli import (
    OneLineCommand,
    OneLineParser,
    add_actor_argument,
    read_small,
    resolve_actor,
)
from nodes.models import SshCredential
from nodes.models.choices import Role
from nodes.services.credentials import create_credential


class Command(OneLineCommand):
    help = "Store SSH private keys (encrypted) and list them."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
        add = sub.add_parser("add", help="Store a private key; it is never shown again.")
        add.add_argument("name")
        add.add_argument("--key-file", required=True)
        add.add_argument("--passphrase-file", default="")
        add_actor_argument(add)
        listing = sub.add_parser("list", help="List stored keys (public parts only).")
        listing.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["action"] == "add":
            self.add(options)
        else:
            self.list(options)

    def add(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.ADMIN)
        if message := check_node_name(options["name"]):
            raise CommandError(f"NAME: {message}")
        if SshCredential.objects.filter(name=options["name"]).exists():
            raise CommandError(f"a key named {options['name']!r} exists already")
        text = read_small(options["key_file"], "--key-file")
        passphrase = (
            read_small(options["passphrase_file"], "--passphrase-file").removesuffix("\n")
            if options["passphrase_file"]
            else None
        )
        try:
            credential = create_credential(options["name"], text, passphrase, actor=actor)
        except ssh.RemoteError as exc:
            raise CommandError(f"--key-file: {exc.message}") from None
        self.stderr.write(
            f"Stored {credential.name}: {credential.key_type} {credential.fingerprint}"
        )

    def list(self, options: dict[str, Any]) -> None:
        rows = [
            {"name": c.name, "key_type": c.key_type, "fingerprint": c.fingerprint}
            for c in SshCredential.objects.all()
        ]
        if options["json"]:
            self.stdout.write(json.dumps({"credentials": rows}, indent=2))
            return
        for row in rows:
            self.stdout.write(f"{row['name']:<24} {row['key_type']:<12} {row['fingerprint']}")
