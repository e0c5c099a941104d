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

from fake_app import FakeDaemon, FaultInjector
from sdk_asgi_bridge import serve_in_thread
from sdk_harness import BACKENDS, TOKEN, Daemon


def make_app(token: str) -> Any:
    """The app under test. For the real daemon: `return drumsd.api.app.create_app(...)`."""
    return FakeDaemon(token=token)


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
