"""The operator CLI, run as a user would run it: a subprocess with its own stdout and stderr."""

from __future__ import annotations

import json
import subprocess

import pytest

from nodes.models import AuditEntry, Node
from tests.conftest import manage_in_process, manage_py
from tests.factories import logs_in

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def manage(settings):
    """Run ``manage.py`` against the test database, returning the completed process."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return manage_py(settings, *args, env=env)

    return run


@pytest.fixture
def refuse():
    """The same entry point in this process: for refusals and argument errors, which show
    nothing more from a process of their own (the tests above run real processes)."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return manage_in_process(*args, env=env)

    return run


@pytest.fixture(autouse=True)
def _file_database(settings, tmp_path):
    # An in-memory SQLite test database is invisible to a subprocess; a file one is not.
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3") and ":memory:" in str(
        settings.DATABASES["default"]["NAME"]
    ):
        pytest.skip("needs a file-backed test database (set by tests/conftest.py)")


INCIDENT_NODE = [
    "node",
    "add",
    "gpu-01",
    "--host",
    "10.0.0.5",
    "--gpus",
    "8",
    "--gpu-name",
    "NVIDIA H200",
    "--gpu-memory",
    "96GiB",
    "--host-ram",
    "449GB",
]


def test_add_then_show_json_has_integer_bytes_and_nothing_else_on_stdout(manage):
    added = manage(*INCIDENT_NODE)
    assert added.returncode == 0, added.stderr
    assert added.stdout == ""
    assert "Added node gpu-01" in added.stderr

    shown = manage("node", "show", "gpu-01", "--json")
    doc = json.loads(shown.stdout)
    assert doc["name"] == "gpu-01"
    assert doc["host"] == "10.0.0.5" and doc["port"] == 22 and doc["user"] == "root"
    assert doc["host_ram_bytes"] == 449_000_000_000
    assert [g["index"] for g in doc["gpus"]] == list(range(8))
    assert {g["memory_total_bytes"] for g in doc["gpus"]} == {96 * 2**30}
    assert {g["name"] for g in doc["gpus"]} == {"NVIDIA H200"}
    assert doc["status"] == "unknown" and doc["last_seen"] is None


def test_list_json_holds_every_node(manage):
    manage(*INCIDENT_NODE)
    manage("node", "add", "gpu-02", "--host", "gpu-02.example.net", "--port", "2222")
    doc = json.loads(manage("node", "list", "--json").stdout)
    assert [n["name"] for n in doc["nodes"]] == ["gpu-01", "gpu-02"]
    assert doc["nodes"][1]["port"] == 2222 and doc["nodes"][1]["gpus"] == []
    assert doc["nodes"][1]["host_ram_bytes"] is None


def test_plain_list_shows_units(manage):
    manage(*INCIDENT_NODE)
    out = manage("node", "list").stdout
    assert "8 × NVIDIA H200 · 96 GiB" in out and "449 GB" in out


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--gpu-memory", "96"], "--gpu-memory: '96' has no unit"),
        (["--host-ram", "449"], "--host-ram: '449' has no unit"),
        (["--gpu-memory", "96MiB"], "--gpu-memory: '96MiB': give the size in GB or GiB, not MiB"),
        (["--host-ram", "449gb"], "--host-ram: '449gb': give the size in GB or GiB"),
        (["--gpu-memory", "-96GiB"], "--gpu-memory: '-96GiB' is not a size"),
        (
            ["--gpu-memory", "9000GiB"],
            "--gpu-memory: 9000 GiB (9,663,676,416,000 bytes) per GPU is outside",
        ),
        (["--host", "a;rm -rf /"], "--host: 'a;rm -rf /' is not a valid host name"),
        (["--port", "99999"], "--port: A port is a number from 1 to 65535."),
    ],
)
def test_bad_input_exits_non_zero_with_one_line_and_saves_nothing(refuse, args, reason):
    argv = list(INCIDENT_NODE)
    for flag, value in zip(args[::2], args[1::2], strict=True):
        if flag in argv:
            at = argv.index(flag)
            del argv[at : at + 2]
        argv.append(f"{flag}={value}")
    result = refuse(*argv)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and reason in lines[0], result.stderr
    assert not Node.objects.exists()


def test_duplicate_name_is_refused(refuse):
    refuse(*INCIDENT_NODE)
    result = refuse(*INCIDENT_NODE)
    assert result.returncode == 1
    assert "NAME: Node with this Name already exists." in result.stderr
    assert Node.objects.count() == 1


def test_usage_errors_are_one_line_with_status_2(refuse):
    result = refuse("node", "add", "gpu-01", "--host", "h", "--port", "ssh")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "manage.py node add: error: argument --port: invalid int value: 'ssh'"
    ]
    assert not Node.objects.exists()


