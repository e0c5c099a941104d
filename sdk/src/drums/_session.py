"""Fate-sharing with a gateway: a client's envs live as long as its process does.

Every request names the client's session (`X-Drums-Session`). A drums pool gateway answers
with `X-Drums-Session-TTL`: it destroys a session's envs once it has not heard from the session
for that long. While the client holds envs, a daemon thread of its own renews the session every
third of the TTL, so an idle but living client keeps its desktops and a SIGKILLed one frees them
within the TTL. A drumsd alone sends no TTL, and nothing starts.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional

import httpx

if TYPE_CHECKING:
    from ._base import BaseClient

log = logging.getLogger("drums")

SESSION_HEADER = "X-Drums-Session"
TTL_HEADER = "X-Drums-Session-TTL"
RENEW_PATH = "/v1/sessions/renew"


def ttl_of(headers: "httpx.Headers") -> Optional[float]:
    """The gateway's session TTL from an answer's headers (None: not a gateway, or garbled)."""
    raw = headers.get(TTL_HEADER)
    try:
        ttl = float(raw) if raw is not None else None
    except ValueError:
        return None
    return ttl if ttl is not None and ttl > 0 else None


class SessionBeat:
    """Renews one client's session while the client is open and holds envs."""

    def __init__(self, client: "BaseClient[Any]", session: str, ttl_s: float) -> None:
        self._client = weakref.ref(client)
        self.session = session
        self.interval_s = max(0.2, ttl_s / 3)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="drums-session")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        client = self._client()
        if client is None:
            return
        headers = {SESSION_HEADER: self.session}
        token = client._settings.token
        if token is not None:
            headers["Authorization"] = f"Bearer {token.reveal()}"
        url = client.url
        del client  # the thread must not keep its client alive
        with httpx.Client(base_url=url, headers=headers, timeout=10.0) as http:
            while not self._stop.wait(self.interval_s):
                client = self._client()
                if client is None or client._closed:
                    return
                busy = bool(client._owned_envs)
                del client
                if not busy:
                    continue
                try:
                    http.post(RENEW_PATH)
                except httpx.HTTPError as exc:  # the gateway restarting: try again next beat
                    log.debug("session %s: renew failed: %s", self.session, exc)
