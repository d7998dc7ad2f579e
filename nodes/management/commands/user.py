"""``manage.py user add|set-role|list``: accounts and their role, from a shell."""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError, CommandParser
from django.db import transaction

from nodes.management.cli import OneLineCommand, OneLineParser, add_actor_argument, resolve_actor
from nodes.models.choices import ROLE_ORDER, Role
from nodes.services.audit import record
from nodes.services.roles import role_of


class Command(OneLineCommand):
    help = "Add users, change their role, list them."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=OneLineParser)
        roles = [role.value for role in ROLE_ORDER]

        add = sub.add_parser("add", help="Create a user; the password is printed once.")
        add.add_argument("username")
        add.add_argument("--role", choices=roles, required=True)
        add.add_argument(
            "--password",
            help="Use this password instead of a generated one (avoid on shared hosts).",
        )
        add_actor_argument(add)

        set_role = sub.add_parser("set-role", help="Give a user a different role.")
        set_role.add_argument("username")
        set_role.add_argument("role", choices=roles)
        add_actor_argument(set_role)

        listing = sub.add_parser("list", help="List users and roles.")
        listing.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        getattr(self, options["action"].replace("-", "_"))(options)

    def add(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.ADMIN)
        users = get_user_model().objects
        username = options["username"]
        field = get_user_model()._meta.get_field("username")
        try:
            field.clean(username, None)
        except ValidationError as exc:
            raise CommandError(f"username {username[:40]!r}: {' '.join(exc.messages)}") from None
        if users.filter(username__iexact=username).exists():
            raise CommandError(f"a user named {username!r} exists already")
        if options["password"] is not None:
            try:
                validate_password(options["password"], get_user_model()(username=username))
            except ValidationError as exc:
                raise CommandError(f"--password: {' '.join(exc.messages)}") from None
        password = options["password"] or secrets.token_urlsafe(12)
        with transaction.atomic():
            user = users.create_user(username=username, password=password)
            user.groups.set([Group.objects.get(name=options["role"])])
            record("user.create", actor=actor, obj=user, after={"role": options["role"]})
        self.stderr.write(f"Created {username} ({options['role']}).")
        if options["password"] is None:
            self.stdout.write(password)

    def set_role(self, options: dict[str, Any]) -> None:
        actor = resolve_actor(options["actor"], Role.ADMIN)
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user named {options['username']!r}")
        if user.get_username() == settings.RANKWISE_CLI_USER:
            raise CommandError("the built-in cli account is always an admin")
        if user.is_superuser:
            raise CommandError(
                f"{user.get_username()} is a superuser and so always an admin; "
                "remove superuser status in the Django admin first"
            )
        before = role_of(user)
        with transaction.atomic():
            user.groups.set([Group.objects.get(name=options["role"])])
            record(
                "user.set_role",
                actor=actor,
                obj=user,
                before={"role": before.value if before else None},
                after={"role": options["role"]},
            )
        self.stderr.write(f"{user.get_username()} is now {options['role']}.")

    def list(self, options: dict[str, Any]) -> None:
        rows = []
        for user in get_user_model().objects.order_by("username").prefetch_related("groups"):
            role = role_of(user)
            rows.append({"username": user.get_username(), "role": role.value if role else None})
        if options["json"]:
            self.stdout.write(json.dumps({"users": rows}, indent=2))
            return
        for row in rows:
            self.stdout.write(f"{row['username']:<24} {row['role'] or '(no role)'}")
