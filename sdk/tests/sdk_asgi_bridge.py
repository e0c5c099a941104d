"""Serve an ASGI app on its own trio event loop in a thread, and hand out httpx transports to it.

The app (the fake, or drumsd's real quart-trio app) runs in the same process through
`httpx.ASGITransport`, but on its own loop, like a separate daemon: so the sync client, and the
async client under asyncio as well as trio, can all talk to a trio-only app. Client deadlines
work as over a socket: a sync read timeout, or a cancelled async call, cancels the request's task.
"""

from __future__ import annotations

import concurrent.futures
from contextlib import contextmanager
from typing import Any, AsyncContextManager, Callable, Iterator, List, Tuple

import anyio
import anyio.abc
import anyio.to_thread
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal

Answer = Tuple[int, List[Tuple[bytes, bytes]], bytes]


class _Served:
    def __init__(self, portal: BlockingPortal, app: Callable[..., Any]) -> None:
        self._portal = portal
        self._asgi = httpx.ASGITransport(app=app)

    async def answer(self, method: str, url: str, headers: Any, body: bytes) -> Answer:
        """Runs on the app's loop."""
        request = httpx.Request(method, url, headers=headers, content=body)
        response = await self._asgi.handle_async_request(request)
        content = await response.aread()
        return response.status_code, response.headers.raw, content

    def submit(self, request: httpx.Request, body: bytes) -> "concurrent.futures.Future[Answer]":
        return self._portal.start_task_soon(
            self.answer, request.method, str(request.url), request.headers.raw, body
        )


class SyncBridge(httpx.BaseTransport):
    def __init__(self, served: _Served) -> None:
        self._served = served

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        future = self._served.submit(request, request.read())
        timeout = (request.extensions.get("timeout") or {}).get("read")
        try:
            status, headers, content = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise httpx.ReadTimeout(f"no answer within {timeout} s", request=request) from None
        return httpx.Response(status, headers=headers, content=content)


class AsyncBridge(httpx.AsyncBaseTransport):
    def __init__(self, served: _Served) -> None:
        self._served = served

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        submitted: List["concurrent.futures.Future[Answer]"] = []

        def wait_for_answer() -> Answer:  # in a worker thread: portals refuse calls from a loop
            submitted.append(self._served.submit(request, body))
            return submitted[0].result()

        try:
            status, headers, content = await anyio.to_thread.run_sync(
                wait_for_answer, abandon_on_cancel=True
            )
        finally:
            for future in submitted:
                future.cancel()  # the client gave up (deadline or cancellation): so does the app
        return httpx.Response(status, headers=headers, content=content)


class ServedApp:
    def __init__(self, served: _Served, app: Any) -> None:
        self._served = served
        self.app = app

    def sync_transport(self) -> httpx.BaseTransport:
        return SyncBridge(self._served)

    def async_transport(self) -> httpx.AsyncBaseTransport:
        return AsyncBridge(self._served)


async def _run_lifespan(
    app: Callable[..., Any], stop: anyio.Event, *, task_status: anyio.abc.TaskStatus[None]
) -> None:
    """ASGI lifespan: startup before the first request, shutdown when `stop` is set."""
    to_app, app_inbox = anyio.create_memory_object_stream[dict](4)
    app_outbox, from_app = anyio.create_memory_object_stream[dict](4)

    async def run_app() -> None:
        try:
            await app(
                {"type": "lifespan", "asgi": {"version": "3.0"}}, app_inbox.receive, app_outbox.send
            )
        finally:
            app_outbox.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_app)
        await to_app.send({"type": "lifespan.startup"})
        message = await from_app.receive()
        if message["type"] != "lifespan.startup.complete":
            raise RuntimeError(f"the app failed to start: {message}")
        task_status.started()
        await stop.wait()
        await to_app.send({"type": "lifespan.shutdown"})
        with anyio.fail_after(10):
            await from_app.receive()


@contextmanager
def serve_in_thread(open_app: Callable[[], AsyncContextManager[Any]]) -> Iterator[ServedApp]:
    """`open_app()` is entered on the app's own trio loop (a real daemon needs its supervisor
    running there), then the app's lifespan runs; both end when the block does."""
    with start_blocking_portal(backend="trio") as portal:
        with portal.wrap_async_context_manager(open_app()) as app:
            stop = portal.call(anyio.Event)
            lifespan, _ = portal.start_task(_run_lifespan, app, stop)
            try:
                yield ServedApp(_Served(portal, app), app)
            finally:
                portal.call(stop.set)
                lifespan.result(timeout=15)
        portal.call(portal.stop, True)  # requests a test abandoned (hangs) end here
