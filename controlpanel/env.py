"""Strict readers for settings taken from the environment.

Every reader raises ``ImproperlyConfigured`` with the variable's name when a value is malformed, so
a typo in a deployment fails at start-up instead of silently picking a default.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    """Return the variable's value, or ``default`` when it is unset."""
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    """Return a boolean variable: true/1/yes/on or false/0/no/off (any case)."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean; use true or false.")


def env_int(name: str, default: int) -> int:
    """Return an integer variable."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None


def env_list(name: str, default: str) -> list[str]:
    """Return a comma-separated variable as a list of non-empty, stripped items."""
    return [item.strip() for item in env_str(name, default).split(",") if item.strip()]


def env_file(name: str) -> str:
    """The contents of the file ``NAME`` names (stripped), ``""`` when unset; raises
    ``ImproperlyConfigured`` naming the variable when the file cannot be read."""
    file_name = os.environ.get(name)
    if not file_name:
        return ""
    try:
        return Path(file_name).read_text().strip()
    except OSError as exc:
        raise ImproperlyConfigured(f"{name}={file_name!r} cannot be read: {exc}") from None


def env_secret(name: str, state_dir: Path, generate: Callable[[], str]) -> str:
    """Return a secret from ``NAME``, else from the file named by ``NAME_FILE``.

    With neither set, the secret is read from ``state_dir/<name in lower case>``, which is generated
    with ``generate()`` and written with mode 0600 on first use, so a fresh clone works with no
    environment at all and keeps the same secret across restarts.
    """
    value = os.environ.get(name)
    if value:
        return value
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE={file_name!r} cannot be read: {exc}") from None
    path = state_dir / name.lower()
    if not path.exists():
        state_dir.mkdir(parents=True, exist_ok=True)
        # O_EXCL makes two processes starting at once agree on one secret: the loser reads it.
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(generate() + "\n")
    return path.read_text().strip()


def random_token() -> str:
    """A URL-safe random string of 50 characters, fit for Django's SECRET_KEY."""
    return secrets.token_urlsafe(38)


def private_folder(path: Path) -> Path:
    """Create ``path`` (and missing parents) as owner-only (0700), or narrow an existing folder
    of ours to 0700: the state folder holds the sessions, password hashes, secrets and the
    audit trail, and any other local account could read a 0755 one. A folder owned by another
    user is left as it is (whoever set it up chose its mode). Returns ``path``."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _narrow(path, 0o700)
    return path


def private_file(path: Path) -> Path:
    """Create ``path`` empty as owner-only (0600) unless it exists, and narrow an existing file
    of ours to 0600. SQLite opens an empty file as a new database and gives its journal and WAL
    files the database file's mode, so creating it first keeps all of them private."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        _narrow(path, 0o600)
    return path


def _narrow(path: Path, mode: int) -> None:
    info = path.stat()
    if info.st_uid == os.getuid() and info.st_mode & 0o777 & ~mode:
        path.chmod(mode)
