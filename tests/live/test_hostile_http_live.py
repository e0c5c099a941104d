"""Hostile HTTP against the live daemon (Linux runtime, real slots), issue 39: one HTTP/2 request
with a body over the limit ended drumsd (D1), and bodies were read before the token check (D6).
The full set of cases runs against the in-memory daemon (tests/integration/
test_serve_hostile_http.py, test_fuzz_connections.py); here the two findings, as the probe sent
them, against the daemon that holds real desktops, whose slot must still answer after."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import h2.events
import httpx
import pytest
from drumsd.api.app import MAX_BODY_BYTES
from hostile_clients import address, h2_post, read_reply, request_head, status_of
from live_daemon import Daemon, http_client


@pytest.fixture
def slot(live_daemon: Daemon) -> Iterator[str]:
    with http_client(live_daemon) as http:
        r = http.post("/v1/slots", json={})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        try:
            yield sid
        finally:
            http.delete(f"/v1/slots/{sid}")


def assert_answers(daemon: Daemon, sid: str) -> None:
    assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log()[-3000:]
    assert httpx.get(daemon.url + "/healthz", timeout=10).status_code == 200
    with http_client(daemon) as http:
        assert http.get("/v1/health").status_code == 200
        r = http.post(
            f"/v1/slots/{sid}/step", json={"action": {"type": "execute", "command": "echo up"}}
        )
        assert r.status_code == 200 and r.json()["output"]["stdout"].strip() == "up", r.text


def test_an_http2_body_over_the_limit_leaves_the_daemon_and_its_slot(
    live_daemon: Daemon, slot: str
) -> None:
    for token in (None, live_daemon.token):
        out = h2_post(live_daemon.url, "/v1/slots", MAX_BODY_BYTES + (2 << 20), token=token)
        time.sleep(0.3)  # the daemon used to exit a moment after the DATA frames
        assert_answers(live_daemon, slot)
        assert not any(isinstance(e, h2.events.ResponseReceived) for e in out.events), out


def test_a_body_without_the_token_is_refused_at_its_headers(live_daemon: Daemon, slot: str) -> None:
    with socket.create_connection(address(live_daemon.url), timeout=5) as s:
        s.sendall(request_head(f"/v1/slots/{slot}/step", token=None, content_length=MAX_BODY_BYTES))
        started = time.monotonic()
        reply, closed = read_reply(s, 3)
    assert status_of(reply) == 401 and closed, reply[:300]
    assert time.monotonic() - started < 2
    assert_answers(live_daemon, slot)
