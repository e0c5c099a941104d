"""The HTTP server under the app: HTTP/1.1 on hypercorn's protocol code, with no connection able
to end the server.

hypercorn's own `serve` runs every connection in one nursery, so an exception raised by one
connection's protocol code cancels all of them and ends the server: a streamed HTTP/2 (h2c) body
over the size limit raised KeyError in hypercorn's h2 code and drumsd exited (issue 39, D1).
Here each connection is its own failure domain (its error is logged, it is closed, the others go
on), and HTTP/2 is refused, since no client of drumsd needs it: prior knowledge gets a GOAWAY
HTTP_1_1_REQUIRED, and an `Upgrade: h2c` header is ignored (RFC 9113 section 3.2 lets a server
answer such a request in HTTP/1.1). A peer host may hold `max_connections_per_peer` connections
open; past that a new one gets a 429 and is closed unread. The accept loop restarts after an
error, a bounded number of times (`RestartBudget`), before the server gives up with
ListenerFailed. A response sent while its connection closes is dropped as one sent to a closed
socket is, not raised into the app (hypercorn sends EOF outside its send lock).
"""

from __future__ import annotations

import errno
import json
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.errors
import h11
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.events import Closed, Event, RawData, Updated
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.task_group import TaskGroup
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState, Framework
from hypercorn.utils import parse_socket_addr, repr_socket_addr, wrap_app

log = logging.getLogger("drumsd.http")

# accept() errors that mean "the host is short of something", not "the listener is broken":
# wait a moment and accept again (trio.serve_listeners does the same).
_TRANSIENT_ACCEPT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def refuse_http2() -> bytes:
    """What an HTTP/2 client with prior knowledge is sent: the server preface (its SETTINGS
    frame) and a GOAWAY HTTP_1_1_REQUIRED that says why, which h2 clients report as such."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    conn.initiate_connection()
    conn.close_connection(
        error_code=h2.errors.ErrorCodes.HTTP_1_1_REQUIRED,
        additional_data=b"drumsd serves HTTP/1.1 only",
    )
    return conn.data_to_send()


_REFUSE_HTTP2 = refuse_http2()


class _PriorKnowledgeHTTP2(Exception):
    pass


class HTTP11Protocol(H11Protocol):
    """hypercorn's HTTP/1.1 protocol without its two ways into HTTP/2."""

    async def handle(self, event: Event) -> None:
        try:
            await super().handle(event)
        except _PriorKnowledgeHTTP2:
            await self.send(RawData(data=_REFUSE_HTTP2))
            await self.send(Closed())

    async def _check_protocol(self, event: h11.Request) -> None:
        # hypercorn switches to HTTP/2 here: on `PRI * HTTP/2.0` (prior knowledge) and on an
        # `Upgrade: h2c` request without a body (after sending 101). Neither is served.
        if event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
            raise _PriorKnowledgeHTTP2


