"""A hand-written HTTP upstream on loopback, for exporter tests that need bytes no real server would write.

`loopback_upstream(answer)` accepts one request per connection, reads its head and its Content-Length body,
answers anything but a POST (the exporter's health probe) with an empty 200, and hands each POST to `answer`
with the connection, which it closes afterwards.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

EMPTY_OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def request_headers(request: bytes) -> dict[str, str]:
    """The header fields of a request's head, names lowercased."""
    lines = request.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}


def read_request(conn: socket.socket) -> bytes | None:
    """One request's bytes, head and body; None where the client closed before its head was complete."""
    got = b""
    while b"\r\n\r\n" not in got:
        more = conn.recv(65536)
        if not more:
            return None
        got += more
    length = int(request_headers(got).get("content-length", "0"))
    while len(got.split(b"\r\n\r\n", 1)[1]) < length:
        more = conn.recv(65536)
        if not more:
            break
        got += more
    return got


@contextlib.contextmanager
def loopback_upstream(answer: Callable[[socket.socket, bytes], None]) -> Iterator[str]:
    """Serve until the block ends, each POST answered by `answer(conn, request_bytes)`; yields the URL."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                with conn:
                    got = read_request(conn)
                    if got is None:
                        continue
                    if not got.startswith(b"POST "):
                        conn.sendall(EMPTY_OK)
                        continue
                    answer(conn, got)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        server.close()
