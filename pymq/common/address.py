"""Network addresses as RocketMQ writes them: ``"host:port"``, with ``"[v6]:port"`` for IPv6.

Two readings, for two purposes:

- :func:`split_address` reads an address we are told to connect to (a name server, a broker,
  an HA master) and refuses anything that is not ``host:port``.
- :func:`host_of` reads a connected peer's address for a stored record's born host, which a 4.x
  record carries as IPv4 only: it never fails, and maps what it cannot carry to 127.0.0.1.
"""

from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (or ``"[v6]:port"``) into its parts; ValueError when it is not one."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"not a host:port address: {address!r}")
    return host.strip("[]"), int(port)


def host_of(address: str) -> tuple[str, int]:
    """A peer address as the IPv4 (ip, port) a 4.x record can carry."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if host.startswith("::ffff:"):
        host = host[7:]
    if ":" in host or not host:
        host = "127.0.0.1"  # the C++ client decodes IPv4 hosts only
    try:
        return host, int(port)
    except ValueError:
        return host, 0