class Connection(TCPServer):
    """One accepted connection, served with HTTP11Protocol. drumsd never terminates TLS itself
    (docs/security.md: put TLS in front), so only hypercorn's plain-socket path is kept."""

    async def run(self) -> None:
        sock = self.stream.socket
        try:
            client = parse_socket_addr(sock.family, sock.getpeername())
            server = parse_socket_addr(sock.family, sock.getsockname())
            async with TaskGroup() as task_group:
                self._task_group = task_group
                self.protocol = HTTP11Protocol(  # type: ignore[assignment]
                    self.app,
                    self.config,
                    self.context,
                    task_group,
                    ConnectionState(self.state),
                    False,
                    client,
                    server,
                    self.protocol_send,
                )
                await self.protocol.initiate()
                await self.idle_task.restart(self._task_group, self._idle_timeout)
                await self._read_data()
                # The peer has gone: its keep-alive timer must not hold the connection (and its
                # count against the peer's limit) for keep_alive_timeout more.
                await self.idle_task.stop()
        except OSError:
            pass  # the peer went away
        finally:
            await self._close()

    async def protocol_send(self, event: Event) -> None:
        # hypercorn sends a response's bytes under send_lock but sends EOF in _close outside it,
        # and trio lets one task at a time into a stream's send side: a response sent while the
        # connection closes (the peer half-closed it, or another task closes it) raised
        # BusyResourceError into the app's ASGI send, logged as a traceback. A concurrent
        # send_eof means the connection is closing, so that response goes the way of one sent
        # to a closed socket (hypercorn's Broken/Closed case): dropped, and the protocol told.
        # _close does not take send_lock instead: send_all is shielded and blocks while the peer
        # does not read, so the close (shielded too) would wait until the peer reads, where now it
        # closes the socket and ends that send with ClosedResourceError.
        if isinstance(event, Updated):
            # The connection went idle (a response ended) or busy (a request began). Idle is
            # reported from the app's task, inside quart-trio's nursery, which is cancelled as
            # the response ends: the keep-alive timer hypercorn started from there died at once,
            # so an idle connection never closed (not after keep_alive_timeout, nor at a drain,
            # which then waited its whole graceful_timeout). The timer starts from a task of the
            # connection's own instead; a request that began meanwhile keeps it from starting.
            self._want_idle = event.idle
            if event.idle:
                self._task_group.spawn(self._start_idle_timer)
                return
        try:
            await super().protocol_send(event)
        except trio.BusyResourceError:
            if not isinstance(event, RawData):
                raise
            await self.protocol.handle(Closed())

    _want_idle = False  # the last Updated said idle

    async def _start_idle_timer(self) -> None:
        if self._want_idle:
            await self.idle_task.restart(self._task_group, self._idle_timeout)

    async def _close(self) -> None:
        # Shielded: a response sent before its request's body has arrived closes the connection
        # from inside the app's task, and quart-trio cancels that task as the stream's disconnect
        # reaches it, mid-close: the socket stayed open, holding the peer and its unread body.
        # Neither step blocks (a shutdown and a close).
        with trio.CancelScope(shield=True):
            await super()._close()


@dataclass
class RestartBudget:
    """At most `limit` restarts within any `window_s` seconds (pure: the caller passes the time)."""

    limit: int = 5
    window_s: float = 60.0
    _times: deque[float] = field(default_factory=deque)

    def allow(self, now: float) -> bool:
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) >= self.limit:
            return False
        self._times.append(now)
        return True

    @property
    def used(self) -> int:
        return len(self._times)


class ListenerFailed(Exception):
    """The accept loop kept failing past its restart budget: the server stops, saying why."""


def _peer(stream: trio.SocketStream) -> tuple[str, int]:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "a gone peer", 0
    return host, port


