"""What the SDK tests share: the token and URL of the served app, and the `Daemon` handle.

Imported by module name (not `from conftest import`), so it cannot be confused with another
package's conftest when every test of the repository runs in one pytest session.
"""

from __future__ import annotations

from typing import Any

from fake_app import FaultInjector
from sdk_asgi_bridge import ServedApp

import drums

TOKEN = "test-token-0123456789abcdef0123456789abcdef"
URL = "http://drumsd.test"
# Retries without real waiting, so the tests of backoff stay fast.
FAST_RETRY = drums.RetryPolicy(max_retries=3, base_s=0.0, max_s=0.01)
BACKENDS = ["asyncio", "trio"]


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
