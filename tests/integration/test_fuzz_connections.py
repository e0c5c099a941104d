"""Connection-level fuzz of a running daemon, beside the OpenAPI fuzzer (which sends well-formed
HTTP/1.1): seeded random hostile connections, eight at a time, against one `drumsd serve`.

HTTP/2 with prior knowledge (bodies over the limit, RST_STREAM mid-body, garbage frames), h2c
upgrades, slow and never-ending HTTP/1.1 bodies with and without the token, headers that never
end, declared bodies cut short, random bytes. Each case checks its own answer (HTTP/2 is never
served, a body without the token is refused at once, a slow one gets 408 or 429, an idle one is
closed); the daemon must never exit, and answer its health and an authenticated route after.
Issue 39 D1: one HTTP/2 request ended the daemon; D6: slow bodies were never timed out.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import h2.events
import httpx
import pytest
from drumsd.api.app import MAX_BODY_BYTES
from drumsd_process import Daemon, make_daemon
from hostile_clients import (
    address,
    h2_post,
    read_reply,
    request_head,
    send_quietly,
    status_of,
)

BODY_TIMEOUT_S = 2.0
KEEP_ALIVE_S = 5.0  # hypercorn's keep_alive_timeout: idle connections, unfinished headers too
SEED = int(os.environ.get("DRUMS_FUZZ_SEED", "20261206"))
CASES = 40


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = make_daemon(tmp_path_factory.mktemp("fuzz-conn"), body_timeout_s=BODY_TIMEOUT_S).start()
    try:
        yield d
    finally:
        d.stop()


Case = Callable[[Daemon, random.Random], str]


def h2_over_limit(d: Daemon, rng: random.Random) -> str:
    size = MAX_BODY_BYTES + rng.randrange(1, 4 << 20)
    out = h2_post(d.url, "/v1/slots", size, token=rng.choice([None, d.token]), limit_s=10)
    assert not any(isinstance(e, h2.events.ResponseReceived) for e in out.events), out
    return f"h2 body {size}"


def h2_reset_mid_body(d: Daemon, rng: random.Random) -> str:
    at = rng.randrange(0, 1 << 20)
    out = h2_post(d.url, "/v1/slots", 2 << 20, token=d.token, reset_after=at, limit_s=10)
    assert not any(isinstance(e, h2.events.ResponseReceived) for e in out.events), out
    return f"h2 RST_STREAM after {at}"


def h2_garbage_frames(d: Daemon, rng: random.Random) -> str:
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    frames = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4096)))
    with socket.create_connection(address(d.url), timeout=5) as s:
        send_quietly(s, preface + frames)
        reply, closed = read_reply(s, 3)
    assert closed and b"HTTP/1.1 " not in reply[:9], reply[:100]
    return f"h2 preface + {len(frames)} random bytes"


def h2c_upgrade(d: Daemon, rng: random.Random) -> str:
    body = rng.choice([b"", b"{}"])
    head = (
        b"POST /v1/slots HTTP/1.1\r\nHost: drumsd\r\nConnection: Upgrade, HTTP2-Settings\r\n"
        b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
        + f"Authorization: Bearer {d.token}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
    )
    with socket.create_connection(address(d.url), timeout=5) as s:
        s.sendall(head + body)
        reply, _ = read_reply(s, 1.5)
    assert status_of(reply) not in (None, 101), reply[:200]
    if status_of(reply) == 201:  # an empty body creates a slot: leave none behind
        sid = json.loads(reply.split(b"\r\n\r\n", 1)[1])["id"]
        with d.client() as c:
            c.delete(f"/v1/slots/{sid}")
    return f"h2c upgrade, body {len(body)}"


def slow_body_without_token(d: Daemon, rng: random.Random) -> str:
    declared = rng.choice([100, 1 << 20, MAX_BODY_BYTES])
    with socket.create_connection(address(d.url), timeout=5) as s:
        s.sendall(request_head("/v1/slots", token=None, content_length=declared))
        send_quietly(s, b"{")
        started = time.monotonic()
        reply, closed = read_reply(s, 3)
    assert status_of(reply) == 401 and closed, reply[:200]
    assert time.monotonic() - started < 2
    return f"slow unauthenticated body of {declared}"


def slow_body_with_token(d: Daemon, rng: random.Random) -> str:
    chunked = rng.random() < 0.3
    declared = None if chunked else rng.choice([10, 1 << 20, MAX_BODY_BYTES])
    with socket.create_connection(address(d.url), timeout=5) as s:
        s.sendall(
            request_head("/v1/slots", token=d.token, content_length=declared, chunked=chunked)
        )
        deadline = time.monotonic() + BODY_TIMEOUT_S + 4
        reply = b""
        while time.monotonic() < deadline and not reply:  # a byte now and then, never all
            send_quietly(s, b"1\r\n \r\n" if chunked else b" ")
            reply, closed = read_reply(s, 0.5)
        if reply and not closed:
            more, closed = read_reply(s, 2)
            reply += more
    assert status_of(reply) in (408, 429) and closed, reply[:200]
    return f"slow authenticated body ({'chunked' if chunked else declared}): {status_of(reply)}"


def headers_never_end(d: Daemon, rng: random.Random) -> str:
    with socket.create_connection(address(d.url), timeout=5) as s:
        s.sendall(b"POST /v1/slots HTTP/1.1\r\nHost: drumsd\r\n")
        started = time.monotonic()
        _, closed = read_reply(s, KEEP_ALIVE_S + 4)
    assert closed and time.monotonic() - started < KEEP_ALIVE_S + 4
    return "headers that never end"


def body_cut_short(d: Daemon, rng: random.Random) -> str:
    declared = rng.randrange(1000, MAX_BODY_BYTES)
    with socket.create_connection(address(d.url), timeout=5) as s:
        s.sendall(
            request_head("/v1/slots", token=rng.choice([None, d.token]), content_length=declared)
        )
        send_quietly(s, b" " * rng.randrange(0, min(declared, 1 << 20)))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return f"body of {declared} cut short (RST)"


def random_bytes(d: Daemon, rng: random.Random) -> str:
    junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2048)))
    with socket.create_connection(address(d.url), timeout=5) as s:
        send_quietly(s, junk)
        reply, closed = read_reply(s, KEEP_ALIVE_S + 3)
    assert closed or status_of(reply) is not None, reply[:100]
    return f"{len(junk)} random bytes"


CASE_KINDS: list[Case] = [
    h2_over_limit,
    h2_reset_mid_body,
    h2_garbage_frames,
    h2c_upgrade,
    slow_body_without_token,
    slow_body_with_token,
    headers_never_end,
    body_cut_short,
    random_bytes,
]


def test_hostile_connections_never_end_the_daemon(daemon: Daemon) -> None:
    rng = random.Random(SEED)
    # Every kind at least once, the rest drawn; each case has its own seeded generator.
    kinds = CASE_KINDS + [rng.choice(CASE_KINDS) for _ in range(CASES - len(CASE_KINDS))]
    cases = [(kind, random.Random(rng.random())) for kind in kinds]
    done: list[str] = []
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(kind, daemon, case_rng) for kind, case_rng in cases]
        for (kind, _), future in zip(cases, futures, strict=True):
            try:
                done.append(future.result(timeout=60))
            except Exception as exc:
                raise AssertionError(f"seed {SEED}, case {kind.__name__}: {exc!r}") from exc
            assert daemon.proc is not None and daemon.proc.poll() is None, (
                f"seed {SEED}: drumsd exited after {kind.__name__}:\n{daemon.log()[-4000:]}"
            )
    assert len(done) == CASES
    assert httpx.get(daemon.url + "/healthz", timeout=5).status_code == 200
    with daemon.client() as c:
        created = c.post("/v1/slots", json={})
        assert created.status_code == 201, created.text
        assert c.delete(f"/v1/slots/{created.json()['id']}").status_code in (200, 204)
    log = daemon.log()
    assert "Traceback" not in log, log[-4000:]
    assert "failed in the HTTP server" not in log, log[-4000:]
