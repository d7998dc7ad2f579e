"""Mask secrets in commands, environments and log text before they are shown or stored.

Two rules decide what is secret:

- a *name* (environment variable, ``key=value`` in a log, a flag SGLang does not know) is secret
  when one of its parts, split at ``_``, ``-``, ``.`` and camelCase, holds a word that is never
  anything but secret (``PASSWORD``, ``PASSWD``, ``SECRET``, ``CREDENTIAL``…, glued or not:
  ``PGPASSWORD``, ``MYSECRET``), or its last part is ``KEY(S)``, ``TOKEN(S)``, ``PASS``…
  (:func:`is_secret_name`): ``HF_TOKEN``, ``GH_TOKENS``, ``OPENAI_API_KEY``; not
  ``TOKENIZERS_PARALLELISM`` or ``KEYFRAME_RATE``. A plain number under a name secret only
  through ``TOKENS``/``KEYS`` is a count and stays (``max_total_num_tokens=100000``, :func:`hides`);
- a *flag* SGLang knows is secret when its version's flag table says it stores a string under a
  secret name (``--api-key``, ``--admin-api-key``, ``--ssl-keyfile-password``): abbreviations are
  resolved as argparse resolves them, and a flag that takes no value hides nothing. Any other
  flag's value is masked where it spells a secret out: a URL's password
  (``--tool-server http://u:****@h``), ``{"secret_key": "****"}``, ``?token=****``.

Masking log text never rewrites what the log parser reads: a known secret is replaced wherever it
appears only when it is distinctive (long, not a number); any secret is masked where the text
names it (``--api-key VALUE``, ``api_key='VALUE'``, ``HF_TOKEN=VALUE``, ``scheme://user:VALUE@``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from nodes.domain.sglang_flags import LIST_DESTS, FlagTable, parse_table

MASK = "****"
# Words that are never anything but secrets: a name with one of them inside any part is secret,
# glued to other words or not (PGPASSWORD, DBPASSWORD, MYSECRET, SECRET_KEY_BASE, openaiApiKey).
SECRET_WORDS = (
    *("PASSWORD", "PASSWD", "PASSPHRASE", "SECRET", "CREDENTIAL"),
    *("APIKEY", "ACCESSKEY", "AUTHTOKEN"),
)
# Whole parts that are secret anywhere in a name (PRIVATE_KEY_PATH, SESSION_COOKIE).
SECRET_PARTS = frozenset({"PRIVATE", "CREDS", "COOKIE", "COOKIES"})
# These also name ordinary settings (TOKEN_USAGE, KEY_FRAMES, SESSION_ID), so they make a name
# secret only as its last word: HF_TOKEN, GH_TOKENS, OPENAI_KEY, MY_PASS, SENTRY_DSN, HTTP_AUTH.
LAST_PARTS = frozenset(
    {
        *("KEY", "KEYS", "TOKEN", "TOKENS", "PASS", "PWD", "PW", "AUTH", "AUTHORIZATION"),
        *("DSN", "BEARER", "SIG", "SIGNATURE"),
    }
)
# …and the plurals also end the names of counts (MAX_TOKENS, max_total_num_tokens, NUM_KEYS): a
# name secret only through one of them shows a value that is a plain number (``hides``).
COUNT_PARTS = frozenset({"TOKENS", "KEYS"})
_NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
TABLE_FILE = Path(__file__).resolve().parent.parent / "data" / "sglang-flags-by-version.tsv"


@lru_cache(maxsize=4096)  # log lines repeat the same few names
def is_secret_name(name: str) -> bool:
    """Whether a variable, key or flag named ``name`` holds a secret (see the module's rule).
    ``PWD`` alone is the working folder, not a password; trailing numbers are ignored
    (``API_KEY_2``)."""
    parts = _parts(name)
    if not parts:
        return False
    if _always_secret(parts):
        return True
    if parts == ["PWD"]:
        return False
    return parts[-1] in LAST_PARTS


def _always_secret(parts: list[str]) -> bool:
    return any(part in SECRET_PARTS or any(w in part for w in SECRET_WORDS) for part in parts)


def hides(name: str, value: str) -> bool:
    """Whether ``name`` holding ``value`` is a secret to mask: ``is_secret_name``, except that a
    count (``MAX_TOKENS=4096``, ``max_total_num_tokens=100000``: secret only through a plural
    last word, holding a plain number) is shown, so the numbers the log parser reads stay."""
    return is_secret_name(name) and not _a_count(name, value)


def _a_count(name: str, value: str) -> bool:
    parts = _parts(name)
    if not parts or parts[-1] not in COUNT_PARTS or _always_secret(parts):
        return False
    return _NUMBER.fullmatch(value.strip()) is not None


def _parts(name: str) -> list[str]:
    """``"openaiApiKey_2"`` → ``["OPENAI", "API", "KEY"]``."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    parts = [p.upper() for p in re.split(r"[^A-Za-z0-9]+", spaced) if p]
    while parts and parts[-1].isdigit():
        parts.pop()
    return parts


# --- flags -------------------------------------------------------------------------------------


class _Options:
    """One table's option strings: how many words each takes (0, 1 or ``+``), which are secret."""

    def __init__(self, table: FlagTable) -> None:
        self.takes: dict[str, int | str] = {}
        self.secret: set[str] = set()
        for spec in table.flags:
            flagonly = spec.action not in ("_StoreAction", "LoRAPathAction")
            many = spec.action == "LoRAPathAction" or spec.dest in LIST_DESTS
            secret = spec.action == "_StoreAction" and spec.type == "str"
            for option in spec.options:
                self.takes[option] = 0 if flagonly else "+" if many else 1
                if secret and is_secret_name(spec.dest):
                    self.secret.add(option)
        self.dests = {spec.dest for spec in table.flags}
        self.secret_dests = {
            spec.dest for spec in table.flags if any(o in self.secret for o in spec.options)
        }

    def resolve(self, name: str) -> list[str]:
        """The options ``name`` stands for, as argparse reads it: itself, else every option it
        is a prefix of (one: an abbreviation; several: ambiguous, SGLang refuses it)."""
        if name in self.takes:
            return [name]
        if not name.startswith("--") or len(name) < 3:
            return []
        return [option for option in self.takes if option.startswith(name)]


_OPTIONS: dict[int, tuple[FlagTable, _Options]] = {}


def _options(table: FlagTable) -> _Options:
    """The table's options, built once per table (tables are few and live as long as the
    process; holding the table keeps its ``id`` from being reused)."""
    held = _OPTIONS.get(id(table))
    if held is None or held[0] is not table:
        held = _OPTIONS[id(table)] = (table, _Options(table))
    return held[1]


@cache
def all_tables() -> tuple[FlagTable, ...]:
    """Every SGLang version's flag table shipped with Rankwise (read once)."""
    return tuple(parse_table(TABLE_FILE.read_text()).values())


def _tables(tables: FlagTable | Sequence[FlagTable] | None) -> Sequence[FlagTable]:
    if tables is None:
        return all_tables()
    return [tables] if isinstance(tables, FlagTable) else tables


_NEGATIVE = re.compile(r"^-\d+$|^-\d*\.\d+$")


def _is_option(word: str) -> bool:
    """What argparse takes for an option rather than a value (``-5`` and ``a b`` are values)."""
    return len(word) > 1 and word[0] == "-" and not _NEGATIVE.match(word) and " " not in word


def _redact_with(args: list[str], options: _Options) -> list[str]:
    out = list(args)
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word == "--":
            break
        if not _is_option(word):
            continue
        name, eq, given = word.partition("=")
        matches = options.resolve(word if word in options.takes else name)
        # A flag this version does not know is secret by its name (a count is no secret).
        secret = any(m in options.secret for m in matches) if matches else is_secret_name(name)
        if eq:
            if secret and (matches or hides(name, given)):
                out[i - 1] = f"{name}={MASK}"
            continue
        takes = options.takes[matches[0]] if len(matches) == 1 else (1 if secret else 0)
        if takes == 1 and i < len(args):
            # A secret's value is hidden unless it is plainly the next flag; argparse would
            # refuse ``--api-key -x`` anyway, and showing ``-x`` could leak it.
            if secret and not matches and _a_count(name, args[i]):
                i += 1
            elif secret and not args[i].startswith("--"):
                out[i] = MASK
                i += 1
            elif not secret and not _is_option(args[i]):
                i += 1
        elif takes == "+":
            while i < len(args) and not _is_option(args[i]):
                i += 1
    return out


def redact_args(
    args: list[str], tables: FlagTable | Sequence[FlagTable] | None = None
) -> list[str]:
    """``["--api-key", "abc"]`` → ``["--api-key", "****"]`` (also ``--api-key=abc`` and any
    abbreviation argparse expands to a secret flag). ``tables``: the node's SGLang version's
    flag table; by default every known version's, and a value any of them would take as
    secret is masked. Secrets inside any other word are masked where the word spells them out
    (``mask_assignments``): a URL's password (``--tool-server http://u:****@h``), a secret key
    of a JSON or ``k=v`` value (``'{"secret_key": "****"}'``, ``?token=****``)."""
    out = list(args)
    for table in _tables(tables):
        for i, shown in enumerate(_redact_with(args, _options(table))):
            if shown != args[i]:
                out[i] = shown
    return [
        mask_assignments(shown) if shown == real else shown
        for shown, real in zip(out, args, strict=True)
    ]


def is_secret_flag(flag: str, tables: FlagTable | Sequence[FlagTable] | None = None) -> bool:
    """Whether ``flag`` (``--api-key``, an abbreviation, or a flag no version knows but named
    like a secret) takes a secret value in any of ``tables``."""
    return redact_args([flag, "x"], tables)[1] == MASK


# --- environments ------------------------------------------------------------------------------

# ``scheme://user:password@host``: the password part of a URL (a DSN, a proxy) is secret, with
# or without a user name (``redis://:password@host``).
_URL_PASSWORD = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*:)(?P<pw>[^\s@/'\"]+)@"
)


def _env_value(name: str, value: str) -> str:
    if hides(name, value):
        return MASK
    return mask_assignments(value)


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Values of variables whose names look secret (``HF_TOKEN``, ``*_API_KEY``, ``MY_PASSWD``,
    ``PGPASSWORD``, ``GH_TOKENS``, ``*_CREDENTIALS``…) masked, and secrets other values spell
    out: passwords inside URLs (``postgres://u:****@db``), ``{"password": "****"}``."""
    return {k: _env_value(k, v) for k, v in env.items()}


def _masked_parts(shown: str, real: str) -> list[str]:
    """What ``****`` stands for in ``shown``, read against ``real`` (``--api-key=****`` →
    the key; ``http://u:****@h`` → the password)."""
    pieces = shown.split(MASK)
    found = re.fullmatch("(.*?)".join(map(re.escape, pieces)), real, re.DOTALL)
    return list(found.groups()) if found else [real]


def secret_values(
    args: list[str], env: dict[str, str], tables: FlagTable | Sequence[FlagTable] | None = None
) -> list[str]:
    """The secret strings of a command: values of secret flags and of secret variables (and URL
    passwords), longest first, so text that echoes one can be masked (``mask_text``)."""
    found: list[str] = []
    for shown, real in zip(redact_args(args, tables), args, strict=True):
        if shown != real:
            found += _masked_parts(shown, real)
    for name, value in env.items():
        found += _masked_parts(_env_value(name, value), value)
    return sorted({v for v in found if v and v != MASK}, key=len, reverse=True)


def mask_arg_values(text: str, args: Sequence[str]) -> str:
    """``text`` (a parser's complaint about ``args``) with every value of ``args`` that it
    repeats masked, whole words only: a refused command may hold a secret under a flag that
    is not known to be secret (``--api-keys sk-…``, a second word after ``--api-key``).
    Numbers stay: the complaint is often about one (``--port 70000``), and none is a secret."""
    words = {str(a) for a in args if a and not str(a).startswith("-")}
    for word in sorted((w for w in words if not _NUMBERLIKE.fullmatch(w)), key=len, reverse=True):
        text = re.sub(rf"(?<![\w.-]){re.escape(word)}(?![\w.-])", MASK, text)
    return text


# --- text --------------------------------------------------------------------------------------

_NUMBERLIKE = re.compile(r"[\d.,:+\-eExX ]*")


def distinctive(secret: str) -> bool:
    """Whether ``secret`` can be replaced wherever it appears without rewriting anything else:
    at least 6 characters, not a number, and either 12 long or mixing letters with digits or
    punctuation. ``100000`` or ``auto`` are not; they are masked only where text names them."""
    if len(secret) < 6 or _NUMBERLIKE.fullmatch(secret):
        return False
    kinds = (str.isalpha, str.isdigit, lambda c: not c.isalnum())
    mixed = sum(any(kind(c) for c in secret) for kind in kinds) >= 2
    return len(secret) >= 12 or mixed


def mask_text(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each distinctive secret (see :func:`distinctive`) replaced by ``****``
    wherever it appears, and every secret the text names masked (:func:`mask_assignments`)."""
    for secret in secrets:
        if distinctive(secret) and secret in text:
            text = text.replace(secret, MASK)
    return mask_assignments(text)


# Names are found first and only a secret one's value is consumed: ``server_args=ServerArgs(
# api_key='…'`` must not swallow the ``api_key`` inside.
_KEY = re.compile(r"(?P<name>(?<![\w-])[A-Za-z_][A-Za-z0-9_.]*)(?P<sep>['\"]?\s*[=:]\s*(?!=))")
_OPTION = re.compile(r"(?P<name>(?<![\w-])--[A-Za-z][A-Za-z0-9-]*)(?P<sep>=|[ \t]+(?!-))")
_VALUE = re.compile(r"(?P<quote>['\"])?(?P<value>(?(quote)[^'\"\n]*|[^\s'\",;)&]+))")
_BEARER = re.compile(r"(?i)\b(?P<name>bearer|basic)(?P<sep>\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})")
_NOT_SECRET = {"", "None", "none", "null", "True", "False", "true", "false", MASK}


@cache
def _known_dests() -> tuple[frozenset[str], frozenset[str]]:
    """(every dest of every known version, the secret ones)."""
    every: set[str] = set()
    secret: set[str] = set()
    for table in all_tables():
        options = _options(table)
        every |= options.dests
        secret |= options.secret_dests
    return frozenset(every), frozenset(secret)


@lru_cache(maxsize=4096)  # the follower masks every line; a log repeats its few names
def _secret_key(name: str, separator: str) -> bool:
    every, secret = _known_dests()
    if name in every:  # one of SGLang's settings (server_args=ServerArgs(...)): its table says
        return name in secret
    if "=" in separator or separator.startswith(('"', "'")):
        return is_secret_name(name)
    # ``#token: 5`` in a progress line is a count: after a bare ``name:`` only the words that
    # are never anything but secrets count (``password: …``).
    return _always_secret(_parts(name))


def _mask_named(text: str, pattern: re.Pattern[str], secret: Callable[[str, str], bool]) -> str:
    """``text`` with the value after each ``pattern`` match whose name is ``secret`` masked."""
    out: list[str] = []
    last = 0
    for match in pattern.finditer(text):
        if match.start() < last or not secret(match["name"], match["sep"]):
            continue
        value = _VALUE.match(text, match.end())
        if value is None or value["value"] in _NOT_SECRET:
            continue
        if _a_count(match["name"], value["value"]):  # max_total_num_tokens=100000
            continue
        out += [text[last : match.end()], value["quote"] or "", MASK]
        last = value.end()
    return "".join(out) + text[last:] if out else text


# Secrets recognisable by their value, whatever they are called: each issuer's documented
# prefix and shape. PEM private keys (RFC 7468 labels), GitHub tokens (ghp_/gho_/ghu_/ghs_/ghr_
# and fine-grained github_pat_), JSON Web Tokens (RFC 7519: base64url header and payload, both
# JSON objects, so both start "eyJ"), Slack webhook URLs and xox… tokens, Hugging Face tokens
# (hf_), OpenAI/Anthropic keys (sk-…), AWS access key ids (AKIA…), Google API keys (AIza…).
SHAPED = re.compile(
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----(?:.*?-----END [A-Z0-9 ]*PRIVATE KEY-----|.*)"
    r"|\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})"
    r"|\beyJ[A-Za-z0-9_-]{6,}\.eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{6,}"
    r"|https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_-]+"
    r"|\bxox[abposr]-[A-Za-z0-9-]{10,}"
    r"|\bhf_[A-Za-z0-9]{30,}"
    r"|\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"
    r"|\bAKIA[0-9A-Z]{16}\b"
    r"|\bAIza[0-9A-Za-z_-]{35}",
    re.DOTALL,
)
#: Marks of ``SHAPED``: a line without any of them is not scanned (the follower masks every line).
_SHAPED_MARKS = (
    *("PRIVATE KEY", "gho_", "ghp_", "ghu_", "ghs_", "ghr_", "github_pat_", "eyJ"),
    *("hooks.slack.com", "xox", "hf_", "sk-", "AKIA", "AIza"),
)


def mask_shaped(text: str) -> str:
    """``text`` with every secret recognisable by its value (``SHAPED``) replaced by ``****``."""
    if not any(mark in text for mark in _SHAPED_MARKS):
        return text
    return SHAPED.sub(MASK, text)


def mask_assignments(text: str) -> str:
    """Secrets a text spells out, whether or not the panel knows their values (a bundle from
    another server, a log line echoing a command): ``HF_TOKEN=…``, ``api_key='…'``,
    ``"password": "…"``, ``--api-key …``, ``Bearer …``, URL passwords and values shaped like
    secrets (``mask_shaped``: a PEM key, ``ghp_…``, a JWT, a Slack webhook) masked. Numbers and
    flags of ordinary settings (``--max-total-tokens 100000``, ``max_total_num_tokens=100000``,
    ``#token: 12``) are left as they are."""
    text = mask_shaped(text)
    # Each pattern runs only where its mark is in the text: the follower masks every line.
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: f"{m['head']}{MASK}@", text)
    lowered = text.lower()
    if "bearer" in lowered or "basic" in lowered:
        text = _BEARER.sub(lambda m: f"{m['name']}{m['sep']}{MASK}", text)
    assigns = "=" in text or '":' in text or "':" in text
    if assigns or (":" in text and any(word in lowered for word in _ALWAYS_SECRET_WORDS)):
        text = _mask_named(text, _KEY, _secret_key)
    if "--" in text:
        text = _mask_named(text, _OPTION, _secret_option)
    return text


# Substrings of SECRET_PARTS' words, to skip the ``name: value`` scan of lines without them.
_ALWAYS_SECRET_WORDS = (
    *("secret", "passw", "passphrase", "private", "credential", "creds"),
    *("apikey", "accesskey", "authtoken", "cookie"),
)


@cache
def _secret_option(flag: str, _separator: str = "") -> bool:
    return is_secret_flag(flag)


def mask_doc(doc: Any, secrets: Iterable[str]) -> Any:
    """A JSON-ready ``doc`` with :func:`mask_text` applied to every string in it (keys kept):
    masking the serialised text instead could cut an escaped quote and break the JSON."""
    known = list(secrets)
    if isinstance(doc, str):
        return mask_text(doc, known)
    if isinstance(doc, list | tuple):
        return [mask_doc(item, known) for item in doc]
    if isinstance(doc, dict):
        return {key: mask_doc(value, known) for key, value in doc.items()}
    return doc


MAX_LINE_BYTES = 1 << 20


def masked_lines(chunks: Iterable[bytes], secrets: Iterable[str]) -> Iterator[bytes]:
    """Raw log bytes as they stream by (chunks cut anywhere), masked line by line with
    :func:`mask_text`; bytes that are not UTF-8 pass through unchanged. A line longer than
    ``MAX_LINE_BYTES`` is masked in pieces of that size, so memory stays bounded."""
    known = list(secrets)
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield _mask_bytes(line, known) + b"\n"
        while len(pending) > MAX_LINE_BYTES:
            yield _mask_bytes(pending[:MAX_LINE_BYTES], known)
            pending = pending[MAX_LINE_BYTES:]
    if pending:
        yield _mask_bytes(pending, known)


def _mask_bytes(line: bytes, secrets: list[str]) -> bytes:
    text = line.decode("utf-8", errors="surrogateescape")
    return mask_text(text, secrets).encode("utf-8", errors="surrogateescape")
