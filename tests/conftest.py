"""Shared world: one user per role, logged-in clients, and a real Redis."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import make_user


@pytest.fixture(scope="session")
def django_db_modify_db_settings(tmp_path_factory):
    """Give an SQLite test database a file, so subprocesses (the CLI, the panel) can see it."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    if db["ENGINE"].endswith("sqlite3"):
        db.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("db") / "test.sqlite3")


@pytest.fixture
def viewer(db):
    return make_user("vera", "viewer")


@pytest.fixture
def operator(db):
    return make_user("otto", "operator")


@pytest.fixture
def admin_user(db):
    return make_user("ada", "admin")


def _client_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(viewer) -> Client:
    return _client_for(viewer)


@pytest.fixture
def operator_client(operator) -> Client:
    return _client_for(operator)


@pytest.fixture
def admin_client_(admin_user) -> Client:
    return _client_for(admin_user)
