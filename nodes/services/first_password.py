"""The first admin's generated password, kept in the state folder (``admin_password``, mode
0600, one line ``USERNAME PASSWORD``) only until it stops being the password: it is never
printed, so it cannot end up in a terminal's scrollback, ``nohup.out`` or the journal, and the
file goes once the account's password is changed, so it never holds a stale one."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from django.conf import settings


def path() -> Path:
    """Where the first admin's password is kept."""
    return settings.STATE_DIR / "admin_password"


def keep(username: str, password: str) -> Path:
    """Write ``username``'s generated password, owner-only; returns the file's path."""
    target = path()
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{username} {password}\n")
    return target


def forget_if_changed(user: Any) -> bool:
    """Remove the kept password once it no longer logs ``user`` in (changed on the account
    page, by ``manage.py changepassword`` or by an admin); True when it was removed. Another
    account's save, or a save that kept the password (a re-hash on login), changes nothing."""
    target = path()
    try:
        username, _, password = target.read_text().strip().partition(" ")
    except FileNotFoundError:
        return False
    if username != user.get_username() or user.check_password(password):
        return False
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    return True
