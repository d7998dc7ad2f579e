"""Views for SSH keys, host keys, discovery and maintenance: roles, bad input, secrets kept."""

from __future__ import annotations

import subprocess

import pytest
from django.core import serializers
from django.urls import reverse

from nodes.models import AuditEntry, Node, NodeEvent, SshCredential
from tests.factories import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    plain, locked = folder / "id_ed25519", folder / "id_locked"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(plain)], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "s3cret-pass",
                    "-f", str(locked)], check=True)  # fmt: skip
    return plain.read_text(), locked.read_text()


def _body(key: str) -> list[str]:
    """The secret lines of a private key (between the BEGIN and END lines)."""
    return [line for line in key.splitlines()[1:-1] if line.strip()]


@pytest.mark.parametrize("who", ["viewer_client", "operator_client"])
def test_only_admins_manage_keys_and_host_keys(request, who, key_pair):
    client = request.getfixturevalue(who)
    node = make_node()
    assert client.get(reverse("nodes:credential-list")).status_code == 403
    response = client.post(
        reverse("nodes:credential-create"), {"name": "k", "private_key": key_pair[0]}
    )
    assert response.status_code == 403
    for name in ("node-fetch-host-key", "node-trust-host-key", "node-maintenance"):
        assert client.post(reverse(f"nodes:{name}", args=[node.pk]), {"on": "1"}).status_code == 403
    node.refresh_from_db()
    assert node.status == "unknown" and not SshCredential.objects.exists()


def test_viewer_cannot_start_discovery(viewer_client):
    node = make_node()
    assert viewer_client.post(reverse("nodes:node-discover", args=[node.pk])).status_code == 403
    assert not AuditEntry.objects.filter(action="node.discover").exists()


def test_operator_starts_discovery_and_gets_a_polling_fragment(
    operator_client, celery_app_for_tests
):
    import redis

    from tests.conftest import TEST_REDIS_URL

    queue = redis.Redis.from_url(TEST_REDIS_URL)
    queue.delete("default")
    node = make_node(
        host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh4", host_key_fingerprint="SHA256:x"
    )
    response = operator_client.post(
        reverse("nodes:node-discover", args=[node.pk]), headers={"HX-Request": "true"}
    )
    body = response.content.decode()
    assert response.status_code == 200 and "<html" not in body
    assert 'hx-trigger="every 1s"' in body and "Discovering gpu-01" in body
    assert queue.llen("default") == 1  # one discovery task waits for a worker
    queue.delete("default")
    assert AuditEntry.objects.filter(action="node.discover", actor_name="otto").exists()


def test_admin_stores_a_key_encrypted_and_it_is_never_shown_again(admin_client_, key_pair, caplog):
    plain = key_pair[0]
    response = admin_client_.post(
        reverse("nodes:credential-create"), {"name": "fleet-a", "private_key": plain}
    )
    assert response.status_code == 302
    credential = SshCredential.objects.get()
    assert credential.key_type == "ssh-ed25519" and credential.fingerprint.startswith("SHA256:")
    pages = [
        admin_client_.get(reverse("nodes:credential-list")).content.decode(),
        admin_client_.get(reverse("nodes:audit-list")).content.decode(),
        admin_client_.get(reverse("nodes:credential-create")).content.decode(),
    ]
    dump = serializers.serialize("json", SshCredential.objects.all())
    audit = serializers.serialize("json", AuditEntry.objects.all())
    for line in _body(plain):
        assert all(line not in page for page in pages)
        assert line not in dump and line not in audit and line not in caplog.text
    assert credential.fingerprint in pages[0]


def test_a_refused_key_is_not_echoed_back(admin_client_, key_pair):
    locked = key_pair[1]
    response = admin_client_.post(
        reverse("nodes:credential-create"),
        {"name": "locked", "private_key": locked, "passphrase": "wrong"},
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert "the passphrase does not open this key" in body
    assert all(line not in body for line in _body(locked))
    assert "wrong" not in body and not SshCredential.objects.exists()
    missing = admin_client_.post(
        reverse("nodes:credential-create"), {"name": "locked", "private_key": locked}
    )
    assert "protected by a passphrase" in missing.content.decode()
    ok = admin_client_.post(
        reverse("nodes:credential-create"),
        {"name": "locked", "private_key": locked, "passphrase": "s3cret-pass"},
    )
    assert ok.status_code == 302 and SshCredential.objects.get().key_type == "ssh-rsa"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "k", "private_key": "not a key"}, "not an OpenSSH or PEM private key"),
        ({"name": "k", "private_key": ""}, "Paste the private key or upload its file"),
        ({"name": "Bad Name", "private_key": "x"}, "lower-case"),
    ],
)
def test_bad_keys_are_refused_with_a_reason(admin_client_, data, message):
    response = admin_client_.post(reverse("nodes:credential-create"), data)
    assert message in response.content.decode()
    assert not SshCredential.objects.exists()


def test_uploaded_key_file_works(admin_client_, key_pair):
    from django.core.files.uploadedfile import SimpleUploadedFile

    upload = SimpleUploadedFile("id_ed25519", key_pair[0].encode())
    admin_client_.post(reverse("nodes:credential-create"), {"name": "up", "key_file": upload})
    assert SshCredential.objects.get().name == "up"


