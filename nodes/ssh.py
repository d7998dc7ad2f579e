"""The only place Rankwise uses paramiko: connect with timeouts and host-key checking, run a
command given as an argument list (quoted once, here), and report failures as ``RemoteError``.

Host keys are never accepted silently: a node without a trusted key is refused until an admin
trusts the key ``fetch_host_key`` shows, and a key that differs from the trusted one is refused
before authentication, so nothing runs.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import shlex
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import paramiko

#: An open connection to a node (what ``connect`` and ``Pool.session`` give).
Connection = paramiko.SSHClient
CONNECT_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 60.0
KEY_CLASSES: tuple[type[paramiko.PKey], ...] = (
    paramiko.Ed25519Key,
    paramiko.ECDSAKey,
    paramiko.RSAKey,
)


class RemoteError(Exception):
    """A failure talking to a node, worded for an operator.

    ``kind`` is one of: ``unreachable``, ``timeout``, ``auth``, ``host_key_unknown``,
    ``host_key_mismatch``, ``command_failed``, ``bad_key``, ``refused`` (a port on the node has
    no listener). ``permanent`` says whether retrying
    without a change can help. ``exit_status`` and ``stderr_tail`` are set for
    ``command_failed``; ``presented`` (the fingerprint the node showed) for
    ``host_key_mismatch``.
    """

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        permanent: bool = False,
        exit_status: int | None = None,
        stderr_tail: str = "",
        presented: str = "",
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.permanent = permanent
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail
        # For ``host_key_mismatch``: the fingerprint of the key the node presented.
        self.presented = presented

    @property
    def retryable(self) -> bool:
        """Whether asking again, unchanged, can help: the node was away, slow or not listening
        yet; not for a refused key, a changed host key, or a command that failed or answered
        what the panel cannot read."""
        return not self.permanent and self.kind in ("unreachable", "timeout", "refused")


@dataclass(frozen=True)
class HostKey:
    """A host key as OpenSSH writes it: ``"ssh-ed25519 AAAA…"``, with its SHA256 fingerprint."""

    key_type: str
    base64: str

    @property
    def line(self) -> str:
        return f"{self.key_type} {self.base64}"

    @property
    def fingerprint(self) -> str:
        return fingerprint_of(base64.b64decode(self.base64))

    @classmethod
    def from_line(cls, line: str) -> HostKey:
        key_type, _, data = line.strip().partition(" ")
        return cls(key_type, data.split()[0] if data else "")


@dataclass(frozen=True)
class Target:
    """Where and how to reach a node. ``private_key`` is the decrypted OpenSSH/PEM text."""

    host: str
    port: int
    user: str
    private_key: str | None
    passphrase: str | None
    host_key: HostKey | None


@dataclass(frozen=True)
class Result:
    """A finished command: exit status, stdout and stderr as text."""

    exit_status: int
    stdout: str
    stderr: str


@dataclass(frozen=True)
class ParsedKey:
    """What a private key reveals publicly: type, OpenSSH public key line, fingerprint."""

    key_type: str
    public_key: str
    fingerprint: str


def fingerprint_of(blob: bytes) -> str:
    """OpenSSH's ``SHA256:…`` fingerprint of a public key blob (base64, no padding)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


MAX_KDF_ROUNDS = 1024  # ssh-keygen uses 16; a huge count would stall whoever opens the key
OPENSSH_TYPES: dict[str, type[paramiko.PKey]] = {
    "ssh-ed25519": paramiko.Ed25519Key,
    "ecdsa-sha2-nistp256": paramiko.ECDSAKey,
    "ecdsa-sha2-nistp384": paramiko.ECDSAKey,
    "ecdsa-sha2-nistp521": paramiko.ECDSAKey,
    "ssh-rsa": paramiko.RSAKey,
}


