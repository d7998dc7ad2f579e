"""``manage.py ensure_admin``: on first run, create the ``admin`` account with a generated
password, kept in ``var/admin_password`` (git-ignored, mode 0600) until it is changed, and say
where it is. The password itself is never printed: ``./run``'s output may go to ``nohup.out`` or
the journal, readable long after. Later runs change nothing.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from nodes.models.choices import Role
from nodes.services import first_password
from nodes.services.audit import record


class Command(BaseCommand):
    help = "Create the first admin account if there is none, saying where its password is kept."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="admin")

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model().objects
        if (
            users.filter(groups__name=Role.ADMIN, is_active=True)
            .exclude(username=settings.RANKWISE_CLI_USER)
            .exists()
            or users.filter(is_superuser=True).exists()
        ):
            return
        username = options["username"]
        password = secrets.token_urlsafe(12)
        with transaction.atomic():
            user = users.filter(username=username).first() or users.create_user(username=username)
            user.set_password(password)
            user.is_staff = True
            user.is_superuser = True  # also the support account for /admin/
            user.save()
            user.groups.add(Group.objects.get(name=Role.ADMIN))
            record("user.create", actor=None, actor_name="setup", obj=user, after={"role": "admin"})
        kept = first_password.keep(username, password)
        self.stdout.write(
            f"Created the admin account {username!r}: its password is in {kept} "
            "(readable by you alone; the file goes once you change the password)."
        )
