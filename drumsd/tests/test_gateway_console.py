"""The pool gateway's /console (sdk drums/ray/_gateway_console.py) over two real in-process
drumsd (in-memory runtime): the forward is what the keeper does (the host's bearer token, its
loopback API), without Ray. Log in with the gateway's token, one grid over both hosts with
host-tagged ids, a thumbnail routed to its host, merged host panel and history, actions only in
a write session with the header, and refusals. The Ray path is tests/live/test_pool_ray.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from drums.ray._gateway import Gateway
from drums.ray._gateway_console import merge_history, split_host
from harness import create, open_api, wait_valid

GATEWAY_TOKEN = "g" * 40


@pytest.fixture
async def pool(tmp_path: Path):
    (tmp_path / "h1").mkdir()
    (tmp_path / "h2").mkdir()
    async with open_api(tmp_path / "h1") as h1, open_api(tmp_path / "h2") as h2:
        apis = {"h1": h1, "h2": h2}

        async def forward(label, method, path, query, body):
            r = await apis[label].client.request(
                method, path + (f"?{query}" if query else ""), content=body or None
            )
            return r.status_code, r.headers.get("content-type", "application/json"), r.content

        async def hosts():
            return [("h1", 4), ("h2", 4)]

        gw = Gateway(GATEWAY_TOKEN, forward, hosts)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gw), base_url="http://gateway"
        ) as browser:
            yield apis, browser


async def _login(browser: httpx.AsyncClient, token: str = GATEWAY_TOKEN, actions: bool = True):
    data = {"token": token, **({"actions": "on"} if actions else {})}
    return await browser.post("/console/login", data=data)


async def test_one_console_over_every_host(pool) -> None:
    apis, browser = pool
    ids = {}
    for label, api in apis.items():
        ids[label] = (await create(api))["id"]
        await wait_valid(api, ids[label])
    assert (await browser.get("/console/api/slots")).status_code == 401
    r = await browser.get("/console")
    assert r.status_code == 303 and r.headers["location"] == "/console/login"
    assert 'name="token"' in (await browser.get("/console/login")).text
    refused = await _login(browser, token="x" * 40)
    assert refused.status_code == 401 and "set-cookie" not in refused.headers
    r = await _login(browser)
    cookie = r.headers["set-cookie"]
    assert r.status_code == 303 and "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert GATEWAY_TOKEN not in cookie
    page = await browser.get("/console")
    assert page.status_code == 200 and "drums pool console" in page.text
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert (await browser.get("/console/static/console.js")).status_code == 200

    body = (await browser.get("/console/api/slots")).json()
    rows = {r["id"]: r for r in body["slots"]}
    assert set(rows) == {f"h1~{ids['h1']}", f"h2~{ids['h2']}"}
    assert rows[f"h2~{ids['h2']}"]["host"] == "h2" and body["facets"]["host"] == ["h1", "h2"]
    # A thumbnail and a slot page routed to the slot's host.
    thumb = await browser.get(f"/console/api/slots/h2~{ids['h2']}/thumbnail")
    assert thumb.status_code == 200 and thumb.content.startswith(b"\x89PNG")
    own = await apis["h2"].client.get(f"/console/api/slots/{ids['h2']}/thumbnail")
    assert thumb.content == own.content
    slot = (await browser.get(f"/console/api/slots/h1~{ids['h1']}")).json()
    assert slot["slot"]["id"] == f"h1~{ids['h1']}" and slot["gates"]["gates"]
    host = (await browser.get("/console/api/host")).json()
    assert host["health"]["slots_by_state"]["ready"] == 2
    assert set(host["health"]["pools"]["hosts"]) == {"h1", "h2"}
    assert "latencies" in host["metrics"]
    history = (await browser.get("/console/api/history")).json()
    assert history["hosts"] == ["h1", "h2"] and history["samples"]
    last = history["samples"][-1]["ts"]
    newer = (await browser.get("/console/api/history", params={"since": last})).json()
    assert all(s["ts"] > last for s in newer["samples"])
    assert (await browser.get("/console/api/history?since=soon")).status_code == 422

    # Actions: the header is needed, then the host does it.
    target = f"/console/api/slots/h1~{ids['h1']}/quarantine"
    assert (await browser.post(target)).status_code == 403
    r = await browser.post(target, headers={"X-Drums-Console": "1"})
    assert r.status_code == 200 and r.json()["state"] == "quarantined", r.text
    assert (await apis["h1"].client.get(f"/v1/slots/{ids['h1']}")).json()["state"] == "quarantined"
    r = await browser.post(
        f"/console/api/slots/h2~{ids['h2']}/release", headers={"X-Drums-Console": "1"}
    )
    assert r.status_code == 409 and "not quarantined" in r.json()["error"]["message"]
    # A slot id without its host, or a host not in the pool: refused by name.
    r = await browser.get(f"/console/api/slots/{ids['h1']}")
    assert r.status_code == 404 and "h1~id" in r.json()["error"]["message"]
    assert (await browser.get(f"/console/api/slots/h9~{ids['h1']}")).status_code == 404

    # A read-only session cannot act; logging out ends the session.
    browser.cookies.clear()
    await _login(browser, actions=False)
    r = await browser.post(target, headers={"X-Drums-Console": "1"})
    assert r.status_code == 403 and "read-only" in r.json()["error"]["message"]
    await browser.post("/console/logout")
    browser.cookies.clear()
    assert (await browser.get("/console/api/slots")).status_code == 401


async def test_records_from_every_host_open_on_their_host(pool) -> None:
    apis, browser = pool
    sid = (await create(apis["h2"]))["id"]
    await wait_valid(apis["h2"], sid)
    apis["h2"].runtime.inject(sid, oom_kills=1)
    await apis["h2"].client.get(f"/v1/slots/{sid}/gates")
    assert (await apis["h2"].client.delete(f"/v1/slots/{sid}")).status_code == 200
    await _login(browser)
    rows = (await browser.get("/console/api/records")).json()["records"]
    mine = [r for r in rows if r["slot"] == sid]
    assert mine and mine[0]["host"] == "h2" and mine[0]["name"].startswith("h2~")
    record = (await browser.get(f"/console/api/records/{mine[0]['name']}")).json()
    assert record["record"]["quarantine_reason"].startswith("gate no_oom_kill failed")
    download = await browser.get(f"/console/api/records/{mine[0]['name']}/download")
    assert download.status_code == 200 and "attachment" in download.headers["content-disposition"]


def test_history_sums_hosts_per_interval_and_names_are_split_by_host() -> None:
    merged = merge_history(
        {
            "h1": {"every_s": 5, "samples": [{"ts": 100.5, "slots": 2, "restores_per_s": None}]},
            "h2": {"every_s": 5, "samples": [{"ts": 102.0, "slots": 3, "restores_per_s": 0.5}]},
        }
    )
    (only,) = merged["samples"]
    assert only["slots"] == 5 and only["restores_per_s"] == 0.5 and only["hosts"] == 2
    assert merge_history({"h1": {"every_s": 5, "samples": [{"ts": 100.5}]}}, 100.0)["samples"] == []
    assert split_host("h1~s-1/thumbnail", ["h1"]) == ("h1", "s-1/thumbnail")
    assert split_host("s-1", ["h1"]) == (None, "s-1")
