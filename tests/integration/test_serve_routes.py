"""Every route over HTTP against `drumsd serve` (in-memory runtime), and 401 without a token."""

from __future__ import annotations

import base64
import json
import time

import httpx
from drums.vocabulary import GATES
from drumsd.api.routes import ROUTES
from drumsd_process import Daemon


def ok(r: httpx.Response, status: int = 200) -> dict:
    assert r.status_code == status, r.text
    return r.json()


def wait_valid(c: httpx.Client, slot_id: str) -> dict:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        report = ok(c.get(f"/v1/slots/{slot_id}/gates"))
        if report["valid"] is not None:
            return report
        time.sleep(0.02)
    raise AssertionError(f"gates of {slot_id} still pending")


def test_every_route_over_http(daemon: Daemon) -> None:
    seen: set[tuple[str, str]] = set()

    def call(c: httpx.Client, method: str, route: str, path: str, status: int = 200, **kw):
        seen.add((method, route))
        r = c.request(method, path, **kw)
        assert r.status_code == status, (method, path, r.text)
        return r

    with daemon.client() as c:
        assert call(c, "GET", "/healthz", "/healthz", headers={"Authorization": ""}).json()["ok"]
        health = call(c, "GET", "/v1/health", "/v1/health").json()
        assert health["version"] and health["admission"]["enabled"] is True
        slot = call(c, "POST", "/v1/slots", "/v1/slots", 201, json={"labels": {"k": "v"}}).json()
        sid = slot["id"]
        S = "/v1/slots/{slot_id}"
        p = f"/v1/slots/{sid}"
        assert call(c, "GET", S, p).json()["state"] == "ready"
        assert [s["id"] for s in call(c, "GET", "/v1/slots", "/v1/slots").json()["slots"]] == [sid]
        report = wait_valid(c, sid)
        seen.add(("GET", S + "/gates"))
        assert report["valid"] is True and len(report["gates"]) == len(GATES)
        step = call(
            c,
            "POST",
            S + "/step",
            p + "/step",
            json={"action": {"type": "hotkey", "keys": ["ctrl", "s"]}, "screenshot": True},
        ).json()
        assert step["actions"] == 1
        assert base64.b64decode(step["screenshot_png_b64"])[:4] == b"\x89PNG"
        png = call(c, "GET", S + "/screenshot", p + "/screenshot")
        assert png.headers["content-type"] == "image/png"
        term = call(c, "GET", S + "/terminal", p + "/terminal").json()
        assert term["slot"] == sid and term["text"] is None and term["reason"]  # no xterm here
        tree = call(c, "GET", S + "/accessibility", p + "/accessibility").json()
        assert tree["slot"] == sid and tree["tree"] is None and tree["reason"]  # no AT-SPI here
        saved = call(c, "POST", S + "/capture", p + "/capture", 201, json={}).json()
        pf = call(c, "POST", S + "/prefork", p + "/prefork").json()
        assert pf["kind"] == "prefork"
        children = call(
            c, "POST", S + "/fork", p + "/fork", 201, json={"n": 2, "prefork": pf["id"]}
        ).json()["children"]
        assert len(children) == 2 and {ch["checkpoint"] for ch in children} == {pf["id"]}
        # /branch, the fork's old path, still forks (clients written against it keep working).
        old = call(c, "POST", S + "/branch", p + "/branch", 201, json={"n": 1, "prefork": pf["id"]})
        assert [ch["parent"] for ch in old.json()["children"]] == [sid]
        assert call(c, "POST", S + "/quiescent", p + "/quiescent").json()["quiescent"] is True
        err = call(c, "POST", S + "/task", p + "/task", 422, json={"task": "e0df059f"}).json()
        assert err["error"]["code"] == "unsupported_task"
        verdict = call(c, "POST", S + "/verify", p + "/verify", json={}).json()
        assert verdict["valid"] is True and verdict["checker_error"] == "no task loaded"
        assert call(c, "GET", S + "/metrics", p + "/metrics").json()["actions"] == 1
        q = call(c, "POST", S + "/quarantine", p + "/quarantine", json={"reason": "x"}).json()
        assert q["state"] == "quarantined"
        assert call(c, "POST", S + "/release", p + "/release").json()["state"] == "ready"
        assert call(c, "POST", S + "/reset", p + "/reset").json()["episode"] == 2

        cps = call(c, "GET", "/v1/checkpoints", "/v1/checkpoints").json()["checkpoints"]
        assert {cp["kind"] for cp in cps} == {"template", "saved", "prefork"}
        C = "/v1/checkpoints/{checkpoint_id}"
        assert call(c, "GET", C, f"/v1/checkpoints/{saved['id']}").json()["id"] == saved["id"]
        outside = daemon.dir / "outside-cp"
        outside.mkdir()
        (outside / "meta.json").write_text(
            json.dumps({"image_sha256": "ab" * 32, "profile": "hardened"})
        )
        adopted = call(
            c,
            "POST",
            "/v1/checkpoints",
            "/v1/checkpoints",
            201,
            json={"path": str(outside), "kind": "saved"},
        ).json()
        call(c, "DELETE", C, f"/v1/checkpoints/{adopted['id']}")
        call(c, "DELETE", C, f"/v1/checkpoints/{saved['id']}")
        call(c, "GET", C, f"/v1/checkpoints/{saved['id']}", 404)

        assert call(c, "GET", "/v1/tasks", "/v1/tasks").json() == {"tasks": []}
        call(c, "GET", "/v1/tasks/{task_id}", "/v1/tasks/nope", 404)

        assert call(c, "DELETE", S, p).json()["already"] is False
        assert call(c, "DELETE", S, p).json()["already"] is True
        assert c.post(p + "/step", json={"action": "x"}).json()["error"]["code"] == "env_gone"

        m = call(c, "GET", "/v1/metrics", "/v1/metrics").json()
        assert m["latencies"]["create"]["count"] == 1 and m["latencies"]["fork"]["count"] == 2
        prom = call(c, "GET", "/metrics", "/metrics")
        assert prom.headers["content-type"].startswith("text/plain")
        assert "# TYPE drums_operation_seconds histogram" in prom.text
        call(c, "POST", "/v1/metrics/reset", "/v1/metrics/reset")
        doc = call(c, "GET", "/openapi.json", "/openapi.json").json()
        assert doc["paths"][S + "/branch"]["post"]["deprecated"] is True
        assert "deprecated" not in doc["paths"][S + "/fork"]["post"]

    table = {(r.method, r.path) for r in ROUTES} | {("GET", "/openapi.json")}
    assert table - seen == set(), "routes not exercised over HTTP"
    documented = {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops}
    assert documented == table


def test_401_on_every_authenticated_route_without_a_token(daemon: Daemon) -> None:
    routes = [(r.method, r.path) for r in ROUTES if r.auth] + [("GET", "/openapi.json")]
    with httpx.Client(base_url=daemon.url, timeout=10) as c:
        for method, path in routes:
            concrete = path.replace("{slot_id}", "s-1").replace("{checkpoint_id}", "c-1")
            concrete = concrete.replace("{task_id}", "t-1")
            for headers in ({}, {"Authorization": "Bearer wrong-token-" + "x" * 30}):
                r = c.request(method, concrete, headers=headers, json={})
                assert r.status_code == 401, (method, concrete, r.text)
                assert r.json()["error"]["code"] == "unauthorized"