def _candidates(text: str) -> tuple[tuple[type[paramiko.PKey], ...], bool]:
    """The key classes worth trying (read from the file, so the passphrase KDF runs once) and
    whether the key is encrypted."""
    if "BEGIN OPENSSH PRIVATE KEY" not in text:
        encrypted = "ENCRYPTED" in text
        if "BEGIN RSA PRIVATE KEY" in text:
            return (paramiko.RSAKey,), encrypted
        if "BEGIN EC PRIVATE KEY" in text:
            return (paramiko.ECDSAKey,), encrypted
        if "BEGIN DSA PRIVATE KEY" in text:
            raise RemoteError("bad_key", "DSA keys are not supported; use ed25519", permanent=True)
        return (paramiko.RSAKey, paramiko.ECDSAKey), encrypted
    body = "".join(
        line.strip() for line in text.splitlines() if line.strip() and "PRIVATE KEY" not in line
    )
    try:
        blob = base64.b64decode(body)
        if not blob.startswith(b"openssh-key-v1\0"):
            raise ValueError
        msg = paramiko.Message(blob[len(b"openssh-key-v1\0") :])
        cipher = msg.get_text()
        kdf = msg.get_text()
        kdf_options = paramiko.Message(msg.get_binary())
        if kdf == "bcrypt":
            kdf_options.get_binary()  # salt
            if kdf_options.get_int() > MAX_KDF_ROUNDS:
                raise RemoteError(
                    "bad_key",
                    f"the key's passphrase KDF asks for more than {MAX_KDF_ROUNDS} rounds",
                    permanent=True,
                )
        msg.get_int()  # number of keys
        key_type = paramiko.Message(msg.get_binary()).get_text()
    except RemoteError:
        raise
    except Exception:  # any malformed structure: not a key we can read
        raise RemoteError(
            "bad_key", "not an OpenSSH or PEM private key (ed25519, ECDSA or RSA)", permanent=True
        ) from None
    if key_type not in OPENSSH_TYPES:
        raise RemoteError("bad_key", f"{key_type} keys are not supported", permanent=True)
    return (OPENSSH_TYPES[key_type],), cipher != "none"


def _load_key(text: str, passphrase: str | None) -> paramiko.PKey:
    classes, encrypted = _candidates(text)
    if encrypted and not passphrase:
        raise RemoteError(
            "bad_key", "the key is protected by a passphrase; give the passphrase", permanent=True
        )
    last: Exception | None = None
    for klass in classes:
        try:
            return klass.from_private_key(io.StringIO(text), password=passphrase or None)
        except paramiko.PasswordRequiredException:
            raise RemoteError(
                "bad_key",
                "the key is protected by a passphrase; give the passphrase",
                permanent=True,
            ) from None
        except Exception as exc:  # paramiko's parsers raise AssertionError, IndexError, … too
            last = exc
    wrong_pass = encrypted and passphrase and last is not None
    raise RemoteError(
        "bad_key",
        "the passphrase does not open this key"
        if wrong_pass
        else "not an OpenSSH or PEM private key (ed25519, ECDSA or RSA)",
        permanent=True,
    )


def parse_private_key(text: str, passphrase: str | None = None) -> ParsedKey:
    """Check that ``text`` is a private key we can use; return its public parts.

    Raises ``RemoteError(kind="bad_key")``; the message never contains key material.
    """
    key = _load_key(text, passphrase)
    return ParsedKey(
        key.get_name(), f"{key.get_name()} {key.get_base64()}", fingerprint_of(key.asbytes())
    )


def fetch_host_key(host: str, port: int, timeout: float = CONNECT_TIMEOUT_S) -> HostKey:
    """The key the server at ``host:port`` presents, without authenticating or running anything."""
    sock = _open_socket(host, port, timeout)
    transport = paramiko.Transport(sock)
    try:
        transport.start_client(timeout=timeout)
        key = transport.get_remote_server_key()
        return HostKey(key.get_name(), key.get_base64())
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise RemoteError(
            "unreachable", f"{host}:{port} did not complete an SSH handshake: {exc}"
        ) from None
    finally:
        transport.close()


