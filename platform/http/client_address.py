"""Which address a request came from: the peer, or what a trusted proxy says it forwarded.

Why `X-Forwarded-For` is honoured only behind listed proxies: anyone can send
the header, so trusting it everywhere would let an attacker pick a fresh
"source" per request and walk around every per-source limit. Behind trusted
proxies the header is read from the right (each proxy appends the address it
saw), skipping the proxies themselves; the first untrusted address is the client.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any

from hydrant.errors import ConfigurationError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
UNKNOWN = "unknown"


def parse_trusted_proxies(text: str | Iterable[str] | None) -> tuple[Network, ...]:
    """`HYDRANT_TRUSTED_PROXIES`: comma-separated addresses or CIDR networks."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    networks: list[Network] = []
    for item in (i.strip() for i in items):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ConfigurationError(
                f"HYDRANT_TRUSTED_PROXIES: {item!r} is not an IP address or CIDR network"
            ) from None
    return tuple(networks)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def _trusted(address: str, proxies: tuple[Network, ...]) -> bool:
    ip = _ip(address)
    return ip is not None and any(ip in network for network in proxies)


def client_address(scope: Mapping[str, Any], proxies: tuple[Network, ...] = ()) -> str:
    """The request's source address as a string (`unknown` when the server gives none)."""
    client = scope.get("client")
    peer = str(client[0]) if client else UNKNOWN
    if not proxies or not _trusted(peer, proxies):
        return peer
    forwarded: list[str] = []
    for name, value in scope.get("headers", ()):
        if name.lower() == b"x-forwarded-for":
            forwarded.extend(part.strip() for part in value.decode("latin-1").split(","))
    for hop in reversed(forwarded):
        if _ip(hop) is None:
            break  # a malformed hop: nothing to its left can be believed
        if not _trusted(hop, proxies):
            return str(_ip(hop))
    return peer
