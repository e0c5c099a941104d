"""The HTTP server (api/http_server.py) in process, on a loopback socket: one connection's failure
ends only that connection, HTTP/2 is refused, and the accept loop restarts a bounded number of
times."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import h2.config
import h2.connection
import h2.errors
import h2.events
import pytest
import trio
from drumsd.api.http_server import (
    Connection,
    HTTPServer,
    ListenerFailed,
    RestartBudget,
    hyper_config,
)
from hypercorn.events import Closed, RawData
from hypercorn.trio.worker_context import WorkerContext
from quart_trio import QuartTrio
from trio.testing import MockClock


def tiny_app() -> QuartTrio:
    app = QuartTrio("t")

    @app.route("/")
    async def index() -> str:
        return "ok"

    return app


class FailsOnBoom(Connection):
    """Fails inside the connection's task group, as hypercorn's h2 code did with its KeyError."""

    async def _read_data(self) -> None:
        data = await self.stream.receive_some(65536)
        if b"boom" in data:
            raise KeyError(1)
        await self.protocol.handle(RawData(data))
        await super()._read_data()


@asynccontextmanager
async def serving(**kw) -> AsyncIterator[tuple[HTTPServer, int]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = HTTPServer(tiny_app(), hyper_config(2.0), sock, trio.Event(), **kw)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server, sock.getsockname()[1]
        server.shutdown.set()


async def get(port: int, request: bytes = b"GET / HTTP/1.1\r\nHost: t\r\n\r\n") -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(request)
        reply = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                reply += chunk
                if b"\r\n\r\n" in reply and reply.endswith(b"ok"):
                    break
    return reply


async def test_a_failing_connection_is_logged_and_the_server_goes_on(caplog) -> None:
    caplog.set_level(logging.ERROR, "drumsd.http")
    async with serving(connection=FailsOnBoom) as (server, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"boom")
            with trio.fail_after(5):
                assert await stream.receive_some(10) == b""  # that connection is closed
        for _ in range(3):
            assert (await get(port)).startswith(b"HTTP/1.1 200")
    assert server.failed_connections == 1
    assert "failed in the HTTP server and was closed" in caplog.text
    assert "KeyError" in caplog.text


async def test_http2_prior_knowledge_gets_goaway_http_1_1_required() -> None:
    async with serving() as (_, port):
        client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        client.initiate_connection()
        client.send_headers(
            1, [(":method", "GET"), (":path", "/"), (":scheme", "http"), (":authority", "t")]
        )
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        events: list = []
        async with stream:
            await stream.send_all(client.data_to_send())
            with trio.fail_after(5):
                while chunk := await stream.receive_some(65536):
                    events += client.receive_data(chunk)
        ended = [e for e in events if isinstance(e, h2.events.ConnectionTerminated)]
        assert ended and ended[0].error_code == h2.errors.ErrorCodes.HTTP_1_1_REQUIRED
        assert ended[0].additional_data == b"drumsd serves HTTP/1.1 only"
        assert not any(isinstance(e, h2.events.ResponseReceived) for e in events)
        assert (await get(port)).startswith(b"HTTP/1.1 200")


async def test_an_h2c_upgrade_is_answered_in_http_1_1() -> None:
    async with serving() as (_, port):
        reply = await get(
            port,
            b"GET / HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
        )
        assert reply.startswith(b"HTTP/1.1 200"), reply[:100]
        assert reply.endswith(b"ok")


class FlakyListener:
    """accept() fails `failures` times with EBADF (not a transient error), then blocks."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def accept(self) -> trio.SocketStream:
        self.calls += 1
        if self.calls <= self.failures:
            raise OSError(errno.EBADF, "Bad file descriptor")
        await trio.sleep_forever()
        raise AssertionError


async def ignore(stream: trio.SocketStream) -> None:
    await stream.aclose()


async def accept_with(server: HTTPServer, listener: FlakyListener, limit_s: float) -> None:
    async with trio.open_nursery() as nursery:
        with trio.move_on_after(limit_s):
            await server._accept(listener, nursery, ignore)  # type: ignore[arg-type]


async def test_the_accept_loop_restarts_within_its_budget_then_gives_up(
    caplog: pytest.LogCaptureFixture, autojump_clock: MockClock
) -> None:
    """Restart backoff and the accept windows run in virtual time."""
    caplog.set_level(logging.ERROR, "drumsd.http")
    sock = socket.socket()
    server = HTTPServer(tiny_app(), hyper_config(1.0), sock, trio.Event())
    server.restarts = RestartBudget(limit=2, window_s=60)
    listener = FlakyListener(failures=2)
    await accept_with(server, listener, 2.0)  # two failures, two restarts, then accepting again
    assert listener.calls == 3
    assert caplog.text.count("the HTTP listener failed") == 2
    with pytest.raises(ExceptionGroup) as raised:
        await accept_with(server, FlakyListener(failures=1), 2.0)
    assert raised.group_contains(ListenerFailed, match="failed 3 times within 60 s")
    sock.close()


def test_the_restart_budget_counts_a_sliding_window() -> None:
    budget = RestartBudget(limit=2, window_s=10)
    assert budget.allow(0) and budget.allow(1)
    assert not budget.allow(5)
    assert budget.allow(10.5)  # the first left the window
    assert not budget.allow(10.9)
    assert budget.used == 2