def host_key_changed(target: Target, presented: str) -> RemoteError:
    """The refusal for a node whose key (fingerprint ``presented``) is not the trusted one."""
    trusted = target.host_key.fingerprint if target.host_key else "?"
    return RemoteError(
        "host_key_mismatch",
        f"HOST KEY CHANGED for {target.host}: it presents {presented}, but the trusted key is "
        f"{trusted}. Nothing was run. If the node was reinstalled, fetch and trust the new key.",
        permanent=True,
        presented=presented,
    )


def check_host_key(target: Target, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """Compare the key ``target`` presents now, in a fresh handshake (no login, nothing run),
    with the trusted one: a pooled connection keeps talking to the server it first met, so
    only a new handshake notices a changed key. Raises ``RemoteError`` (``host_key_mismatch``,
    ``host_key_unknown`` when none is trusted, or why no handshake completed)."""
    key = fetch_host_key(target.host, target.port, timeout)
    if target.host_key is None:
        raise RemoteError(
            "host_key_unknown",
            f"{target.host} presents host key {key.fingerprint}, which no admin has trusted yet; "
            "nothing was run",
            permanent=True,
        )
    if (key.key_type, key.base64) != (
        target.host_key.key_type,
        target.host_key.base64,
    ):
        raise host_key_changed(target, key.fingerprint)


def _open_socket(host: str, port: int, timeout: float) -> socket.socket:
    try:
        return socket.create_connection((host, port), timeout=timeout)
    except TimeoutError:
        raise RemoteError("timeout", f"{host}:{port} did not answer within {timeout:g} s") from None
    except OSError as exc:
        raise RemoteError(
            "unreachable", f"cannot reach {host}:{port}: {exc.strerror or exc}"
        ) from None


class _Pin(paramiko.MissingHostKeyPolicy):
    """Refuse any key but the trusted one (paramiko calls this only for unknown keys)."""

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        raise RemoteError(
            "host_key_unknown",
            f"{hostname} presents host key {fingerprint_of(key.asbytes())}, which no admin has "
            "trusted yet; nothing was run",
            permanent=True,
        )


def connect(target: Target, timeout: float = CONNECT_TIMEOUT_S) -> paramiko.SSHClient:
    """An authenticated connection to ``target``; raises ``RemoteError`` on any failure."""
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(_Pin())
    if target.host_key is not None:
        name = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
        try:
            key = paramiko.PKey.from_type_string(
                target.host_key.key_type, base64.b64decode(target.host_key.base64)
            )
        except (ValueError, paramiko.SSHException) as exc:  # a malformed trusted key
            raise RemoteError(
                "host_key_unknown",
                f"{target.host}: the trusted host key cannot be read ({type(exc).__name__}); "
                "fetch and trust the node's key again",
                permanent=True,
            ) from None
        client.get_host_keys().add(name, target.host_key.key_type, key)
    pkey = _load_key(target.private_key, target.passphrase) if target.private_key else None
    sock = _open_socket(target.host, target.port, timeout)
    try:
        client.connect(
            target.host,
            port=target.port,
            username=target.user,
            pkey=pkey,
            sock=sock,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=pkey is None,
            look_for_keys=False,
        )
    except RemoteError:
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        raise host_key_changed(target, fingerprint_of(exc.key.asbytes())) from None
    except paramiko.AuthenticationException:
        client.close()
        raise RemoteError(
            "auth",
            f"{target.user}@{target.host} refused the SSH key (authentication failed)",
            permanent=True,
        ) from None
    except TimeoutError:
        client.close()
        raise RemoteError("timeout", f"{target.host}: SSH handshake timed out") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        client.close()
        raise RemoteError("unreachable", f"{target.host}: SSH failed: {exc}") from None
    return client


def quote(argv: list[str]) -> str:
    """The one place an argument list becomes a remote shell command line."""
    return shlex.join(argv)


def run_script(
    client: paramiko.SSHClient,
    source: str,
    *args: str,
    what: str,
    stdin: bytes | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
) -> dict[str, Any]:
    """Run a stdlib Python script (``source``, sent as ``python3 -c``, so nothing is installed
    on the node) with quoted ``args``; the JSON document its last output line holds. Raises
    ``RemoteError`` (``what`` names the script in the message)."""
    result = run(client, ["python3", "-c", source, *args], stdin=stdin, timeout=timeout)
    try:
        doc: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise RemoteError("command_failed", f"{what} printed no answer") from None
    return doc


def run(
    client: paramiko.SSHClient,
    argv: list[str],
    *,
    stdin: bytes | None = None,
    timeout: float = COMMAND_TIMEOUT_S,
    check: bool = True,
) -> Result:
    """Run ``argv`` on the node; with ``check`` a non-zero exit raises ``RemoteError``."""
    try:
        channel = client.get_transport().open_session(timeout=timeout)  # type: ignore[union-attr]
        channel.settimeout(timeout)
        channel.exec_command(quote(argv))
        if stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
        stdout, stderr = _drain(channel, timeout)
        status = channel.recv_exit_status()
    except TimeoutError:
        raise RemoteError("timeout", f"{argv[0]} did not finish within {timeout:g} s") from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise RemoteError(
            "unreachable", f"the connection broke while running {argv[0]}: {exc}"
        ) from None
    result = Result(status, stdout.decode(errors="replace"), stderr.decode(errors="replace"))
    if check and status != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-5:])
        raise RemoteError(
            "command_failed",
            f"{argv[0]} exited with status {status}" + (f": {tail}" if tail else ""),
            exit_status=status,
            stderr_tail=tail,
        )
    return result


