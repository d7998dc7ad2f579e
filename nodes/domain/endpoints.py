"""Where a running server answers: its URL from the panel's network when it listens on more
than the loopback, and always the SSH tunnel that reaches it through the node's SSH port."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

#: Bind addresses that only the node itself can reach.
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass(frozen=True)
class Endpoint:
    """``direct``: the URL from the panel's network (``None`` for a loopback-only server);
    ``tunnel``: the ``ssh -L`` command; ``through_tunnel``: the URL once it runs."""

    direct: str | None
    tunnel: str
    through_tunnel: str


def endpoint(
    bind_host: str | None, node_host: str, port: int, ssh_port: int, ssh_user: str
) -> Endpoint:
    """The server on ``port``, bound to ``bind_host`` (SGLang's --host, 127.0.0.1 by default)
    on the node reached over SSH at ``ssh_user@node_host:ssh_port``."""
    bound = (bind_host or "127.0.0.1").strip("[]")
    if bound in LOOPBACK:
        direct = None
    else:
        host = node_host if bound in ("0.0.0.0", "::") else bound
        direct = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    target = shlex.quote(f"{ssh_user}@{node_host}")
    tunnel = f"ssh -N -p {ssh_port} -L {port}:127.0.0.1:{port} {target}"
    return Endpoint(direct, tunnel, f"http://127.0.0.1:{port}")
