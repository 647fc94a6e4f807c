"""Loopback helpers: free TCP ports on 127.0.0.1, never the same one twice in a process."""

from __future__ import annotations

import socket
import threading

_handed_out: set[int] = set()  # a port handed out may not be bound yet by the server it was meant for
_lock = threading.Lock()


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing holds now and that this process has not handed out before.

    The kernel may give a closed port back at once, so two calls in a row (a server
    that has not bound its port yet, then another part) could otherwise collide."""
    with _lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port


def free_port_pair(host: str = "127.0.0.1") -> int:
    """A free port whose successor is free too (a baseline and its candidate); both count as handed out."""
    with _lock:
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port + 1 < 65536 and not {port, port + 1} & _handed_out and _bindable(host, port + 1):
                _handed_out.update((port, port + 1))
                return port
