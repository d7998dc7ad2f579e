"""The node's network interfaces as Gloo and NCCL look them up (simfleet/multinode-sources.md,
"The wrong interface"): by name, among the interfaces that carry an IPv4 or IPv6 address."""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct

SIOCGIFADDR = 0x8915


def addresses() -> dict[str, set[str]]:
    """Interface name → the families it has an address of (``"inet"``, ``"inet6"``,
    ``"inet6-loopback"`` for ::1), as ``getifaddrs`` lists them."""
    found: dict[str, set[str]] = {}
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with probe:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                request = struct.pack("256s", name.encode()[:15])
                fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
                found.setdefault(name, set()).add("inet")
    with contextlib.suppress(OSError), open("/proc/net/if_inet6") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) >= 6:
                loopback = fields[0] == "0" * 31 + "1"
                found.setdefault(fields[5], set()).add("inet6-loopback" if loopback else "inet6")
    return found


def gloo_missing(value: str) -> str | None:
    """The first name of ``GLOO_SOCKET_IFNAME`` (comma-separated; used when longer than one
    character) that has no address here: Gloo's ``lookupAddrForIface`` matches the name exactly
    and takes any IPv4 or IPv6 address of it."""
    if len(value) <= 1:
        return None
    have = addresses()
    for name in value.split(","):
        if name and not have.get(name):
            return name
    return None


def nccl_matches(value: str) -> list[str]:
    """The interfaces ``NCCL_SOCKET_IFNAME`` selects (misc/socket.cc ``findInterfaces``): a
    comma-separated list of prefixes, ``^`` to exclude them, ``=`` for exact names; only
    interfaces with an address count, IPv6 loopback never."""
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    wanted = [p.split(":")[0] for p in rest.split(",") if p]
    chosen = []
    for name, families in sorted(addresses().items()):
        if not families - {"inet6-loopback"}:
            continue
        hit = any(name == p if exact else name.startswith(p) for p in wanted)
        if hit != exclude:
            chosen.append(name)
    return chosen