async def test_an_answer_before_the_body_closes_the_connection() -> None:
    app = tiny_app()

    @app.before_request
    async def refuse() -> tuple[str, int, dict[str, str]]:
        return "no", 401, {"Connection": "close"}

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = HTTPServer(app, hyper_config(1.0), sock, trio.Event())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        stream = await trio.open_tcp_stream("127.0.0.1", sock.getsockname()[1])
        async with stream:
            await stream.send_all(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
            reply = b""
            with trio.fail_after(3):  # it stayed open (quart-trio cancelled hypercorn's close)
                while chunk := await stream.receive_some(65536):
                    reply += chunk
        assert reply.startswith(b"HTTP/1.1 401")
        server.shutdown.set()


async def wait_open(server: HTTPServer, count: int) -> None:
    with trio.fail_after(2):
        while sum(server._open.values()) != count:  # noqa: ASYNC110 (a count, no event to wait on)
            await trio.sleep(0.01)


async def test_a_peer_over_its_connection_limit_gets_a_429_and_a_close() -> None:
    async with serving(max_connections_per_peer=2) as (server, port):
        first = await trio.open_tcp_stream("127.0.0.1", port)
        second = await trio.open_tcp_stream("127.0.0.1", port)
        await wait_open(server, 2)
        third = await trio.open_tcp_stream("127.0.0.1", port)
        reply = b""
        async with third:
            with trio.fail_after(5):
                while chunk := await third.receive_some(65536):
                    reply += chunk
        assert reply.startswith(b"HTTP/1.1 429"), reply[:100]
        assert b'"code": "overloaded"' in reply and b"at most 2" in reply
        await first.aclose()
        await wait_open(server, 1)  # closed at once, not after the keep-alive timeout
        assert (await get(port)).startswith(b"HTTP/1.1 200")  # room again
        await second.aclose()
    assert server._open == {}


class RecordsEvents:
    """The protocol's side of a connection: what protocol_send reports to it."""

    def __init__(self) -> None:
        self.events: list[object] = []

    async def handle(self, event: object) -> None:
        self.events.append(event)


async def test_a_response_sent_while_the_connection_closes_is_dropped_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hypercorn's close sends EOF outside the send lock, and SocketStream.send_eof holds the
    stream's send side across a checkpoint: a response sent then raised BusyResourceError into the
    app (a traceback in CI's fuzz test). The closing task is held at that checkpoint here, so the
    race is hit every run, on a real socket pair."""
    ours, peer = trio.socket.socketpair()
    stream = trio.SocketStream(ours)
    conn = Connection(tiny_app(), hyper_config(1.0), WorkerContext(None), {}, stream)  # type: ignore[arg-type]
    protocol = RecordsEvents()
    conn.protocol = protocol  # type: ignore[assignment]
    in_send_eof, resume = trio.Event(), trio.Event()
    real_checkpoint = trio.lowlevel.checkpoint
    hold: trio.lowlevel.Task | None = None

    async def checkpoint() -> None:  # send_eof's checkpoint, held once for the closing task
        nonlocal hold
        if hold is trio.lowlevel.current_task():
            hold = None
            in_send_eof.set()
            await resume.wait()
        await real_checkpoint()

    monkeypatch.setattr(trio.lowlevel, "checkpoint", checkpoint)

    async def close() -> None:
        nonlocal hold
        hold = trio.lowlevel.current_task()
        await conn._close()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close)
        await in_send_eof.wait()
        try:
            await conn.protocol_send(RawData(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"))
        finally:
            resume.set()  # the close is shielded: it must not wait for ever when this fails
        assert [type(e) for e in protocol.events] == [Closed]  # told, as for a closed socket
    with trio.fail_after(2):
        assert await peer.recv(100) == b""  # the close went through: EOF, nothing half-sent
    peer.close()


def slow_app() -> QuartTrio:
    app = tiny_app()

    @app.route("/slow")
    async def slow() -> str:
        await trio.sleep(0.6)
        return "ok"

    return app


@asynccontextmanager
async def keep_alive_server(
    keep_alive_s: float, drain_s: float = 10.0
) -> AsyncIterator[tuple[HTTPServer, int]]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = hyper_config(drain_s)
    config.keep_alive_timeout = keep_alive_s
    server = HTTPServer(slow_app(), config, sock, trio.Event())
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        yield server, sock.getsockname()[1]
        server.shutdown.set()


async def request_on(stream: trio.SocketStream, path: str = "/") -> bytes:
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
    reply = b""
    with trio.fail_after(5):
        while not reply.endswith(b"ok"):
            reply += await stream.receive_some(65536)
    return reply


async def test_a_connection_idle_after_a_request_closes_after_the_keep_alive_timeout() -> None:
    # The timer was restarted from the app's task, whose nursery quart-trio cancels as the
    # response ends: it died at once, so an idle client held its connection (and its place in
    # the peer's limit) until it closed it.
    async with keep_alive_server(0.5) as (server, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            assert (await request_on(stream)).startswith(b"HTTP/1.1 200")
            with trio.fail_after(3):
                assert await stream.receive_some(100) == b""  # the server closed it
        await wait_open(server, 0)


async def test_a_drain_closes_idle_keep_alive_connections_at_once() -> None:
    # A daemon's stop with an SDK client's idle connection open waited its whole drain (10 s).
    async with keep_alive_server(30.0, drain_s=10.0) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await request_on(stream)).startswith(b"HTTP/1.1 200")
        await trio.sleep(0.1)  # idle, as a client's pooled connection between requests
        t0 = trio.current_time()
    assert trio.current_time() - t0 < 2.0
    await stream.aclose()


async def test_a_request_on_a_kept_alive_connection_is_not_cut_by_its_idle_timer() -> None:
    async with keep_alive_server(0.3) as (_, port):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            assert (await request_on(stream)).startswith(b"HTTP/1.1 200")
            # Longer than the keep-alive timeout, right after the first answer.
            assert (await request_on(stream, "/slow")).startswith(b"HTTP/1.1 200")
            assert (await request_on(stream)).startswith(b"HTTP/1.1 200")
