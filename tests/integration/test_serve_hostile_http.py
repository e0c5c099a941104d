"""Hostile HTTP clients against a real `drumsd serve` (in-memory runtime), issue 39.

D1: one HTTP/2 request (h2c prior knowledge, a body over the limit streamed) ended the daemon:
hypercorn's h2 code raised KeyError on the closed stream's DATA frames and it escaped the server.
D6: bodies were read before the token check and held until quart's 60 s body timeout: 24
connections each holding a 16 MiB body one byte short added 353 MiB.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator

import h2.errors
import h2.events
import httpx
import pytest
from drumsd.api.app import MAX_BODY_BYTES, PEER_BODY_BYTES
from drumsd_process import Daemon, make_daemon
from hostile_clients import (
    address,
    h2_post,
    read_reply,
    request_head,
    rss_mib,
    send_quietly,
    status_of,
)

BODY_TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    """One daemon for the module (a start costs seconds on a loaded host): every test leaves it
    as it found it, and checks it still answers."""
    d = make_daemon(tmp_path_factory.mktemp("hostile"), body_timeout_s=BODY_TIMEOUT_S).start()
    try:
        yield d
    finally:
        d.stop()


def assert_answers(daemon: Daemon) -> None:
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log()[-3000:]
    assert httpx.get(daemon.url + "/healthz", timeout=5).status_code == 200
    with daemon.client() as c:
        assert c.get("/v1/health").status_code == 200
        created = c.post("/v1/slots", json={})
        assert created.status_code == 201, created.text
        assert c.delete(f"/v1/slots/{created.json()['id']}").status_code in (200, 204)


def test_an_http2_body_over_the_limit_does_not_end_the_daemon(daemon: Daemon) -> None:
    for token in (None, daemon.token):
        out = h2_post(daemon.url, "/v1/slots", MAX_BODY_BYTES + (1 << 20), token=token)
        time.sleep(0.3)  # the daemon used to exit a moment after the DATA frames
        assert_answers(daemon)
        # Refused at the preface: a GOAWAY HTTP_1_1_REQUIRED (when the client read it before the
        # close) and no response; before, a 413 and then the daemon's exit.
        assert not any(isinstance(e, h2.events.ResponseReceived) for e in out.events), out
        ended = out.terminated()
        if ended is not None:
            assert ended.error_code == h2.errors.ErrorCodes.HTTP_1_1_REQUIRED, out
        assert out.sent_body < MAX_BODY_BYTES, out
    assert "Traceback" not in daemon.log()


def test_an_h2c_upgrade_is_served_as_http_1_1(daemon: Daemon) -> None:
    with socket.create_connection(address(daemon.url), timeout=5) as s:
        s.sendall(
            b"GET /healthz HTTP/1.1\r\nHost: drumsd\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n"
        )
        reply, _ = read_reply(s, 2)
    assert status_of(reply) == 200, reply[:200]
    assert_answers(daemon)


def test_without_the_token_a_body_is_refused_at_its_headers(daemon: Daemon) -> None:
    # Headers that promise 16 MiB, and no body yet: the 401 comes at once, and the connection
    # closes (the body is never read).
    with socket.create_connection(address(daemon.url), timeout=5) as s:
        s.sendall(request_head("/v1/slots", token=None, content_length=MAX_BODY_BYTES))
        started = time.monotonic()
        reply, closed = read_reply(s, 3)
    assert status_of(reply) == 401, reply[:300]
    assert time.monotonic() - started < 2
    assert closed
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "unauthorized"
    assert "Authorization: Bearer" in body["error"]["message"]


def test_held_unauthenticated_bodies_do_not_grow_the_daemon(daemon: Daemon) -> None:
    # The probe: 24 connections each send a 16 MiB body one byte short and hold it.
    assert daemon.proc is not None
    before = rss_mib(daemon.proc.pid)
    held: list[socket.socket] = []
    taken = 0
    try:
        for _ in range(24):
            s = socket.create_connection(address(daemon.url), timeout=5)
            held.append(s)
            s.sendall(request_head("/v1/slots", token=None, content_length=MAX_BODY_BYTES))
            for _ in range(16):
                taken += send_quietly(s, b" " * (1 << 20) if _ < 15 else b" " * ((1 << 20) - 1))
        time.sleep(1)
        grown = rss_mib(daemon.proc.pid) - before
    finally:
        for s in held:
            s.close()
    # Before the fix: ~15 MiB per connection (353 MiB measured by the probe).
    print(f"RSS grew {grown:.1f} MiB holding 24 refused bodies")
    assert grown < 64, f"the daemon grew by {grown:.0f} MiB holding 24 refused bodies"
    assert taken < 24 * MAX_BODY_BYTES  # the server closed on them
    assert_answers(daemon)


def test_a_slow_authenticated_body_times_out_with_a_408(daemon: Daemon) -> None:
    d = daemon
    with socket.create_connection(address(d.url), timeout=5) as s:
        s.sendall(request_head("/v1/slots", token=d.token, content_length=1000))
        s.sendall(b"{")  # and nothing more
        started = time.monotonic()
        reply, closed = read_reply(s, BODY_TIMEOUT_S + 5)
    waited = time.monotonic() - started
    assert status_of(reply) == 408, reply[:300]
    assert BODY_TIMEOUT_S - 0.5 < waited < BODY_TIMEOUT_S + 4
    assert closed
    error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert f"within {BODY_TIMEOUT_S:g} s (body_timeout_s)" in error["message"]
    assert_answers(d)


def test_one_peer_gets_a_429_past_its_bodies_in_flight(daemon: Daemon) -> None:
    d = daemon
    held: list[socket.socket] = []
    try:
        for _ in range(PEER_BODY_BYTES // MAX_BODY_BYTES):
            s = socket.create_connection(address(d.url), timeout=5)
            held.append(s)
            s.sendall(request_head("/v1/slots", token=d.token, content_length=MAX_BODY_BYTES))
        time.sleep(0.3)
        with socket.create_connection(address(d.url), timeout=5) as s:
            s.sendall(request_head("/v1/slots", token=d.token, content_length=100))
            reply, closed = read_reply(s, 2)
        assert status_of(reply) == 429, reply[:300]
        assert closed and b"retry-after: 1" in reply.lower()
        error = json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["code"] == "overloaded" and error["detail"]["limit"] == PEER_BODY_BYTES
        # A request without a body is not held to the budget.
        with d.client() as c:
            assert c.get("/v1/health").status_code == 200
    finally:
        for s in held:
            s.close()
    # The held bodies time out (or their connections closed): the budget is back.
    deadline = time.monotonic() + BODY_TIMEOUT_S + 5
    while True:
        with d.client() as c:
            r = c.post("/v1/slots", json={})
        if r.status_code == 201 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 201, r.text
