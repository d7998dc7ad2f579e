"""Mask secrets in commands and environments before they are shown or stored in plain view."""

from __future__ import annotations

import re

SECRET_FLAGS = ("--api-key", "--admin-api-key", "--ssl-keyfile-password")
SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "API_KEY", "ACCESS_KEY")
FLAG_WORDS = ("key", "password", "token", "secret", "passwd")
MASK = "****"


def is_secret_flag(flag: str) -> bool:
    """Flags whose value is a secret: by name (``…key…``, ``…password…``), or any abbreviation
    argparse would expand to one (``--api`` → ``--api-key``)."""
    if not flag.startswith("-"):
        return False
    name = flag.lower()
    if any(word in name for word in FLAG_WORDS):
        return True
    # Any prefix argparse might expand (``--ap`` → ``--api-key``); masking a value that was not
    # secret only hides it, the reverse would leak it.
    return (
        len(name) >= 3 and name.startswith("--") and any(s.startswith(name) for s in SECRET_FLAGS)
    )


def redact_args(args: list[str]) -> list[str]:
    """``["--api-key", "abc"]`` → ``["--api-key", "****"]`` (also ``--api-key=abc``)."""
    out: list[str] = []
    hide_next = False
    for word in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
        elif "=" in word and is_secret_flag(word.split("=", 1)[0]):
            out.append(word.split("=", 1)[0] + "=" + MASK)
        elif is_secret_flag(word):
            out.append(word)
            hide_next = True
        else:
            out.append(word)
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Values of variables whose names look secret (``HF_TOKEN``, ``*_API_KEY``…) masked."""
    return {k: MASK if any(w in k.upper() for w in SECRET_WORDS) else v for k, v in env.items()}


def secret_values(args: list[str], env: dict[str, str]) -> list[str]:
    """The secret strings of a command: values of secret flags and of secret variables, longest
    first, so a log line that echoes one can be masked (``mask_text``)."""
    found: list[str] = []
    for shown, real in zip(redact_args(args), args, strict=True):
        if shown != real:
            found.append(real.split("=", 1)[1] if shown.endswith("=" + MASK) else real)
    found += [v for k, v in env.items() if redact_env({k: v})[k] == MASK]
    return sorted({v for v in found if len(v) >= 4}, key=len, reverse=True)


def mask_text(text: str, secrets: list[str]) -> str:
    """``text`` with every occurrence of each secret replaced by ``****``."""
    for secret in secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


_SECRET_ASSIGNMENT = re.compile(
    r"(?P<name>\b[A-Za-z_]*(?:" + "|".join(SECRET_WORDS) + r")[A-Za-z_]*)=(?P<value>[^\s'\",);]+)"
)
_SECRET_OPTION = re.compile(
    r"(?P<name>--[A-Za-z-]*(?:" + "|".join(FLAG_WORDS) + r")[A-Za-z-]*)(?P<sep>[= ]+)"
    r"(?P<value>[^\s'\",);]+)",
    re.IGNORECASE,
)


def mask_assignments(text: str) -> str:
    """Secrets a log line spells out without the panel knowing their values (a bundle from
    another server): ``HF_TOKEN=…`` and ``--api-key …`` values masked."""
    text = _SECRET_ASSIGNMENT.sub(lambda m: f"{m['name']}={MASK}", text)
    return _SECRET_OPTION.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