def test_show_unknown_node_fails(refuse):
    result = refuse("node", "show", "nope", "--json")
    assert result.returncode == 1 and result.stdout == ""
    assert "no node named 'nope'" in result.stderr


def test_actor_is_recorded_and_defaults_to_cli(manage):
    assert manage(*INCIDENT_NODE).returncode == 0
    entry = AuditEntry.objects.get(action="node.create")
    assert entry.actor_name == "cli" and entry.after["host_ram_bytes"] == 449 * 10**9

    assert manage("user", "add", "ops", "--role", "admin").returncode == 0
    added = manage("node", "add", "gpu-09", "--host", "h9", RANKWISE_ACTOR="ops")
    assert added.returncode == 0, added.stderr
    assert AuditEntry.objects.get(object_repr="gpu-09").actor_name == "ops"


def test_a_viewer_actor_cannot_add_nodes(refuse):
    refuse("user", "add", "vera", "--role", "viewer")
    result = refuse(*INCIDENT_NODE, "--actor", "vera")
    assert result.returncode == 1
    assert "lacks the admin role" in result.stderr
    assert not Node.objects.exists()


def test_user_add_prints_password_once_and_it_logs_in(manage, client):
    result = manage("user", "add", "otto", "--role", "operator")
    password = result.stdout.strip()
    assert result.returncode == 0 and len(password) >= 12
    assert logs_in(client, "otto", password)
    roles = json.loads(manage("user", "list", "--json").stdout)["users"]
    assert {"username": "otto", "role": "operator"} in roles


@pytest.mark.parametrize(
    "argv",
    [["node"], ["node", "bogus"], ["node", "list", "--json", "-v", "9"], ["user", "add", "x"]],
)
def test_every_usage_error_is_one_line(refuse, argv):
    result = refuse(*argv)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize(
    ("username", "reason"),
    [("", "username ''"), ("a b", "Enter a valid username"), ("x" * 151, "at most 150")],
)
def test_user_add_refuses_bad_usernames(refuse, username, reason):
    result = refuse("user", "add", username, "--role", "viewer")
    assert result.returncode == 1 and reason in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_user_add_refuses_weak_password(refuse):
    result = refuse("user", "add", "wendy", "--role", "viewer", "--password", "1")
    assert result.returncode == 1 and "--password: This password is too short" in result.stderr


def test_empty_actor_is_refused_not_treated_as_cli(refuse):
    assert "--actor is empty" in refuse(*INCIDENT_NODE, "--actor", "").stderr
    assert "RANKWISE_ACTOR is empty" in refuse(*INCIDENT_NODE, RANKWISE_ACTOR="").stderr
    assert not Node.objects.exists()


def test_set_role_refuses_the_cli_account_and_superusers(refuse, django_user_model):
    django_user_model.objects.create_superuser("root-su", password=None)
    cli = refuse("user", "set-role", "cli", "viewer")
    assert cli.returncode == 1 and "always an admin" in cli.stderr
    su = refuse("user", "set-role", "root-su", "viewer")
    assert su.returncode == 1 and "superuser" in su.stderr
    assert refuse(*INCIDENT_NODE).returncode == 0


def test_key_file_is_stored_encrypted_as_a_credential(manage, tmp_path):
    import subprocess

    from nodes.models import SshCredential

    missing = manage(*INCIDENT_NODE, "--key-file", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "--key-file: cannot read" in missing.stderr
    junk = tmp_path / "junk"
    junk.write_text("not a key")
    refused = manage(*INCIDENT_NODE, "--key-file", str(junk))
    assert refused.returncode == 1 and "not an OpenSSH or PEM private key" in refused.stderr
    assert not Node.objects.exists() and not SshCredential.objects.exists()
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    added = manage(*INCIDENT_NODE, "--key-file", str(key))
    assert added.returncode == 0, added.stderr
    doc = json.loads(manage("node", "show", "gpu-01", "--json").stdout)
    assert doc["credential"] == "gpu-01-key"
    secret = key.read_text().splitlines()[1]
    stored = SshCredential.objects.get()
    assert secret not in bytes(stored.encrypted_private_key).decode(errors="replace")
    assert stored.public_key.startswith("ssh-ed25519 ")


def test_passphrase_files_keep_their_spaces(manage, tmp_path):
    import subprocess

    key = tmp_path / "id_spaced"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", " pw with spaces ", "-f", str(key)], check=True
    )
    (tmp_path / "pass").write_text(" pw with spaces \n")
    added = manage(
        "credential",
        "add",
        "spaced",
        "--key-file",
        str(key),
        "--passphrase-file",
        str(tmp_path / "pass"),
    )
    assert added.returncode == 0, added.stderr


def test_discover_timeout_must_be_positive(refuse):
    refuse(*INCIDENT_NODE)
    result = refuse("node", "discover", "gpu-01", "--timeout", "0")
    assert result.returncode == 1 and "--timeout" in result.stderr
