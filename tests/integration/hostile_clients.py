"""Clients that misbehave on purpose, over raw sockets: HTTP/2 (h2c prior knowledge, with the
`h2` package hypercorn depends on), slow or never-ending HTTP/1.1 bodies. Used by the request
limit tests and the connection fuzzer; each returns what it saw and never raises for what the
server did to the connection (a reset, a close)."""

from __future__ import annotations

import select
import socket
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions

GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


@dataclass
class H2Outcome:
    events: list = field(default_factory=list)
    sent_body: int = 0
    error: str | None = None

    def terminated(self) -> h2.events.ConnectionTerminated | None:
        found = [e for e in self.events if isinstance(e, h2.events.ConnectionTerminated)]
        return found[0] if found else None


def h2_post(
    url: str,
    path: str,
    body_bytes: int,
    *,
    token: str | None = None,
    reset_after: int | None = None,
    limit_s: float = 20.0,
) -> H2Outcome:
    """POST `body_bytes` over HTTP/2 with prior knowledge, streamed in DATA frames within flow
    control; with `reset_after`, RST_STREAM once that many bytes are sent."""
    out = H2Outcome()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    headers = [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "drumsd")]
    headers.append(("content-type", "application/json"))
    if token is not None:
        headers.append(("authorization", f"Bearer {token}"))
    conn.send_headers(1, headers)
    deadline = time.monotonic() + limit_s
    chunk = b" " * 16384

    def drain(s: socket.socket) -> None:
        while select.select([s], [], [], 0)[0] and (data := s.recv(65536)):
            out.events += conn.receive_data(data)

    try:
        with socket.create_connection(address(url), timeout=5) as s:
            s.sendall(conn.data_to_send())
            while out.sent_body < body_bytes and time.monotonic() < deadline:
                drain(s)
                if reset_after is not None and out.sent_body >= reset_after:
                    conn.reset_stream(1)
                    s.sendall(conn.data_to_send())
                    break
                room = min(conn.local_flow_control_window(1), conn.max_outbound_frame_size)
                if room <= 0:
                    data = s.recv(65536)
                    if not data:
                        break
                    out.events += conn.receive_data(data)
                    s.sendall(conn.data_to_send())
                    continue
                n = min(room, len(chunk), body_bytes - out.sent_body)
                conn.send_data(1, chunk[:n], end_stream=out.sent_body + n >= body_bytes)
                s.sendall(conn.data_to_send())
                out.sent_body += n
            s.settimeout(2)
            while data := s.recv(65536):
                out.events += conn.receive_data(data)
                s.sendall(conn.data_to_send())
    except (*GONE, h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError) as exc:
        out.error = repr(exc)
    return out


def request_head(
    path: str, *, token: str | None, content_length: int | None, chunked: bool = False
) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: drumsd\r\nContent-Type: application/json\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    if content_length is not None:
        head += f"Content-Length: {content_length}\r\n"
    if chunked:
        head += "Transfer-Encoding: chunked\r\n"
    return (head + "\r\n").encode()


def read_reply(s: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """What the server sends within `limit_s` (a whole reply), and whether it then closed."""
    s.settimeout(0.2)
    reply = b""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            chunk = s.recv(65536)
        except TimeoutError:
            continue
        except GONE:
            return reply, True
        if not chunk:
            return reply, True
        reply += chunk
    return reply, False


def status_of(reply: bytes) -> int | None:
    parts = reply.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[0].startswith(b"HTTP/1.") else None


def send_quietly(s: socket.socket, data: bytes) -> int:
    """Send what the server takes; 0 once it has closed or reset the connection."""
    try:
        s.sendall(data)
    except GONE:
        return 0
    return len(data)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")
