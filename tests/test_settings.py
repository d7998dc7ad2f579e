"""Settings come from the environment; with none at all, every command still works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from controlpanel.env import env_bool, env_secret

ROOT = Path(__file__).resolve().parent.parent


def _run_settings(tmp_path: Path, expr: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY", "DEBUG"}
    }
    clean.update({"RANKWISE_STATE_DIR": str(tmp_path / "state"), **env})
    code = f"import django; django.setup(); from django.conf import settings as s; print(({expr},))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "controlpanel.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return result


def _settings_in_subprocess(tmp_path: Path, expr: str, **env: str) -> str:
    result = _run_settings(tmp_path, expr, **env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DATABASE_URL": "garbage"}, "DATABASE_URL is not a database URL"),
        ({"TIME_ZONE": "Mars/Olympus"}, "TIME_ZONE='Mars/Olympus' is not a time zone"),
        ({"LOG_LEVEL": "LOUD"}, "LOG_LEVEL='LOUD'"),
        ({"DEBUG": "maybe"}, "DEBUG='maybe' is not a boolean"),
        ({"RANKWISE_ENCRYPTION_KEY": "garbage"}, "RANKWISE_ENCRYPTION_KEY is not a Fernet key"),
        ({"ALLOWED_HOSTS": ""}, "ALLOWED_HOSTS is empty"),
        ({"RANKWISE_STATE_DIR": "/etc/hostname"}, "is not a usable folder"),
    ],
)
def test_bad_settings_fail_naming_the_variable(tmp_path, env, message):
    result = _run_settings(tmp_path, "s.DEBUG", **env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr


def test_defaults_give_sqlite_in_wal_mode_and_keep_generated_secrets(tmp_path):
    expr = "s.DATABASES['default']['ENGINE'], s.DATABASES['default']['NAME'], s.SECRET_KEY"
    first = _settings_in_subprocess(tmp_path, expr)
    assert "sqlite3" in first and str(tmp_path / "state" / "rankwise.sqlite3") in first
    assert _settings_in_subprocess(tmp_path, expr) == first  # same secret on the next start
    key_file = tmp_path / "state" / "secret_key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    assert (tmp_path / "state" / "rankwise_encryption_key").exists()
    pragma = _settings_in_subprocess(
        tmp_path,
        "__import__('django.db').db.connection.cursor().execute('PRAGMA journal_mode').fetchone()",
    )
    assert pragma == "(('wal',),)"


def _mode(path: Path) -> str:
    return oct(path.stat().st_mode & 0o777)


def test_the_state_folder_and_its_database_are_for_their_owner_alone(tmp_path):
    """Found by a team lead: ``var/`` was 0755 and the database 0644 while they hold the
    sessions, password hashes and audit trail of every user. Whichever command comes first (here
    ``manage.py migrate``, a real process, as after a fresh clone) makes them owner-only."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "SECRET_KEY"}}
    state = tmp_path / "state"
    migrate = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input"],
        cwd=ROOT,
        env={**env, "RANKWISE_STATE_DIR": str(state), "DJANGO_SETTINGS_MODULE": "tests.settings"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert migrate.returncode == 0, migrate.stderr
    assert _mode(state) == "0o700"
    written = [p for p in state.iterdir() if p.is_file()]
    assert {p.name for p in written} >= {"rankwise.sqlite3", "secret_key"}
    assert {p.name: _mode(p) for p in written} == {p.name: "0o600" for p in written}


def test_an_existing_open_state_folder_is_narrowed(tmp_path):
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    database = state / "rankwise.sqlite3"
    database.touch()
    database.chmod(0o644)
    _settings_in_subprocess(tmp_path, "s.DATABASES['default']['NAME']")
    assert (_mode(state), _mode(database)) == ("0o700", "0o600")


def test_postgres_url_is_understood(tmp_path):
    out = _settings_in_subprocess(
        tmp_path,
        "s.DATABASES['default']['ENGINE'], s.DATABASES['default']['HOST']",
        DATABASE_URL="postgres://postgres@127.0.0.1:5432/test",
    )
    assert out == "('django.db.backends.postgresql', '127.0.0.1')"


def test_environment_wins_over_dotenv(tmp_path):
    env_file = ROOT / ".env"
    if env_file.exists():
        pytest.skip("a developer .env exists; not touching it")
    env_file.write_text("ALLOWED_HOSTS=from-dotenv\nTIME_ZONE=Europe/Paris\n")
    try:
        out = _settings_in_subprocess(
            tmp_path, "s.ALLOWED_HOSTS, s.TIME_ZONE", ALLOWED_HOSTS="from-env"
        )
    finally:
        env_file.unlink()
    assert out == "(['from-env'], 'Europe/Paris')"


def test_secret_file_variable_is_read(tmp_path, monkeypatch):
    secret = tmp_path / "key"
    secret.write_text("s3cret\n")
    monkeypatch.delenv("TOKEN", raising=False)
    monkeypatch.setenv("TOKEN_FILE", str(secret))
    assert env_secret("TOKEN", tmp_path, lambda: "unused") == "s3cret"
    monkeypatch.setenv("TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ImproperlyConfigured, match="TOKEN_FILE"):
        env_secret("TOKEN", tmp_path, lambda: "unused")


@pytest.mark.parametrize(("raw", "value"), [("true", True), ("False", False), ("1", True)])
def test_env_bool(monkeypatch, raw, value):
    monkeypatch.setenv("FLAG", raw)
    assert env_bool("FLAG", not value) is value


def test_env_bool_rejects_nonsense(monkeypatch):
    monkeypatch.setenv("FLAG", "maybe")
    with pytest.raises(ImproperlyConfigured, match="FLAG='maybe'"):
        env_bool("FLAG", False)


def test_celery_broker_is_the_real_redis():
    from controlpanel.celery import app

    assert redis.Redis.from_url(settings.REDIS_URL).ping() is True
    assert settings.CELERY_BROKER_URL == settings.REDIS_URL
    with app.connection_for_write() as connection:
        connection.ensure_connection(max_retries=1)


def test_the_mail_server_comes_from_the_environment_and_its_password_from_a_file(tmp_path):
    """Found by a newcomer: the docs told them to set Django's EMAIL_* settings, which the
    settings never read."""
    secret = tmp_path / "smtp-password"
    secret.write_text("s3cret\n")
    shown = _settings_in_subprocess(
        tmp_path,
        "s.EMAIL_HOST, s.EMAIL_PORT, s.EMAIL_HOST_USER, s.EMAIL_HOST_PASSWORD, s.EMAIL_USE_TLS",
        EMAIL_HOST="smtp.example.net",
        EMAIL_PORT="587",
        EMAIL_HOST_USER="rankwise",
        EMAIL_HOST_PASSWORD_FILE=str(secret),
        EMAIL_USE_TLS="true",
    )
    assert shown == "('smtp.example.net', 587, 'rankwise', 's3cret', True)"
    both = _run_settings(tmp_path, "s.DEBUG", EMAIL_USE_TLS="true", EMAIL_USE_SSL="true")
    assert both.returncode != 0 and "set one of them, not both" in both.stderr
    missing = _run_settings(tmp_path, "s.DEBUG", EMAIL_HOST_PASSWORD_FILE=str(tmp_path / "none"))
    assert missing.returncode != 0 and "EMAIL_HOST_PASSWORD_FILE=" in missing.stderr
