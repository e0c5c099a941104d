"""/console in process (httpx ASGI transport) over the in-memory runtime: the login exchange, the
session cookie's flags, read-only sessions, the grid rows, thumbnails that are skipped when the
screen did not change, and the refusals. The browser test is tests/live/test_console_live.py."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import pytest
import trio
from drumsd.api.console_frames import THUMB_SIZE, Frames, scale_png
from drumsd.api.console_sessions import COOKIE, Sessions
from drumsd.runtime.memory_runtime import png
from drumsd.runtime.services import history as history_service
from harness import TOKEN, Api, create, open_api, wait_valid
from PIL import Image


def console_client(api: Api) -> httpx.AsyncClient:
    """The same app without the bearer header: only the cookie may let it in."""
    return httpx.AsyncClient(transport=api.client._transport, base_url="http://drumsd")


async def login(client: httpx.AsyncClient, token: str = TOKEN, actions: bool = False):
    data = {"token": token, **({"actions": "on"} if actions else {})}
    return await client.post("/console/login", data=data)


@pytest.fixture
async def api(tmp_path: Path):
    async with open_api(tmp_path) as a:
        yield a


async def test_login_sets_a_strict_httponly_cookie_and_never_echoes_the_token(api: Api) -> None:
    async with console_client(api) as c:
        page = await c.get("/console/login")
        assert page.status_code == 200 and 'name="token"' in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        r = await login(c)
        assert r.status_code == 303 and r.headers["location"] == "/console"
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}=") and TOKEN not in cookie
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
        home = await c.get("/console")
        assert home.status_code == 200 and "console.js" in home.text and TOKEN not in home.text
        assert (await c.get("/console/api/session")).json()["write"] is False


async def test_wrong_token_and_no_cookie_are_refused(api: Api) -> None:
    async with console_client(api) as c:
        r = await login(c, token="x" * 40)
        assert r.status_code == 401 and "not this daemon's token" in r.text
        assert "set-cookie" not in r.headers
        assert (await c.get("/console")).status_code == 303
        for path in ("/console/api/slots", "/console/api/host", "/console/api/slots/x/thumbnail"):
            r = await c.get(path)
            assert r.status_code == 401, path
            assert r.json()["error"]["code"] == "unauthorized"
        c.cookies.set(COOKIE, "forged", domain="drumsd", path="/console")
        assert (await c.get("/console/api/slots")).status_code == 401
        # A wrong bearer token does not open it; the right one does (the pool gateway's way in).
        r = await c.get("/console/api/slots", headers={"Authorization": f"Bearer {'y' * 40}"})
        assert r.status_code == 401
        r = await c.get("/console/api/slots", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200 and "set-cookie" not in r.headers


async def test_grid_rows_show_gates_verdict_and_last_verify(api: Api) -> None:
    good = (await create(api))["id"]
    bad = (await create(api))["id"]
    await wait_valid(api, good)
    await wait_valid(api, bad)
    await api.client.post(f"/v1/slots/{good}/verify")
    api.runtime.inject(bad, oom_kills=1)
    assert "no_oom_kill" in (await api.client.get(f"/v1/slots/{bad}/gates")).json()["failed"]
    async with console_client(api) as c:
        await login(c)
        body = (await c.get("/console/api/slots")).json()
        rows = {r["id"]: r for r in body["slots"]}
        assert rows[good]["verdict"] == "valid" and rows[good]["state"] == "ready"
        assert rows[good]["verify"]["verdict"] == "valid"
        assert set(rows[good]["gates"].values()) == {"pass"}
        assert rows[bad]["state"] == "quarantined" and rows[bad]["verdict"] == "quarantined"
        assert rows[bad]["gates"]["no_oom_kill"] == "fail"
        assert "quarantined" in body["facets"]["verdict"]
        assert (await c.get(f"/console/api/slots/{bad}/frame")).status_code == 200
        detail = (await c.get(f"/console/api/slots/{bad}")).json()
        gate = {g["name"]: g for g in detail["gates"]["gates"]}["no_oom_kill"]
        assert gate["status"] == "fail" and gate["evidence"]
        assert "screenshot" not in detail["latencies"]  # looking is not counted as a screenshot
        timeline = (await c.get(f"/console/api/slots/{bad}/timeline")).json()["events"]
        events = [e["event"] for e in timeline]
        assert events[0] == "created" and "ready" in events, events
        assert timeline[-1]["state"] == "quarantined", timeline[-1]
        host = (await c.get("/console/api/host")).json()
        assert host["health"]["slots_by_state"]["quarantined"] == 1
        assert "latencies" in host["metrics"]


async def test_console_does_not_renew_leases(api: Api) -> None:
    sid = (await create(api, idle_timeout_s=300))["id"]
    await wait_valid(api, sid)
    before = api.sup.slots[sid].last_used_at
    async with console_client(api) as c:
        await login(c)
        assert (await c.get(f"/console/api/slots/{sid}/thumbnail")).status_code == 200
        assert (await c.get(f"/console/api/slots/{sid}")).status_code == 200
    assert api.sup.slots[sid].last_used_at == before


async def test_thumbnail_is_scaled_and_revalidates_with_etag(api: Api) -> None:
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    async with console_client(api) as c:
        await login(c)
        r = await c.get(f"/console/api/slots/{sid}/thumbnail")
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        etag = r.headers["etag"]
        again = await c.get(f"/console/api/slots/{sid}/thumbnail", headers={"If-None-Match": etag})
        assert again.status_code == 304 and again.content == b""
        frame = await c.get(f"/console/api/slots/{sid}/frame")
        assert frame.content == (await api.client.get(f"/v1/slots/{sid}/screenshot")).content
        assert (await c.get("/console/api/slots/nope/thumbnail")).status_code == 404


async def test_actions_need_a_write_session_and_the_header(api: Api) -> None:
    sid = (await create(api))["id"]
    async with console_client(api) as ro:
        await login(ro)
        r = await ro.post(f"/console/api/slots/{sid}/destroy", headers={"X-Drums-Console": "1"})
        assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
    async with console_client(api) as rw:
        await login(rw, actions=True)
        r = await rw.post(f"/console/api/slots/{sid}/destroy")
        assert r.status_code == 403 and "X-Drums-Console" in r.json()["error"]["message"]
        assert api.sup.slots[sid].status.value != "destroyed"
        r = await rw.post(f"/console/api/slots/{sid}/destroy", headers={"X-Drums-Console": "1"})
        assert r.status_code == 200 and r.json()["destroyed"] is True
        assert api.sup.slots[sid].status.value == "destroyed"
        r = await rw.post("/console/logout")
        assert r.status_code == 303
        assert (await rw.get("/console/api/slots")).status_code == 401


async def test_failure_records_list_open_and_download(api: Api) -> None:
    bad = (await create(api))["id"]
    good = (await create(api))["id"]
    await wait_valid(api, bad)
    await wait_valid(api, good)
    async with console_client(api) as c:
        await login(c, actions=True)
        shown = (await c.get(f"/console/api/slots/{bad}/frame")).content  # its last screen
        api.runtime.inject(bad, oom_kills=1)
        assert "no_oom_kill" in (await api.client.get(f"/v1/slots/{bad}/gates")).json()["failed"]
        for sid in (bad, good):
            assert (await api.client.delete(f"/v1/slots/{sid}")).status_code == 200
        rows = (await c.get("/console/api/records")).json()["records"]
        by_slot = {r["slot"]: r for r in rows}
        assert by_slot[bad]["kind"] == "full" and by_slot[good]["kind"] == "summary"
        name = by_slot[bad]["name"]
        body = (await c.get(f"/console/api/records/{name}")).json()
        assert body["record"]["quarantine_reason"].startswith("gate no_oom_kill failed")
        gates = {g["name"]: g["status"] for g in body["gates"]["gates"]}
        assert gates["no_oom_kill"] == "fail" and body["screenshot"] is True
        shot = await c.get(f"/console/api/records/{name}/screenshot")
        assert shot.headers["content-type"] == "image/png" and shot.content == shown
        dl = await c.get(f"/console/api/records/{name}/download")
        assert dl.content == (api.config.forgotten_dir / "full" / name).read_bytes()
        assert "attachment" in dl.headers["content-disposition"]
        summary = (await c.get(f"/console/api/records/{by_slot[good]['name']}")).json()
        assert summary["kind"] == "summary" and summary["record"]["id"] == good
        for wrong in ("nope.json", "..%2F..%2Fetc%2Fpasswd", "20260101T000000-x.tar.zst"):
            assert (await c.get(f"/console/api/records/{wrong}")).status_code == 404, wrong
    async with console_client(api) as anonymous:
        assert (await anonymous.get("/console/api/records")).status_code == 401
        assert (await anonymous.get(f"/console/api/records/{name}/download")).status_code == 401


async def test_static_assets_only_by_name(api: Api) -> None:
    async with console_client(api) as c:
        assert (await c.get("/console/static/console.js")).status_code == 200
        assert (await c.get("/console/static/..%2Fconsole.py")).status_code == 404
        assert (await c.get("/console/static/login.html")).status_code == 404


def test_sessions_expire_and_are_bounded() -> None:
    now = [0.0]
    sessions = Sessions(TOKEN, ttl_s=10, limit=3, clock=lambda: now[0])
    assert sessions.login("wrong", write=True) is None
    first = sessions.login(TOKEN, write=False)
    assert first is not None and sessions.get(first.id) == first
    for _ in range(5):
        sessions.login(TOKEN, write=False)
    assert len(sessions) == 3 and sessions.get(first.id) is None
    latest = sessions.login(TOKEN, write=True)
    now[0] = 11
    assert latest is not None and sessions.get(latest.id) is None


def test_scale_png_fits_the_thumbnail_box() -> None:
    with Image.open(io.BytesIO(scale_png(png(1280, 800, (10, 200, 30))))) as im:
        assert im.size == THUMB_SIZE
        assert im.getpixel((5, 5)) == (10, 200, 30)


async def test_frames_grab_once_per_interval_and_scale_only_changed_screens() -> None:
    screens = [png(640, 400, (0, 0, 0))]
    now = [0.0]

    async def grab(_: str) -> bytes:
        return screens[-1]

    frames = Frames(grab, clock=lambda: now[0])
    a = await frames.thumbnail("s")
    await frames.thumbnail("s")
    assert frames.grabs == 1 and frames.scaled == 1
    now[0] = 5.0  # stale: grabbed again, same bytes, not scaled again
    b = await frames.thumbnail("s")
    assert frames.grabs == 2 and frames.scaled == 1 and a == b
    screens.append(png(640, 400, (255, 0, 0)))
    now[0] = 10.0
    c = await frames.thumbnail("s")
    assert frames.scaled == 2 and c is not None and a is not None and c.etag != a.etag
    frames.forget_except(set())
    await trio.lowlevel.checkpoint()


async def test_rescaling_changed_screens_keeps_to_its_cpu_budget() -> None:
    colour = [0]
    now = [0.0]

    async def grab(_: str) -> bytes:
        return png(8, 8, (colour[0], 0, 0))

    def scale(source: bytes) -> tuple[bytes, float]:
        return b"thumb-of-" + source[-16:], 0.05  # 50 ms of CPU per thumbnail

    frames = Frames(grab, clock=lambda: now[0], scale=scale, rescale_budget=0.05)
    first = {sid: await frames.thumbnail(sid) for sid in ("a", "b")}  # first ones: always made
    assert frames.scaled == 2
    colour[0] = 1
    now[0] = 2.0
    changed_a = await frames.thumbnail("a")  # a re-scale: the next one waits 1 s (50 ms / 5 %)
    assert changed_a != first["a"] and frames.scaled == 3
    still_b = await frames.thumbnail("b")  # changed too, but the budget is spent: the older one
    assert still_b == first["b"] and frames.scaled == 3
    now[0] = 3.5
    assert await frames.thumbnail("b") != first["b"] and frames.scaled == 4


async def test_episode_timeline_has_each_step_and_gate_changes(api: Api) -> None:
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    c0 = api.client
    assert (
        await c0.post(f"/v1/slots/{sid}/step", json={"action": "pyautogui.click(1, 2)"})
    ).is_success
    r = await c0.post(
        f"/v1/slots/{sid}/step",
        json={"action": {"type": "execute", "command": "echo hi"}},
    )
    assert r.is_success, r.text
    # A refused step is kept too, with its error code.
    bad = await c0.post(f"/v1/slots/{sid}/step", json={"action": {"type": "click", "x": 1}})
    assert bad.status_code == 422
    api.runtime.inject(sid, oom_kills=1)
    assert "no_oom_kill" in (await c0.get(f"/v1/slots/{sid}/gates")).json()["failed"]
    async with console_client(api) as c:
        await login(c)
        body = (await c.get(f"/console/api/slots/{sid}/episode")).json()
    entries = body["entries"]
    steps = [e for e in entries if e["kind"] == "step"]
    assert [(s["index"], s["action"], s["error"]) for s in steps] == [
        (1, "pyautogui", None),
        (2, "execute", None),
        (2, "click", "invalid_request"),  # refused: it did not count as an action
    ]
    assert steps[0]["detail"] == "pyautogui.click(1, 2)"
    assert steps[1]["detail"] == "echo hi" and steps[1]["returncode"] == 0
    assert all(s["elapsed_s"] >= 0 and s["offset_s"] is not None for s in steps)
    assert steps[2]["detail"] == "x=1"
    gates = {(e["gate"], e["status"]): e for e in entries if e["kind"] == "gate"}
    crash = gates[("no_oom_kill", "fail")]
    assert crash["after_step"] == 2 and crash["evidence"]
    assert ("no_oom_kill", "pass") in gates  # it passed before it failed
    events = [e["event"] for e in entries if e["kind"] == "event"]
    assert "quarantined" in events
    assert [e["ts"] for e in entries] == sorted(e["ts"] for e in entries)
    assert body["actions"] == 2 and body["steps_kept"] == 3
    # A reset starts a new episode: its timeline has none of the old steps.
    assert (await c0.post(f"/v1/slots/{sid}/release")).is_success
    assert (await c0.post(f"/v1/slots/{sid}/reset")).is_success
    async with console_client(api) as c:
        await login(c)
        body = (await c.get(f"/console/api/slots/{sid}/episode")).json()
    assert not [e for e in body["entries"] if e["kind"] == "step"]


async def test_history_samples_the_host_for_the_charts(api: Api) -> None:
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    api.sup.console.history.samples.clear()
    await history_service.sample_once(api.sup)
    async with console_client(api) as c:
        await login(c)
        body = (await c.get("/console/api/history")).json()
        assert body["every_s"] > 0 and body["samples"], body
        last = body["samples"][-1]
        assert last["slots"] == 1 and last["ready"] == 1
        assert set(last) >= {"restores_per_s", "steps_per_s", "mem_available_mib"}
        newer = (await c.get("/console/api/history", params={"since": last["ts"]})).json()
        assert newer["samples"] == []
        bad = await c.get("/console/api/history", params={"since": "soon"})
        assert bad.status_code == 422 and "since" in bad.json()["error"]["message"]
