"""Mask secrets in commands and environments before they are shown or stored in plain view."""

from __future__ import annotations

SECRET_FLAGS = {"--api-key", "--admin-api-key"}
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY")
MASK = "****"


def redact_args(args: list[str]) -> list[str]:
    """``["--api-key", "abc"]`` → ``["--api-key", "****"]`` (also ``--api-key=abc``)."""
    out: list[str] = []
    hide_next = False
    for word in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif word in SECRET_FLAGS:
            out.append(word)
            hide_next = True
        elif word.split("=", 1)[0] in SECRET_FLAGS and "=" in word:
            out.append(word.split("=", 1)[0] + "=" + MASK)
        else:
            out.append(word)
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Values of variables whose names look secret (``HF_TOKEN``, ``*_API_KEY``…) masked."""
    return {k: MASK if any(w in k.upper() for w in SECRET_WORDS) else v for k, v in env.items()}