def too_many_connections(host: str, limit: int) -> bytes:
    """The whole answer to a connection over its peer's limit (sent before anything is read)."""
    body = json.dumps(
        {
            "error": {
                "code": "overloaded",
                "message": f"{host} already has {limit} connections open to drumsd (at most "
                f"{limit}); close some, or reuse them (keep-alive)",
                "detail": {"peer": host, "limit": limit},
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


@dataclass
class HTTPServer:
    """Serves `app` on `sock` (bound; listened here) until `shutdown` is set, then drains within
    the config's graceful_timeout. `connection` is the per-connection class (a seam for tests)."""

    app: Framework
    config: HyperConfig
    sock: socket.socket
    shutdown: trio.Event
    connection: type[Connection] = Connection
    restarts: RestartBudget = field(default_factory=RestartBudget)
    # Open connections per peer host: each holds a descriptor and a task until keep_alive_timeout
    # closes it; a trainer needs about one per env it steps at once.
    max_connections_per_peer: int = 512
    failed_connections: int = 0
    _open: dict[str, int] = field(default_factory=dict)

    async def serve(self, *, task_status: trio.TaskStatus[list[str]]) -> None:
        config = self.config
        config.set_statsd_logger_class(StatsdLogger)
        app = wrap_app(self.app, config.wsgi_max_body_size, None)
        lifespan_state: dict = {}
        lifespan = Lifespan(app, config, lifespan_state)
        context = WorkerContext(None)
        self.sock.listen(config.backlog)
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.sock))
        bind = f"http://{repr_socket_addr(self.sock.family, self.sock.getsockname())}"
        state = ConnectionState(lifespan_state.copy())

        async def serve_one(stream: trio.SocketStream) -> None:
            host, port = _peer(stream)
            peer = f"{host}:{port}"
            if self._open.get(host, 0) >= self.max_connections_per_peer:
                with trio.move_on_after(1):
                    try:
                        await stream.send_all(
                            too_many_connections(host, self.max_connections_per_peer)
                        )
                    except trio.BrokenResourceError:
                        pass
                await stream.aclose()
                return
            self._open[host] = self._open.get(host, 0) + 1
            try:
                await self.connection(app, config, context, state, stream)  # type: ignore[arg-type]
            except* Exception as group:
                # One connection's failure is its own: log it, and the server goes on.
                self.failed_connections += 1
                log.error(
                    "connection from %s failed in the HTTP server and was closed (the server "
                    "goes on; %d such so far): %r",
                    peer,
                    self.failed_connections,
                    group.exceptions[0],
                    exc_info=group,
                )
            finally:
                left = self._open[host] - 1
                if left:
                    self._open[host] = left
                else:
                    del self._open[host]

        async with trio.open_nursery() as lifespan_nursery:
            await lifespan_nursery.start(lifespan.handle_lifespan)
            await lifespan.wait_for_startup()
            async with trio.open_nursery() as connections:
                task_status.started([bind])
                async with trio.open_nursery() as accepting:

                    async def stop_accepting() -> None:
                        await self.shutdown.wait()
                        accepting.cancel_scope.cancel()

                    accepting.start_soon(stop_accepting)
                    await self._accept(listener, connections, serve_one)
                # Draining: idle keep-alive connections close now, busy ones get a deadline.
                await context.terminated.set()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
            await lifespan.wait_for_shutdown()
            lifespan_nursery.cancel_scope.cancel()

    async def _accept(
        self,
        listener: trio.SocketListener,
        connections: trio.Nursery,
        serve_one: Callable[[trio.SocketStream], Awaitable[None]],
    ) -> None:
        while True:
            try:
                while True:
                    try:
                        stream = await listener.accept()
                    except OSError as exc:
                        if exc.errno not in _TRANSIENT_ACCEPT:
                            raise
                        log.warning("accept: %s; accepting again in 0.1 s", exc.strerror)
                        await trio.sleep(0.1)
                        continue
                    connections.start_soon(serve_one, stream)
            except Exception as exc:
                if not self.restarts.allow(trio.current_time()):
                    raise ListenerFailed(
                        f"the HTTP listener failed {self.restarts.limit + 1} times within "
                        f"{self.restarts.window_s:.0f} s, the last with {exc!r}; see the log "
                        "above, fix the cause and start drumsd again"
                    ) from exc
                log.error(
                    "the HTTP listener failed (%r); restarting it (restart %d of at most %d in "
                    "%.0f s)",
                    exc,
                    self.restarts.used,
                    self.restarts.limit,
                    self.restarts.window_s,
                    exc_info=exc,
                )
                await trio.sleep(min(1.0, 0.1 * 2 ** (self.restarts.used - 1)))


def hyper_config(graceful_timeout_s: float) -> HyperConfig:
    """hypercorn's settings as drumsd uses them (its bind and TLS settings are unused here)."""
    hc = HyperConfig()
    hc.graceful_timeout = graceful_timeout_s
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    # No read timeout: a request may wait minutes for its answer (a create, a long step) with
    # nothing to read. Idle connections, headers that never end included, close after
    # keep_alive_timeout; a body's deadline is the app's (api/app.py).
    hc.read_timeout = None
    return hc
