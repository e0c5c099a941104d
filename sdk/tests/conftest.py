"""Fixtures: the daemon app served in-process, and SDK clients talking to it.

`make_app` is the one line to change to run every SDK test against drumsd's real app. Faults
(429s, 5xx codes, hangs) are injected by a wrapper around whichever app is served.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

import drums

sys.path.insert(0, str(Path(__file__).parent))

from asgi_bridge import ServedApp, serve_in_thread
from fake_app import FakeDaemon, FaultInjector

TOKEN = "test-token-0123456789abcdef0123456789abcdef"
URL = "http://drumsd.test"
# Retries without real waiting, so the tests of backoff stay fast.
FAST_RETRY = drums.RetryPolicy(max_retries=3, base_s=0.0, max_s=0.01)
BACKENDS = ["asyncio", "trio"]


def make_app(token: str) -> Any:
    """The app under test. For the real daemon: `return drumsd.api.app.create_app(...)`."""
    return FakeDaemon(token=token)


class Daemon:
    """The served app, its fault injector, and client factories pointed at it."""

    def __init__(self, served: ServedApp, faults: FaultInjector, app: Any) -> None:
        self.served = served
        self.faults = faults
        self.app = app

    def client(self, **kwargs: Any) -> drums.Client:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("retry", FAST_RETRY)
        return drums.connect(URL, transport=self.served.sync_transport(), **kwargs)

    def aclient(self, **kwargs: Any) -> drums.AsyncClient:
        kwargs.setdefault("token", TOKEN)
        kwargs.setdefault("retry", FAST_RETRY)
        return drums.aconnect(URL, transport=self.served.async_transport(), **kwargs)

    def leftovers(self) -> tuple[list[str], list[str]]:
        """Live envs and non-template states on the daemon, asked through the API itself."""
        with self.client() as c:
            envs = [s.id for s in c.list_envs()]
            states = [
                s.id for s in c.list_states() if s.kind != drums.models.CheckpointKind.template
            ]
        return envs, states


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    app = make_app(TOKEN)
    faults = FaultInjector(app)
    with serve_in_thread(faults) as served:
        yield Daemon(served, faults, app)


@pytest.fixture
def client(daemon: Daemon) -> Iterator[drums.Client]:
    with daemon.client() as c:
        yield c


@pytest.fixture(params=BACKENDS)
def run_async(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """`run_async(fn, *args)` runs `await fn(*args)` under asyncio, then (second param) trio."""
    import anyio

    def run(fn: Callable[..., Any], *args: Any) -> Any:
        return anyio.run(fn, *args, backend=request.param)

    return run
