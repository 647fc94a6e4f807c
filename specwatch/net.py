"""Loopback helpers: a free TCP port on 127.0.0.1."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
