"""Ports for brokers the tests start: free now, and out of the kernel's ephemeral range.

A port from ``bind(0)`` is an ephemeral one: once it is closed, the next outgoing
connection of any process on the machine may take it before the broker under test binds
it ("Address already in use" at start, seen with two pytest workers and brokers that bind
five ports each). Ports below the ephemeral range are never handed out for outgoing
connections, so only another test choosing the same port at the same moment can collide.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # below: well-known and registered services
_given: set[int] = set()  # never the same port twice in one process


def _ephemeral_low() -> int:
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def free_port() -> int:
    """A port nothing listens on, on 127.0.0.1, below the ephemeral range when there is room
    (else an ephemeral one, as ``bind(0)`` gives)."""
    high = _ephemeral_low()
    for _ in range(200 if high - _LOWEST > 1_000 else 0):  # bounded
        port = random.randrange(_LOWEST, high)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    _given.add(port)
    return port