def test_a_key_in_use_cannot_be_deleted(admin_client_, key_pair):
    admin_client_.post(
        reverse("nodes:credential-create"), {"name": "k", "private_key": key_pair[0]}
    )
    credential = SshCredential.objects.get()
    make_node(credential=credential)
    admin_client_.post(reverse("nodes:credential-delete", args=[credential.pk]))
    assert SshCredential.objects.exists()
    Node.objects.all().delete()
    admin_client_.post(reverse("nodes:credential-delete", args=[credential.pk]))
    assert not SshCredential.objects.exists()
    assert AuditEntry.objects.filter(action="credential.delete").exists()


def test_trusting_needs_the_fingerprint_that_was_shown(admin_client_):
    node = make_node(offered_host_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHh4",
                     offered_host_key_fingerprint="SHA256:shown")  # fmt: skip
    admin_client_.post(
        reverse("nodes:node-trust-host-key", args=[node.pk]), {"fingerprint": "SHA256:other"}
    )
    node.refresh_from_db()
    assert node.host_key == ""
    admin_client_.post(
        reverse("nodes:node-trust-host-key", args=[node.pk]), {"fingerprint": "SHA256:shown"}
    )
    node.refresh_from_db()
    assert node.host_key_fingerprint == "SHA256:shown" and node.offered_host_key == ""
    entry = AuditEntry.objects.get(action="node.trust_host_key")
    assert entry.after == {"trusted": "SHA256:shown"}


def test_maintenance_is_set_by_an_admin_and_recorded(admin_client_):
    node = make_node()
    admin_client_.post(reverse("nodes:node-maintenance", args=[node.pk]), {"on": "1"})
    node.refresh_from_db()
    assert node.status == "maintenance"
    assert NodeEvent.objects.filter(node=node, message__contains="maintenance").exists()
    assert AuditEntry.objects.filter(action="node.maintenance").exists()


def test_discovery_needs_a_trusted_host_key(operator_client):
    node = make_node()
    operator_client.post(reverse("nodes:node-discover", args=[node.pk]))
    assert not AuditEntry.objects.filter(action="node.discover").exists()


def test_a_failed_discovery_says_so(viewer_client, celery_app_for_tests):
    from celery.result import AsyncResult

    node = make_node()
    backend = celery_app_for_tests.backend
    task_id = "0b0e7a3c-8f7e-4c1e-9d51-1c8f2f0a9e11"
    backend.store_result(
        task_id, {"error": "cannot reach 10.0.0.5:22", "kind": "unreachable"}, "SUCCESS"
    )
    assert AsyncResult(task_id).ready()
    body = viewer_client.get(
        reverse("nodes:node-live", args=[node.pk]), {"task": task_id}
    ).content.decode()
    assert "Discovery failed: cannot reach 10.0.0.5:22" in body and "Discovery finished" not in body
    # The discovery's poll (every second) stopped; the section's slow refresh keeps the outcome.
    assert "every 1s" not in body and f"?task={task_id}" in body


def test_users_and_groups_are_read_only_in_the_admin(admin_user):
    from django.test import Client

    admin_user.is_staff = admin_user.is_superuser = True
    admin_user.save()
    client = Client()
    client.force_login(admin_user)
    assert client.get(reverse("admin:auth_user_add")).status_code == 403
    assert client.get(reverse("admin:auth_group_add")).status_code == 403


@pytest.mark.parametrize(
    ("fixture", "message"),
    [
        ("bad-assert", "not an OpenSSH or PEM private key"),
        ("bad-index", "not an OpenSSH or PEM private key"),
        ("rounds4294967295", "more than 1024 rounds"),
    ],
)
def test_damaged_or_hostile_keys_are_refused_quickly(admin_client_, fixture, message):
    import time
    from pathlib import Path

    key = (Path(__file__).resolve().parents[1] / "fixtures" / "keys" / fixture).read_text()
    started = time.monotonic()
    response = admin_client_.post(
        reverse("nodes:credential-create"), {"name": "k", "private_key": key, "passphrase": "pw"}
    )
    assert time.monotonic() - started < 5
    assert response.status_code == 200 and message in response.content.decode()
    assert not SshCredential.objects.exists()


def test_a_key_stored_under_another_encryption_key_is_a_clear_error(
    admin_client_, key_pair, settings
):
    from cryptography.fernet import Fernet

    from nodes import ssh
    from nodes.services.credentials import target_for

    admin_client_.post(
        reverse("nodes:credential-create"), {"name": "k", "private_key": key_pair[0]}
    )
    node = make_node(credential=SshCredential.objects.get())
    settings.RANKWISE_ENCRYPTION_KEY = Fernet.generate_key().decode()
    with pytest.raises(ssh.RemoteError) as err:
        target_for(node)
    assert err.value.kind == "bad_key" and "RANKWISE_ENCRYPTION_KEY" in err.value.message


def test_maintenance_needs_a_clear_yes_or_no(admin_client_):
    node = make_node(status="ready")
    admin_client_.post(reverse("nodes:node-maintenance", args=[node.pk]), {"on": "true"})
    node.refresh_from_db()
    assert node.status == "ready"
    admin_client_.post(reverse("nodes:node-maintenance", args=[node.pk]), {"on": "0"})
    node.refresh_from_db()
    assert node.status == "ready" and not NodeEvent.objects.exists()
