"""Console sessions: the bearer token is exchanged once, at login, for a random session id that
lives only in an HttpOnly cookie; the token itself never reaches a URL, a page or a log."""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

COOKIE = "drums_console"
SESSION_TTL_S = 12 * 3600.0
MAX_SESSIONS = 64  # the oldest is dropped past this: a login loop cannot grow memory


@dataclass(frozen=True)
class Session:
    id: str
    write: bool  # read-only unless the operator asked for actions at login
    expires_at: float


BEARER = Session("bearer", True, float("inf"))


class Sessions:
    def __init__(
        self,
        token: str,
        *,
        ttl_s: float = SESSION_TTL_S,
        limit: int = MAX_SESSIONS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._expected = token.encode()
        self._ttl_s = ttl_s
        self._limit = limit
        self._clock = clock
        self._by_id: dict[str, Session] = {}

    def login(self, given: str, *, write: bool) -> Session | None:
        """A new session when `given` is the daemon's token, else None."""
        if not hmac.compare_digest(given.strip().encode(), self._expected):
            return None
        self._expire()
        while len(self._by_id) >= self._limit:
            oldest = min(self._by_id.values(), key=lambda s: s.expires_at)
            del self._by_id[oldest.id]
        session = Session(secrets.token_urlsafe(32), write, self._clock() + self._ttl_s)
        self._by_id[session.id] = session
        return session

    def bearer(self, authorization: str) -> Session | None:
        """A program with the token (the pool gateway, through its keeper) reads the console's
        data as the API would let it: with `Authorization: Bearer <token>`, never a cookie. No
        CSRF concern: a browser does not attach a bearer header by itself."""
        given = authorization.encode()
        if hmac.compare_digest(given, b"Bearer " + self._expected):
            return BEARER
        return None

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None or session.expires_at <= self._clock():
            self._by_id.pop(session_id, None)
            return None
        return session

    def logout(self, session_id: str | None) -> None:
        if session_id:
            self._by_id.pop(session_id, None)

    def __len__(self) -> int:
        return len(self._by_id)

    def _expire(self) -> None:
        now = self._clock()
        for sid in [s.id for s in self._by_id.values() if s.expires_at <= now]:
            del self._by_id[sid]
