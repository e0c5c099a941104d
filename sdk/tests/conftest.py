"""Fixtures: the daemon app served in-process, and SDK clients talking to it.

Every test that takes `daemon` runs twice: against the SDK's fake app and against drumsd's real
app (its API and supervisor over the in-memory runtime, `sdk_harness.open_drumsd_app`). Faults
(429s, 5xx codes, hangs) are injected by a wrapper around whichever app is served.
"""

from __future__ import annotations

import os
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncContextManager, AsyncIterator, Callable, Iterator

import pytest

import drums

sys.path.insert(0, str(Path(__file__).parent))

from fake_app import FaultInjector, open_fake_app
from sdk_asgi_bridge import serve_in_thread
from sdk_harness import BACKENDS, TOKEN, Daemon, open_drumsd_app

APPS = {
    "fake": lambda tmp_path: open_fake_app(TOKEN),  # the SDK's own stand-in (fake_app.py)
    "drumsd": lambda tmp_path: open_drumsd_app(tmp_path, TOKEN),  # the real API + supervisor
}
# Both by default; DRUMS_SDK_TEST_APP=fake or =drumsd runs one.
CHOSEN = [os.environ["DRUMS_SDK_TEST_APP"]] if os.environ.get("DRUMS_SDK_TEST_APP") else list(APPS)


@pytest.fixture(params=CHOSEN)
def daemon(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Daemon]:
    """The app under test, opened on its own trio loop, behind a fault injector."""
    if request.param == "drumsd":
        pytest.importorskip("drumsd.api.app")
    open_app: Callable[[Path], AsyncContextManager[Any]] = APPS[request.param]
    faults = FaultInjector(None)

    @asynccontextmanager
    async def open_wrapped_app() -> AsyncIterator[FaultInjector]:
        async with open_app(tmp_path) as app:
            faults.app = app
            yield faults

    with serve_in_thread(open_wrapped_app) as served:
        yield Daemon(served, faults, faults.app)


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
