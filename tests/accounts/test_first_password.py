"""The first admin's generated password: kept in an owner-only file, never printed (``./run``'s
output can go to ``nohup.out`` or the journal), and forgotten once it is changed, so the file
never holds a stale password (found by an adversarial pass)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import reverse

from tests.conftest import manage_in_process
from tests.factories import logs_in, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def state(settings, tmp_path):
    settings.STATE_DIR = tmp_path / "state"
    return settings.STATE_DIR


def _first_admin(state) -> tuple[str, str]:
    done = manage_in_process("ensure_admin")
    assert done.returncode == 0, done.stderr
    kept = state / "admin_password"
    username, password = kept.read_text().split()
    assert password not in done.stdout + done.stderr
    assert str(kept) in done.stdout
    assert oct(kept.stat().st_mode & 0o777) == "0o600"
    return username, password


def test_the_first_password_is_kept_not_printed_and_logs_in(state):
    username, password = _first_admin(state)
    assert username == "admin"
    assert logs_in(Client(), "admin", password)
    # A second run changes nothing and says nothing of a password.
    again = manage_in_process("ensure_admin")
    assert again.returncode == 0 and again.stdout == ""
    assert (state / "admin_password").read_text().split() == ["admin", password]


def test_changing_the_password_on_the_account_page_forgets_the_kept_one(state):
    _, password = _first_admin(state)
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    new = "a-brand-new-and-long-passphrase"
    answer = client.post(
        reverse("password_change"),
        {"old_password": password, "new_password1": new, "new_password2": new},
    )
    assert answer.status_code == 302
    assert not (state / "admin_password").exists()


def test_the_kept_password_stays_while_it_is_still_the_password(state):
    _, password = _first_admin(state)
    admin = get_user_model().objects.get(username="admin")
    admin.email = "admin@example.com"
    admin.save()  # another field
    admin.set_password(password)
    admin.save()  # the same password, hashed again (as a hasher upgrade at login does)
    olga = make_user("olga", "operator")
    olga.set_password("something-else-entirely")
    olga.save()  # another account
    assert (state / "admin_password").read_text().split() == ["admin", password]
    admin.set_password("changed-by-manage-py-changepassword")
    admin.save(update_fields=["password"])
    assert not (state / "admin_password").exists()