def _drain(channel: paramiko.Channel, timeout: float) -> tuple[bytes, bytes]:
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while True:
        if channel.recv_ready():
            out += channel.recv(65536)
        elif channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
        elif (
            channel.exit_status_ready()
            and not channel.recv_ready()
            and not channel.recv_stderr_ready()
        ):
            break
        else:
            if time.monotonic() > deadline:
                raise TimeoutError
            time.sleep(0.005)
    return bytes(out), bytes(err)


class Stream:
    """The output of a long-running remote command (``tail -F``), read as it arrives."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self._channel = channel

    def read(self, timeout: float) -> bytes | None:
        """Bytes that arrived within ``timeout`` s (``b""`` if none); ``None`` once the command
        ended. Raises ``RemoteError`` when the connection broke."""
        try:
            self._channel.settimeout(timeout)
            data: bytes = self._channel.recv(1 << 20)
        except TimeoutError:
            return b""
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError("unreachable", f"the log stream broke: {exc}") from None
        return data if data else None

    def close(self) -> None:
        self._channel.close()


def stream(client: paramiko.SSHClient, argv: list[str], stdin: bytes | None = None) -> Stream:
    """Start ``argv`` on the node (``stdin`` sent first, then closed) and return its stdout as
    a ``Stream`` (stderr is dropped)."""
    try:
        channel = client.get_transport().open_session(timeout=COMMAND_TIMEOUT_S)  # type: ignore[union-attr]
        channel.set_combine_stderr(False)
        channel.exec_command(quote(argv))
        if stdin is not None:
            channel.sendall(stdin)
        channel.shutdown_write()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise RemoteError("unreachable", f"could not start {argv[0]}: {exc}") from None
    return Stream(channel)


class _ChannelHTTPConnection(http.client.HTTPConnection):
    """HTTP to a port on the node's loopback, through the SSH connection (direct-tcpip)."""

    def __init__(self, transport: paramiko.Transport, port: int, timeout: float) -> None:
        super().__init__("127.0.0.1", port, timeout=timeout)
        self._transport = transport
        self._channel: paramiko.Channel | None = None

    def connect(self) -> None:
        channel = self._transport.open_channel(
            "direct-tcpip", ("127.0.0.1", self.port), ("127.0.0.1", 0), timeout=self.timeout
        )
        channel.settimeout(self.timeout)
        self.sock = self._channel = channel

    def close(self) -> None:
        # http.client hands a response that ends with the connection (HTTP/1.0, as SGLang's
        # uvicorn may answer) its socket by closing the connection right after the headers:
        # a socket outlives that (its file holds a reference), a paramiko channel does not,
        # and a body still on its way is lost (IncompleteRead, seen on a busy node). The
        # channel is closed by ``shut``, once the body is read.
        self.sock = None
        super().close()

    def shut(self) -> None:
        """Close the channel (after the response's body was read)."""
        self.close()
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()


