"""Request limits over real HTTP (`drumsd serve`, in-memory runtime): the probe suite's bad bodies.

Issue 14, finding 9: JSON nested 1,000+ deep was a 500 (RecursionError), and after a 413 the
keep-alive connection hung the next request for 15-20 s.
"""

from __future__ import annotations

import socket
import time

from drumsd.api.app import MAX_BODY_BYTES
from drumsd.api.limits import MAX_JSON_DEPTH
from drumsd_process import Daemon


def nested(depth: int) -> bytes:
    return b'{"action": ' + b"[" * depth + b"]" * depth + b"}"


def test_deep_json_is_a_400_naming_the_limit(daemon: Daemon) -> None:
    with daemon.client() as c:
        sid = c.post("/v1/slots", json={}).json()["id"]
        for depth in (MAX_JSON_DEPTH + 1, 1_000, 5_000, 200_000):
            started = time.monotonic()
            r = c.post(f"/v1/slots/{sid}/step", content=nested(depth))
            assert r.status_code == 400, (depth, r.text)
            error = r.json()["error"]
            assert error["code"] == "invalid_request"
            assert f"deeper than {MAX_JSON_DEPTH}" in error["message"]
            assert time.monotonic() - started < 2, depth
        # A create body (the task is free-form JSON) is held to the same limit.
        deep_task = b'{"task": {"id": "t", "x": ' + b"[" * 2_000 + b"]" * 2_000 + b"}}"
        r = c.post("/v1/slots", content=deep_task)
        assert r.status_code == 400, r.text
        # At the limit the body reaches the model and is an ordinary field error.
        r = c.post(f"/v1/slots/{sid}/step", content=nested(MAX_JSON_DEPTH - 1))
        assert r.status_code == 422, r.text
        assert c.get("/v1/health").status_code == 200
    assert "RecursionError" not in daemon.log()


def test_after_a_413_the_next_request_is_answered_at_once(daemon: Daemon) -> None:
    with daemon.client() as c:
        sid = c.post("/v1/slots", json={}).json()["id"]
        r = c.post(f"/v1/slots/{sid}/step", content=b"x" * (MAX_BODY_BYTES + 1))
        assert r.status_code == 413, r.text
        assert str(MAX_BODY_BYTES) in r.json()["error"]["message"]
        for _ in range(3):
            started = time.monotonic()
            assert c.get("/v1/health").status_code == 200
            assert time.monotonic() - started < 2


def test_a_declared_oversize_body_is_refused_without_waiting_for_it(daemon: Daemon) -> None:
    # Content-Length says 1 GiB and nothing follows: the 413 comes before any body, and says
    # the connection closes (the server does not wait for a gigabyte).
    host, port = daemon.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(
            b"POST /v1/slots HTTP/1.1\r\nHost: drumsd\r\n"
            + f"Authorization: Bearer {daemon.token}\r\n".encode()
            + f"Content-Length: {1 << 30}\r\n\r\n".encode()
        )
        started = time.monotonic()
        reply = b""
        while b"}}" not in reply:
            reply += s.recv(65536)
        assert time.monotonic() - started < 3
    head = reply.split(b"\r\n", 1)[0]
    assert b" 413 " in head + b" ", reply[:200]
    assert b"connection: close" in reply.lower()
