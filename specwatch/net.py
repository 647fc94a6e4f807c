"""Loopback helpers: free TCP ports on 127.0.0.1, below the kernel's ephemeral range, never the same one twice.

A port picked for a server that starts later must stay free until it binds. The kernel hands out
ports of its ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by default) to every
outgoing connection and every `bind(port 0)`, so a port picked there can be taken meanwhile by a
connection of any process, or given again to this one. Ports are therefore drawn at random below
that range (where the kernel assigns nothing by itself), checked by binding them, and never handed
out twice in a process. Where the range cannot be read, or leaves too little room below it, the
kernel's `bind(0)` picks, still never twice.
"""

from __future__ import annotations

import random
import socket
import threading
from pathlib import Path

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 10000  # below: registered services' ports, and room left to what users configure by hand
TRIES = 200

_handed_out: set[int] = set()  # a port handed out may not be bound yet by the server it was meant for
_lock = threading.Lock()
_random = random.Random()  # seeded from os.urandom: processes that pick at once draw different ports


def ephemeral_range(source: Path = PORT_RANGE_FILE) -> tuple[int, int] | None:
    """The kernel's ephemeral port range (first, last), or None where it cannot be read."""
    try:
        first, last = (int(field) for field in source.read_text().split())
    except (OSError, ValueError):
        return None
    return first, last


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def _kernel_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _usable(host: str, port: int, width: int) -> bool:
    """Whether `width` ports from `port` on are in range, none handed out before, each bindable now."""
    block = range(port, port + width)
    return port + width <= 65536 and not _handed_out.intersection(block) and all(_bindable(host, p) for p in block)


def _draw(host: str, width: int) -> int:
    """The first of `width` consecutive free ports none of which was handed out; the caller holds the lock."""
    ephemeral = ephemeral_range()
    below = ephemeral[0] - width if ephemeral else 0
    for _ in range(TRIES if below - LOWEST >= 1000 else 0):
        port = _random.randrange(LOWEST, below + 1)
        if _usable(host, port, width):
            return port
    while True:  # no room below the ephemeral range, or it is full: the kernel's pick
        port = _kernel_port(host)
        if _usable(host, port, width):
            return port


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing holds now, below the ephemeral range, that this process has not handed out before."""
    with _lock:
        port = _draw(host, 1)
        _handed_out.add(port)
        return port


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A free port whose successor is free too (a baseline and its candidate); both count as handed out."""
    with _lock:
        port = _draw(host, 2)
        _handed_out.update((port, port + 1))
        return port
