"""SSH credentials: stored encrypted, turned into connection targets only when used."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest
from django.views.decorators.debug import sensitive_variables

from nodes import secrets, ssh
from nodes.models import Node, SshCredential
from nodes.models.choices import NodeStatus
from nodes.services.audit import record
from nodes.types import Actor


@sensitive_variables("private_key", "passphrase")
def create_credential(
    name: str,
    private_key: str,
    passphrase: str | None,
    *,
    actor: Actor,
    request: HttpRequest | None = None,
) -> SshCredential:
    """Check the key opens (with its passphrase), store it encrypted, audit ``credential.create``.

    Raises ``ssh.RemoteError(kind="bad_key")`` when the key cannot be used; nothing is saved then.
    """
    parsed = ssh.parse_private_key(private_key, passphrase)
    with transaction.atomic():
        credential = SshCredential.objects.create(
            name=name,
            key_type=parsed.key_type,
            public_key=parsed.public_key,
            fingerprint=parsed.fingerprint,
            encrypted_private_key=secrets.encrypt(private_key),
            encrypted_passphrase=secrets.encrypt(passphrase) if passphrase else None,
            created_by=actor.get_username() if actor.is_authenticated else "cli",
        )
        record(
            "credential.create",
            actor=actor,
            obj=credential,
            after=credential.audit_snapshot(),
            request=request,
        )
    return credential


def readable(credential: SshCredential) -> bool:
    """Whether the stored key still decrypts with the current RANKWISE_ENCRYPTION_KEY."""
    try:
        secrets.decrypt(credential.encrypted_private_key)
    except secrets.SecretUnreadable:
        return False
    return True


@sensitive_variables("private_key", "passphrase")
def replace_key(
    credential: SshCredential, private_key: str, passphrase: str | None, *, actor: Actor
) -> None:
    """Store the same key again (after RANKWISE_ENCRYPTION_KEY changed); audited."""
    parsed = ssh.parse_private_key(private_key, passphrase)
    if parsed.fingerprint != credential.fingerprint:
        raise ssh.RemoteError("bad_key", "that is a different key", permanent=True)
    credential.encrypted_private_key = secrets.encrypt(private_key)
    credential.encrypted_passphrase = secrets.encrypt(passphrase) if passphrase else None
    credential.save(update_fields=["encrypted_private_key", "encrypted_passphrase"])
    record("credential.restore", actor=actor, obj=credential, after=credential.audit_snapshot())


def delete_credential(
    credential: SshCredential, *, actor: Actor, request: HttpRequest | None = None
) -> None:
    with transaction.atomic():
        record(
            "credential.delete",
            actor=actor,
            obj=credential,
            before=credential.audit_snapshot(),
            request=request,
        )
        credential.delete()


def target_for(node: Node) -> ssh.Target:
    """How to reach ``node``, with its key decrypted in memory for this use only.

    Raises ``ssh.RemoteError`` (``host_key_mismatch``) for a node whose host key changed: every
    use of the node passes here, so a connection pooled before the change is never used again.
    """
    if node.status == NodeStatus.HOST_KEY_CHANGED:
        raise ssh.RemoteError(
            "host_key_mismatch",
            f"{node.name} cannot be reached safely: {node.status_reason or 'its host key changed'}",
            permanent=True,
        )
    credential = node.credential
    try:
        return _target(node, credential)
    except secrets.SecretUnreadable as exc:
        raise ssh.RemoteError("bad_key", str(exc), permanent=True) from None


def _target(node: Node, credential: SshCredential | None) -> ssh.Target:
    return ssh.Target(
        host=node.host,
        port=node.port,
        user=node.ssh_user,
        private_key=secrets.decrypt(credential.encrypted_private_key) if credential else None,
        passphrase=(
            secrets.decrypt(credential.encrypted_passphrase)
            if credential and credential.encrypted_passphrase
            else None
        ),
        host_key=ssh.HostKey.from_line(node.host_key) if node.host_key else None,
    )
