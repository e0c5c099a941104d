"""The SDK's side of fate-sharing with a pool gateway: every request names the client's session,
and a gateway's session TTL starts one renewing thread per client (a drumsd sends none)."""

from __future__ import annotations

import httpx

from drums import Client
from drums._session import SESSION_HEADER, TTL_HEADER, ttl_of


def serving(ttl: str | None, seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        headers = {TTL_HEADER: ttl} if ttl is not None else {}
        return httpx.Response(200, json={"ok": True}, headers=headers)

    return httpx.MockTransport(handle)


def test_every_request_names_the_clients_session_and_a_drumsd_starts_no_beat() -> None:
    seen: list[httpx.Request] = []
    with Client("http://drumsd.test", "t" * 40, transport=serving(None, seen)) as client:
        client.ping()
        client.ping()
        assert client._beat is None
    sessions = {r.headers[SESSION_HEADER] for r in seen}
    assert len(sessions) == 1 and len(sessions.pop()) == 16
    with Client("http://drumsd.test", "t" * 40, transport=serving(None, seen)) as other:
        other.ping()
    assert len({r.headers[SESSION_HEADER] for r in seen}) == 2  # one session per client


def test_a_gateways_ttl_starts_one_beat_at_a_third_of_it() -> None:
    seen: list[httpx.Request] = []
    with Client("http://gateway.test", "t" * 40, transport=serving("9", seen)) as client:
        client.ping()
        beat = client._beat
        assert beat is not None and beat.interval_s == 3.0
        assert beat.session == seen[0].headers[SESSION_HEADER]
        client.ping()
        assert client._beat is beat


def test_a_garbled_or_absent_ttl_is_no_gateway() -> None:
    assert ttl_of(httpx.Headers({TTL_HEADER: "10"})) == 10.0
    for raw in ("", "soon", "0", "-3"):
        assert ttl_of(httpx.Headers({TTL_HEADER: raw})) is None
    assert ttl_of(httpx.Headers()) is None
