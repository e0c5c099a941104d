"""TCP_NODELAY on the tool server's listening socket.

verifiers' tool server binds its MCP socket itself (`socket.socket(AF_INET, SOCK_STREAM)`, protocol
0) and hands it to uvicorn. asyncio sets TCP_NODELAY only on sockets whose protocol is
IPPROTO_TCP, so the connections accepted from that socket keep Nagle's algorithm: uvicorn writes a
reply's headers and its body separately, the body waits for the ACK of the headers, and the chat
program's side delays that ACK by ~40 ms. Every tool call paid 44-48 ms for it (a 136-byte reply as
much as a 46 kB screenshot; docs/verifiers.md). Linux copies TCP_NODELAY from a listening socket to
the sockets it accepts, so setting it once on the bound socket, before uvicorn listens, is enough.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

log = logging.getLogger("drums_verifiers.tools")


def bound_port(env: dict[str, str]) -> int | None:
    """The port verifiers bound for this server: MCP_PORT, else the one in MCP_PORT_FILE."""
    for raw in (env.get("MCP_PORT"), _read(env.get("MCP_PORT_FILE"))):
        if raw and raw.strip().isdigit() and int(raw) > 0:
            return int(raw)
    return None


def _read(path: str | None) -> str | None:
    if not path:
        return None
    try:
        return Path(path).read_text()
    except OSError:
        return None


def set_nodelay_on_listener(port: int, fd_dir: Path = Path("/proc/self/fd")) -> int:
    """TCP_NODELAY on this process's unconnected TCP sockets bound to `port`; returns how many
    it set. A socket it cannot inspect is left as it is."""
    done = 0
    try:
        fds = [int(name) for name in os.listdir(fd_dir) if name.isdigit()]
    except OSError:
        return 0
    for fd in fds:
        try:
            if not os.readlink(fd_dir / str(fd)).startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with sock:
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6):
                    continue
                if sock.type != socket.SOCK_STREAM or _connected(sock):
                    continue
                if sock.getsockname()[1] != port:
                    continue
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                done += 1
            except OSError:
                continue
    return done


def _connected(sock: socket.socket) -> bool:
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


def tool_server_nodelay() -> None:
    """Called in the tool server's setup, after verifiers bound its socket."""
    port = bound_port(dict(os.environ))
    if port is None:  # not started by verifiers' launcher (a test, a shared server)
        return
    if not set_nodelay_on_listener(port):
        log.info("no bound MCP socket on port %s: replies keep Nagle's algorithm", port)