#: The most of an answer's body read (bytes).
HTTP_BODY_MAX = 4 << 20


def _read_at_most(response: http.client.HTTPResponse, limit: int) -> bytes:
    """The body, whole up to ``limit`` bytes: ``read(n)`` returns what one read of the
    channel gave, which can be part of it."""
    chunks, size = [], 0
    while size < limit:
        chunk = response.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    body = b"".join(chunks)
    # http.client ends a read quietly when the channel closes early, even short of the
    # Content-Length it was promised: a cut answer must not pass for a whole (empty) one.
    if size < limit and response.length:
        raise http.client.IncompleteRead(body, response.length)
    return body


def http_get(
    client: paramiko.SSHClient,
    port: int,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """``GET http://127.0.0.1:PORT/PATH`` as seen from the node (``http_request``)."""
    return http_request(client, port, "GET", path, headers=headers, timeout=timeout)


def http_request(
    client: paramiko.SSHClient,
    port: int,
    method: str,
    path: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """``METHOD http://127.0.0.1:PORT/PATH`` as seen from the node, through the SSH connection,
    so the port need not be open to the panel. Returns (status, body, at most 4 MiB); raises
    ``RemoteError`` (``refused`` when nothing listens, ``timeout``, ``unreachable``)."""
    transport = client.get_transport()
    if transport is None or not transport.is_active():
        raise RemoteError("unreachable", "the SSH connection is closed")
    connection = _ChannelHTTPConnection(transport, port, timeout)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, _read_at_most(response, HTTP_BODY_MAX)
    except paramiko.ChannelException as exc:
        raise RemoteError("refused", f"nothing answers on port {port}: {exc}") from None
    except TimeoutError:
        raise RemoteError(
            "timeout", f"port {port} did not answer {path} in {timeout:g} s"
        ) from None
    except (paramiko.SSHException, OSError, EOFError, http.client.HTTPException) as exc:
        raise RemoteError("unreachable", f"{path} on port {port} failed: {exc}") from None
    except (ValueError, UnicodeError):
        # http.client refuses a header it cannot write; its words would repeat the value.
        raise RemoteError(
            "command_failed", f"{method} {path}: a header could not be written as HTTP"
        ) from None
    finally:
        connection.shut()


class Pool:
    """Connections kept open between uses, one per target, so sweeps of many nodes stay fast.

    Thread-safe: each target's connection is used by one thread at a time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[Target, paramiko.SSHClient] = {}
        self._locks: dict[Target, threading.Lock] = {}

    @contextmanager
    def session(
        self, target: Target, timeout: float = CONNECT_TIMEOUT_S
    ) -> Iterator[paramiko.SSHClient]:
        with self._lock:
            lock = self._locks.setdefault(target, threading.Lock())
        with lock:
            client = self._clients.get(target)
            transport = client.get_transport() if client else None
            if client is None or transport is None or not transport.is_active():
                if client is not None:
                    client.close()
                client = connect(target, timeout)
                self._clients[target] = client
                # A connection made under a key trusted before is not reused for this node.
                self.drop_host(target.host, target.port, keep=target)
            try:
                yield client
            except RemoteError as exc:
                if exc.kind in ("unreachable", "timeout"):
                    self.drop(target)
                raise

    def drop(self, target: Target) -> None:
        client = self._clients.pop(target, None)
        if client is not None:
            client.close()

    def drop_host(self, host: str, port: int, keep: Target | None = None) -> None:
        """Close every connection to ``host:port`` (with ``keep``, only those made under
        another trusted key than ``keep``'s): the node's host key changed, so none of them may
        be used again."""
        for target in list(self._clients):
            if (target.host, target.port) != (host, port):
                continue
            if keep is None or target.host_key != keep.host_key:
                self.drop(target)

    def close(self) -> None:
        for target in list(self._clients):
            self.drop(target)


#: The worker process's connections (Celery tasks in one process share them).
pool = Pool()
