"""Listening sockets on the host's loopback for the ports forwarded to slots."""

from __future__ import annotations

import socket
from collections.abc import Iterable


def listen_loopback(ports: Iterable[int], backlog: int = 64) -> list[socket.socket]:
    """One listening TCP socket on 127.0.0.1 per port, all or none: OSError (e.g. EADDRINUSE,
    naming the port) after closing the ones already bound."""
    bound: list[socket.socket] = []
    try:
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError as exc:
                raise OSError(exc.errno, f"127.0.0.1:{port}: {exc.strerror}") from exc
            sock.listen(backlog)
            sock.setblocking(False)
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound
