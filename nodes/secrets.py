"""Secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``) with the key in
``settings.RANKWISE_ENCRYPTION_KEY``. Plain text exists only in memory, while it is used."""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class SecretUnreadable(RuntimeError):
    """A stored secret cannot be decrypted: RANKWISE_ENCRYPTION_KEY changed since it was saved."""


def _fernet() -> Fernet:
    return Fernet(settings.RANKWISE_ENCRYPTION_KEY)


def encrypt(text: str) -> bytes:
    """Encrypt UTF-8 text; returns the Fernet token as bytes."""
    return _fernet().encrypt(text.encode())


def decrypt(token: bytes | memoryview) -> str:
    """Decrypt a token from ``encrypt``; raises ``SecretUnreadable`` with a fix-it message."""
    try:
        return _fernet().decrypt(bytes(token)).decode()
    except InvalidToken:
        raise SecretUnreadable(
            "a stored SSH key cannot be decrypted: RANKWISE_ENCRYPTION_KEY is not the key it "
            "was saved with; restore that key or add the SSH key again"
        ) from None
