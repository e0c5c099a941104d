"""The API in process (httpx ASGI transport) over a supervisor with the in-memory runtime."""

from __future__ import annotations

import base64
import io
import json
import tarfile
import time
from functools import partial
from pathlib import Path

import trio
import zstandard
from drumsd.api.routes import ROUTES
from drumsd.core.admission import HostSample
from drumsd.linux.journal_io import Journal
from drumsd.runtime.memory_runtime import MemoryRuntime
from harness import SHA, TOKEN, Api, create, error_of, open_api, virtual_clock, wait_for, wait_valid
from trio.testing import MockClock


async def test_every_route_answers(api: Api) -> None:
    c = api.client
    assert (await c.get("/healthz", headers={"Authorization": ""})).json() == {"ok": True}
    health = (await c.get("/v1/health")).json()
    assert health["checkpoints"][0]["kind"] == "template"
    slot = await create(api, labels={"run": "t1"}, idle_timeout_s=600)
    sid = slot["id"]
    assert slot["state"] == "ready" and slot["episode"] == 1 and slot["labels"] == {"run": "t1"}
    report = await wait_valid(api, sid)
    assert report["valid"] is True and {g["name"] for g in report["gates"]} >= {"netns", "cgroup"}

    r = await c.post(f"/v1/slots/{sid}/step", json={"action": "pyautogui.click(1, 2)"})
    assert r.status_code == 200 and r.json()["actions"] == 1
    r = await c.post(
        f"/v1/slots/{sid}/step",
        json={"action": {"type": "execute", "command": ["echo", "hi"]}, "screenshot": True},
    )
    step = r.json()
    assert step["output"]["stdout"] == "ran: echo hi\n"
    assert base64.b64decode(step["screenshot_png_b64"]).startswith(b"\x89PNG")
    shot = await c.get(f"/v1/slots/{sid}/screenshot")
    assert shot.headers["content-type"] == "image/png" and shot.content.startswith(b"\x89PNG")

    assert (await c.get(f"/v1/slots/{sid}")).json()["id"] == sid
    assert [s["id"] for s in (await c.get("/v1/slots")).json()["slots"]] == [sid]

    saved = await c.post(f"/v1/slots/{sid}/capture", json={"ttl_s": 600})
    assert saved.status_code == 201 and saved.json()["kind"] == "saved"
    from_state = await create(api, from_state=saved.json()["id"])
    assert from_state["checkpoint"] == saved.json()["id"]

    pf = (await c.post(f"/v1/slots/{sid}/prefork")).json()
    again = (await c.post(f"/v1/slots/{sid}/prefork", json={})).json()
    assert again["id"] == pf["id"], "a young prefork of the same state is reused"
    br = await c.post(f"/v1/slots/{sid}/fork", json={"n": 3})
    assert br.status_code == 201, br.text
    assert br.json()["checkpoint"] == pf["id"] and len(br.json()["children"]) == 3
    assert all(ch["parent"] == sid for ch in br.json()["children"])

    q = (await c.post(f"/v1/slots/{sid}/quiescent", json={"window_s": 0.01})).json()
    assert q["quiescent"] is True
    error_of(await c.post(f"/v1/slots/{sid}/task", json={"task": "abc"}), 422, "unsupported_task")
    v = (await c.post(f"/v1/slots/{sid}/verify")).json()
    assert v["valid"] is True and v["verdict"] == "valid" and v["checker_error"] == "no task loaded"
    assert v["trusted"] is False and v["score"] is None and v["actions"] == 2
    m = (await c.get(f"/v1/slots/{sid}/metrics")).json()
    assert m["actions"] == 2 and m["latencies"]["step"]["count"] == 2

    r = await c.post(f"/v1/slots/{sid}/quarantine", json={"reason": "looks odd"})
    assert r.json()["state"] == "quarantined"
    assert (await c.post(f"/v1/slots/{sid}/release")).json()["state"] == "ready"
    r = await c.post(f"/v1/slots/{sid}/reset")
    assert r.json()["episode"] == 2
    assert (await wait_valid(api, sid))["valid"] is True, "reset starts a clean episode"

    cps = (await c.get("/v1/checkpoints")).json()["checkpoints"]
    assert {cp["kind"] for cp in cps} == {"template", "saved", "prefork"}
    assert (await c.get(f"/v1/checkpoints/{pf['id']}")).json()["id"] == pf["id"]
    error_of(await c.delete(f"/v1/checkpoints/{saved.json()['id']}"), 409, "conflict")
    adopt_dir = api.config.state_dir.parent / "outside"
    adopt_dir.mkdir()
    meta = {"upper_sha256": "u", "image_sha256": SHA, "profile": "hardened"}
    (adopt_dir / "meta.json").write_text(json.dumps(meta))
    adopted = await c.post("/v1/checkpoints", json={"path": str(adopt_dir)})
    assert adopted.status_code == 201 and adopted.json()["upper_sha256"] == "u"
    assert api.sup.checkpoints[adopted.json()["id"]].lower == str(api.config.lower)
    deleted = await c.delete(f"/v1/checkpoints/{adopted.json()['id']}")
    assert deleted.status_code == 200 and adopt_dir.exists(), "adopted dirs are not ours to rm"

    assert (await c.get("/v1/tasks")).json() == {"tasks": []}
    error_of(await c.get("/v1/tasks/nope"), 404, "not_found")

    assert (await c.delete(f"/v1/slots/{sid}")).json() == {
        "id": sid,
        "destroyed": True,
        "already": False,
    }
    assert (await c.delete(f"/v1/slots/{sid}")).json()["already"] is True
    for method, path in [
        ("GET", ""),
        ("POST", "/step"),
        ("GET", "/screenshot"),
        ("POST", "/reset"),
        ("GET", "/gates"),
    ]:
        body = {"action": "x"} if path == "/step" else None
        r = await c.request(method, f"/v1/slots/{sid}{path}", json=body)
        error_of(r, 410, "env_gone")
    all_slots = (await c.get("/v1/slots", params={"all": "true"})).json()["slots"]
    assert sid in {s["id"] for s in all_slots}

    metrics = (await c.get("/v1/metrics")).json()
    assert metrics["latencies"]["create"]["count"] == 2
    assert metrics["latencies"]["fork"]["count"] == 1
    assert metrics["episodes_by_verdict"]["valid"] >= 1
    assert metrics["cost"]["usd_per_valid_episode"] is not None
    text = (await c.get("/metrics")).text
    assert 'drums_operation_seconds_count{operation="create"} 2' in text
    closed = (await c.post("/v1/metrics/reset")).json()
    assert closed["latencies"]["create"]["count"] == 2
    assert (await c.get("/v1/metrics")).json()["latencies"]["create"]["count"] == 0

    doc = (await c.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    for route in ROUTES:
        assert route.method.lower() in doc["paths"][route.path], route.path


async def test_every_authenticated_route_is_401_without_a_token(api: Api) -> None:
    paths = [
        (
            r.method,
            r.path.replace("{slot_id}", "s-x")
            .replace("{checkpoint_id}", "c")
            .replace("{task_id}", "t"),
        )
        for r in ROUTES
        if r.auth
    ]
    paths.append(("GET", "/openapi.json"))
    for headers in (
        {"Authorization": ""},
        {"Authorization": "Bearer " + "u" * 40},
        {"Authorization": TOKEN},
    ):
        for method, path in paths:
            r = await api.client.request(method, path, headers=headers)
            err = error_of(r, 401, "unauthorized")
            assert "Bearer" in err["message"] and r.headers["www-authenticate"]


async def test_bad_input_is_4xx_with_a_message(api: Api) -> None:
    c = api.client
    sid = (await create(api))["id"]
    cases = [
        (c.post(f"/v1/slots/{sid}/step", content=b"{nope"), 422, "not valid JSON"),
        (c.post(f"/v1/slots/{sid}/step", content=b"[1]"), 422, "JSON object"),
        (c.post(f"/v1/slots/{sid}/step", content=b""), 422, "needs a JSON body"),
        (c.post(f"/v1/slots/{sid}/step", json={"action": {"type": "teleport"}}), 422, "action"),
        (c.post(f"/v1/slots/{sid}/step", json={"action": {"type": "type"}}), 422, "text"),
        (c.post(f"/v1/slots/{sid}/step", json={"action": {"type": "click", "x": 5}}), 422, "y"),
        (
            c.post(f"/v1/slots/{sid}/step", json={"action": {"type": "click", "x": -1, "y": 0}}),
            422,
            "x",
        ),
        (c.post(f"/v1/slots/{sid}/step", json={"action": "x", "extra": 1}), 422, "extra"),
        (c.post(f"/v1/slots/{sid}/fork", json={"n": 0}), 422, "n"),
        (c.post(f"/v1/slots/{sid}/fork", json={"n": "four"}), 422, "n"),
        (c.post(f"/v1/slots/{sid}/fork", json={"n": 65}), 422, "n"),
        (c.post("/v1/slots", json={"idle_timeout_s": -5}), 422, "idle_timeout_s"),
        (c.post("/v1/slots", json={"image": "base", "from_state": "st-1"}), 422, "either"),
        (c.post("/v1/slots", json={"from_state": "st-nope"}), 404, "st-nope"),
        (c.post("/v1/slots", json={"image": "office"}), 404, "office"),
        (c.get("/v1/slots", params={"all": "maybe"}), 422, "all"),
        (c.post("/v1/slots/s-nope/step", json={"action": "x"}), 404, "s-nope"),
        (c.get("/v1/checkpoints/c-nope"), 404, "c-nope"),
        (c.post("/v1/checkpoints", json={"path": "relative"}), 422, "absolute"),
        (c.post("/v1/checkpoints", json={"path": "/nonexistent/dir"}), 422, "not a directory"),
        (c.post(f"/v1/slots/{sid}/release"), 409, "not quarantined"),
        (c.put("/v1/slots"), 405, "not allowed"),
        (c.get("/v2/nothing"), 404, "no route"),
        (c.post(f"/v1/slots/{sid}/quarantine", json={"reason": ""}), 422, "reason"),
    ]
    for request, status, needle in cases:
        r = await request
        assert r.status_code == status, (needle, r.text)
        assert needle in r.json()["error"]["message"], (needle, r.json())


async def test_a_failed_start_gate_quarantines_and_verify_gives_no_reward(api: Api) -> None:
    api.runtime.faults_for_new = {"net_links": ["lo", "eth0"]}
    sid = (await create(api))["id"]
    api.runtime.faults_for_new = {}
    slot = (await api.client.get(f"/v1/slots/{sid}")).json()
    assert slot["state"] == "quarantined" and "netns" in slot["quarantine_reason"]
    report = (await api.client.get(f"/v1/slots/{sid}/gates")).json()
    assert report["valid"] is False and "netns" in report["failed"]
    netns = next(g for g in report["gates"] if g["name"] == "netns")
    assert netns["evidence"]["links"] == ["eth0", "lo"]
    error_of(
        await api.client.post(f"/v1/slots/{sid}/step", json={"action": "x"}), 423, "quarantined"
    )
    err = error_of(await api.client.post(f"/v1/slots/{sid}/verify"), 423, "quarantined")
    assert "netns" in err["detail"]["failed_gates"]
    await api.client.post(f"/v1/slots/{sid}/release")
    v = (await api.client.post(f"/v1/slots/{sid}/verify")).json()
    assert v["valid"] is False and v["verdict"] == "invalid" and v["trusted"] is False
    await api.client.post(f"/v1/slots/{sid}/reset")
    assert (await wait_valid(api, sid))["valid"] is True


async def test_mid_episode_failures_quarantine(api: Api) -> None:
    oom = (await create(api))["id"]
    await wait_valid(api, oom)
    api.runtime.inject(oom, oom_kills=1)
    report = (await api.client.get(f"/v1/slots/{oom}/gates")).json()
    assert "no_oom_kill" in report["failed"]
    assert (await api.client.get(f"/v1/slots/{oom}")).json()["state"] == "quarantined"

    died = (await create(api))["id"]
    await wait_valid(api, died)
    api.runtime.kill(died)
    await wait_for(lambda: api.sup.slots[died].status.value == "quarantined")
    reason = api.sup.slots[died].quarantine_reason
    assert reason == "the slot's init exited mid-episode (killed by SIGKILL)"


async def test_a_tree_stuck_at_pids_max_quarantines(api: Api) -> None:
    """issue 14, finding 11: a fork bomb left the episode valid; forks refused at pids.max
    since the episode began fail no_oom_kill and quarantine the slot."""
    calm = (await create(api))["id"]
    bomb = (await create(api))["id"]
    await wait_valid(api, calm)
    await wait_valid(api, bomb)
    api.runtime.inject(bomb, extra={"pids_max_hits": 50})
    report = (await api.client.get(f"/v1/slots/{bomb}/gates")).json()
    assert "no_oom_kill" in report["failed"], report
    (gate,) = [g for g in report["gates"] if g["name"] == "no_oom_kill"]
    assert gate["evidence"]["pids_max_hits"] == 50, report
    assert (await api.client.get(f"/v1/slots/{bomb}")).json()["state"] == "quarantined"
    calm_report = (await api.client.get(f"/v1/slots/{calm}/gates")).json()
    assert calm_report["valid"] is True, calm_report


async def test_crash_exits_fail_no_app_crash(api: Api) -> None:
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    api.runtime.inject(sid, extra={"crash_exits": [{"pid": 7, "name": "soffice", "signal": 11}]})
    err = error_of(await api.client.post(f"/v1/slots/{sid}/verify"), 423, "quarantined")
    assert err["detail"]["failed_gates"] == ["no_app_crash", "not_quarantined"]


async def test_admission_refuses_with_retry_after_and_starts_nothing(tmp_path: Path) -> None:
    def tight(_: Path) -> HostSample:
        return HostSample(time.time(), 4000, 24_000, 0.0, 50_000, 100_000)

    async with open_api(tmp_path, sampler=tight) as api:
        r = await api.client.post("/v1/slots", json={})
        err = error_of(r, 429, "overloaded")
        assert err["detail"]["limit"] == "admission.min_available_mib"
        assert int(r.headers["retry-after"]) >= 1
        assert not [c for c in api.runtime.calls if c[0] == "restore"]
        assert api.sup.slots == {}
        health = (await api.client.get("/v1/health")).json()
        assert health["admission"]["admitting"] is False and health["status"] == "degraded"


async def test_leases_reap_and_retention_archives(api: Api) -> None:
    valid = (await create(api, idle_timeout_s=30))["id"]
    await wait_valid(api, valid)
    bad = (await create(api, ttl_s=100))["id"]
    await api.client.get(f"/v1/slots/{bad}/screenshot")
    await api.client.post(f"/v1/slots/{bad}/quarantine", json={"reason": "test"})
    keep = (await create(api, idle_timeout_s=1000))["id"]
    api.clock[0] += 20
    await api.client.get(f"/v1/slots/{valid}")  # a request renews the lease
    api.clock[0] += 20
    assert (await api.sup.reap_once())["slots"] == []
    api.clock[0] += 70
    done = await api.sup.reap_once()
    assert sorted(done["slots"]) == sorted([valid, bad])
    error_of(await api.client.get(f"/v1/slots/{valid}"), 410, "env_gone")
    assert (await api.client.get(f"/v1/slots/{keep}")).status_code == 200

    forgotten = api.config.forgotten_dir
    summaries = list((forgotten / "summary").glob(f"*-{valid}.json"))
    assert len(summaries) == 1 and json.loads(summaries[0].read_text())["verdicts"] == ["valid"]
    fulls = list((forgotten / "full").glob(f"*-{bad}.tar.zst"))
    assert len(fulls) == 1
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(fulls[0].read_bytes())).read()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        names = set(tar.getnames())
        record = json.load(tar.extractfile(f"{bad}/record.json"))
    assert {
        f"{bad}/record.json",
        f"{bad}/events.jsonl",
        f"{bad}/gates.json",
        f"{bad}/last-screenshot.png",
    } <= names
    assert record["quarantine_reason"] == "by request: test"


async def test_restore_failure_is_502_and_leaves_a_full_archive(api: Api) -> None:
    api.runtime.fail_next_restore = "criu restore failed: see restore.log"
    err = error_of(await api.client.post("/v1/slots", json={}), 502, "restore_failed")
    assert "criu" in err["message"]
    (rec,) = api.sup.slots.values()
    assert rec.status.value == "destroyed" and "restore_failed" in rec.failure
    assert list((api.config.forgotten_dir / "full").glob(f"*-{rec.id}.tar.zst"))
    assert (await api.client.get("/v1/metrics")).json()["failures_by_class"]["restore_failed"] == 1


async def test_restart_adopts_live_slots_and_marks_dead_ones_down(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        live = (await create(api))["id"]
        dead = (await create(api))["id"]
        gone = (await create(api))["id"]
        await api.client.delete(f"/v1/slots/{gone}")
        saved = (await api.client.post(f"/v1/slots/{live}/capture")).json()["id"]
        api.sup.table.flush_dirty()
    # The dead slot's process tree vanished while the daemon was down.
    (tmp_path / "state" / "memory-runtime" / f"{dead}.json").unlink()
    async with open_api(tmp_path) as api:
        assert api.sup.reconciled["adopted"] == [live]
        assert api.sup.reconciled["down"] == [dead]
        assert (await api.client.get(f"/v1/slots/{live}")).json()["state"] == "ready"
        r = await api.client.post(f"/v1/slots/{live}/step", json={"action": "x"})
        assert r.status_code == 200
        error_of(
            await api.client.post(f"/v1/slots/{dead}/step", json={"action": "x"}), 410, "env_gone"
        )
        error_of(await api.client.get(f"/v1/slots/{gone}"), 410, "env_gone")
        assert (await api.client.get(f"/v1/checkpoints/{saved}")).status_code == 200
        assert ("destroy", dead) in api.runtime.calls


async def test_an_image_with_the_wrong_hash_is_refused(tmp_path: Path) -> None:
    images = tmp_path / "images" / "base-1"
    images.mkdir(parents=True)
    (images / "image.json").write_text(json.dumps({"sha256": "cd" * 32}))
    async with open_api(tmp_path, lower=None, images_dir=str(tmp_path / "images")) as api:
        err = error_of(await api.client.post("/v1/slots", json={}), 404, "not_found")
        assert "refused" in err["message"]
        health = (await api.client.get("/v1/health")).json()
        assert any("sha256" in w for w in health["warnings"])


async def test_journal_holds_every_record_before_work_starts(tmp_path: Path) -> None:
    runtime = MemoryRuntime(tmp_path / "state", restore_delay_s=0.3)
    async with open_api(tmp_path, runtime=runtime) as api:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(api.client.post, "/v1/slots", json={}))
            # The record is written off-thread: what must hold is that it is on disk by the time
            # the runtime starts restoring (the restore is 0.3 s, so this looks while it runs).
            await wait_for(lambda: ("restore", next(iter(api.sup.slots), "")) in runtime.calls)
            (rec,) = api.sup.slots.values()
            on_disk = Journal(api.config.journal_dir).read().slots
            assert on_disk[rec.id].status.value == "creating"
        assert api.sup.slots[rec.id].status.value == "ready"


async def test_capture_below_state_min_free_is_507(tmp_path: Path) -> None:
    # 2500 MiB free is above state_min_free_mib (1024), so a create goes; a capture's dump
    # (admission.capture_mib, 2048) would leave 452 MiB, so it is refused before it starts.
    def full_disk(_: Path) -> HostSample:
        return HostSample(time.time(), 20_000, 24_000, 0.0, 2500, 100_000)

    async with open_api(tmp_path, sampler=full_disk, admission={"min_state_free_mib": 0}) as api:
        sid = (await create(api))["id"]
        err = error_of(await api.client.post(f"/v1/slots/{sid}/capture"), 507, "state_dir_full")
        assert "state_min_free_mib" in err["message"]
        error_of(
            await api.client.post(f"/v1/slots/{sid}/fork", json={"n": 1}), 507, "state_dir_full"
        )


async def test_the_reaper_runs_on_its_own_interval(tmp_path: Path) -> None:
    async with open_api(tmp_path, lease={"reap_interval_s": 0.05}) as api:
        sid = (await create(api, idle_timeout_s=0.3))["id"]
        kept = (await create(api))["id"]
        await wait_for(lambda: api.sup.slots[sid].status.value == "destroyed")
        assert ("destroy", sid) in api.runtime.calls
        assert api.sup.slots[kept].status.value == "ready"


async def test_the_sampler_lifts_a_refusal_when_memory_returns(tmp_path: Path) -> None:
    available = [1000.0]

    def changing(_: Path) -> HostSample:
        return HostSample(time.time(), available[0], 24_000, 0.0, 50_000, 100_000)

    async with open_api(tmp_path, sampler=changing, admission={"sample_interval_s": 0.05}) as api:
        error_of(await api.client.post("/v1/slots", json={}), 429, "overloaded")
        available[0] = 20_000.0
        await wait_for(lambda: api.sup.sample.mem_available_mib == 20_000.0)
        await create(api)


async def test_an_early_verify_waits_for_the_pending_gates(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    # The documented first episode: children of a fork verified at once, before alive_after_s
    # has passed. verify waits for alive_after_resume instead of calling the episode invalid.
    async with open_api(tmp_path, clock=virtual_clock, alive_after_s=0.8) as api:
        sid = (await create(api))["id"]
        br = await api.client.post(f"/v1/slots/{sid}/fork", json={"n": 2})
        assert br.status_code == 201, br.text
        for child in br.json()["children"]:
            started = trio.current_time()
            v = (await api.client.post(f"/v1/slots/{child['id']}/verify")).json()
            assert v["valid"] is True and v["verdict"] == "valid", v
            assert not any("pending" in r for r in v["invalid_reasons"]), v
        assert trio.current_time() - started < 0.8 + 5.0  # bounded by alive_after_s and a margin


async def test_children_and_saved_states_inherit_their_makers_lease(api: Api) -> None:
    """issue 14, finding 8: a client's 60 s idle timeout, not the config's 1,800 s, for what
    its slot makes (the SDK's fork() and save() pass no lease of their own)."""
    maker = (await create(api, idle_timeout_s=60, ttl_s=900))["id"]
    await wait_valid(api, maker)
    r = await api.client.post(f"/v1/slots/{maker}/fork", json={"n": 2})
    assert r.status_code in (200, 201), r.text
    children = [c["id"] for c in r.json()["children"]]
    r = await api.client.post(f"/v1/slots/{maker}/capture", json={})
    assert r.status_code in (200, 201), r.text
    state = r.json()["id"]
    for child in children:
        rec = api.sup.get_slot(child)
        assert (rec.idle_timeout_s, rec.ttl_s) == (60, 900)
    cp = api.sup.get_checkpoint(state)
    assert cp.idle_timeout_s == 60
    assert cp.idle_timeout_s < api.config.lease.state_idle_timeout_s

    # Asked for explicitly, the request's lease wins.
    r = await api.client.post(f"/v1/slots/{maker}/fork", json={"n": 1, "idle_timeout_s": 500})
    kept = r.json()["children"][0]["id"]
    assert api.sup.get_slot(kept).idle_timeout_s == 500

    # The client stops calling: after 60 s the maker, its children and its state all go.
    api.clock[0] += 61
    done = await api.sup.reap_once()
    assert set(children) | {maker} <= set(done["slots"])
    assert kept not in done["slots"]
    error_of(await api.client.get(f"/v1/checkpoints/{state}"), 404, "not_found")


async def test_the_alive_judge_survives_an_unexpected_error_and_still_judges(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    # A gate left pending makes every verify of the episode invalid ("gates pending:
    # alive_after_resume", seen once in the live validator): an error reading facts is retried.
    async with open_api(tmp_path, clock=virtual_clock, alive_after_s=0.2) as api:
        sid = (await create(api))["id"]
        real = api.runtime.facts
        failures = iter([None, ValueError("boom")])  # the start's read, then the judge's

        async def flaky(handle):
            exc = next(failures, None)
            if exc is not None:
                raise exc
            return await real(handle)

        api.runtime.facts = flaky
        r = await api.client.post(f"/v1/slots/{sid}/reset")
        assert r.status_code == 200, r.text
        rec = api.sup.get_slot(sid)
        # judged after alive_after_s and a retry 1 s later (virtual time)
        await wait_for(lambda: api.sup.gate_statuses(rec)["alive_after_resume"] != "pending", 3)
        api.runtime.facts = real
        v = (await api.client.post(f"/v1/slots/{sid}/verify")).json()
        assert not any("pending" in r for r in v["invalid_reasons"]), v
        gates = (await api.client.get(f"/v1/slots/{sid}/gates")).json()
        statuses = {g["name"]: g["status"] for g in gates["gates"]}
        assert statuses["alive_after_resume"] == "pass", gates


async def test_the_alive_judge_does_not_wait_for_a_long_first_step(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    # Issue 39, D8: a first step longer than alive_after_s held the slot's lock, and the judge
    # waited behind it, then saw the tree as the step left it. It judges on time now.
    async with open_api(tmp_path, clock=virtual_clock, alive_after_s=0.3) as api:
        sid = (await create(api))["id"]
        async with api.sup.table.lock(sid):  # what a long step does
            await wait_for(
                lambda: (
                    api.sup.gate_statuses(api.sup.get_slot(sid))["alive_after_resume"] == "pass"
                ),
                limit_s=3.0,
            )


async def test_the_alive_judge_waits_out_a_capture_instead_of_giving_up(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    # A task checkpoint's capture right after a create's setup marks the slot busy; a judge
    # waking then returned without a verdict, and the episode stayed pending (never valid).
    from drumsd.core.records import SlotStatus

    async with open_api(tmp_path, clock=virtual_clock, alive_after_s=0.3) as api:
        sid = (await create(api))["id"]
        rec = api.sup.get_slot(sid)
        rec.status = SlotStatus.busy  # what a capture does while it holds the tree
        await trio.sleep(0.6)  # virtual: twice alive_after_s
        assert api.sup.gate_statuses(rec)["alive_after_resume"] == "pending"
        rec.status = SlotStatus.ready
        await wait_for(
            lambda: api.sup.gate_statuses(rec)["alive_after_resume"] == "pass", limit_s=3.0
        )


async def test_adopting_a_checkpoint_checks_its_image_profile_and_files(api: Api) -> None:
    """Each refusal is a 422 naming what is wrong and what to do, and registers nothing."""
    c = api.client
    cp_dir = api.config.state_dir.parent / "elsewhere"
    cp_dir.mkdir()

    async def refused(meta: dict, *needles: str) -> None:
        (cp_dir / "meta.json").write_text(json.dumps(meta))
        before = set(api.sup.checkpoints)
        r = await c.post("/v1/checkpoints", json={"path": str(cp_dir)})
        body = error_of(r, 422, "invalid_request")
        for needle in needles:
            assert needle in body["message"], body["message"]
        assert "Nothing was registered" in body["message"]
        assert body["detail"]["problems"]
        assert set(api.sup.checkpoints) == before
        listed = (await c.get("/v1/checkpoints")).json()["checkpoints"]
        assert {cp["id"] for cp in listed} == before

    await refused({"profile": "hardened"}, "names no image_sha256")
    await refused(
        {"image_sha256": "cd" * 32, "profile": "hardened"},
        "cdcdcdcdcdcd... that the dump was made from is not on this host",
        "build or copy that image first",
    )
    await refused(
        {"image_sha256": SHA, "profile": "trusted"},
        "profile 'trusted', this daemon runs 'hardened'",
    )
    await refused({"image_sha256": SHA}, "names no profile")
    api.runtime.fail_adopt_check = ["images/pstree.img is missing"]
    await refused({"image_sha256": SHA, "profile": "hardened"}, "images/pstree.img is missing")
    api.runtime.fail_adopt_check = []
    r = await c.post("/v1/checkpoints", json={"path": str(cp_dir)})
    assert r.status_code == 201, r.text


async def test_adopting_a_checkpoint_of_an_image_with_another_guest_agent_is_refused(
    tmp_path: Path,
) -> None:
    """Both images are on the host, but the template here runs the newer one's guest agent."""
    import os

    for name, sha, guest, age in (
        ("base-old", "cd", "1" * 64, 100),
        ("base-new", "ef", "2" * 64, 0),
    ):
        image = tmp_path / "images" / name
        (image / "root").mkdir(parents=True)
        (image / "image.json").write_text(json.dumps({"sha256": sha * 32, "guest_sha256": guest}))
        when = time.time() - age
        os.utime(image / "image.json", (when, when))
    images_dir = str(tmp_path / "images")
    async with open_api(tmp_path, lower=None, image_sha256=None, images_dir=images_dir) as api:
        assert api.sup.template_status.get("base") == "ready", api.sup.template_status
        cp_dir = tmp_path / "made-elsewhere"
        cp_dir.mkdir()
        (cp_dir / "meta.json").write_text(
            json.dumps({"image_sha256": "cd" * 32, "profile": "hardened"})
        )
        before = set(api.sup.checkpoints)
        err = error_of(
            await api.client.post("/v1/checkpoints", json={"path": str(cp_dir)}),
            422,
            "invalid_request",
        )
        assert (
            "carries guest agent 111111111111..., this daemon's templates run 222222222222..."
            in err["message"]
        )
        assert set(api.sup.checkpoints) == before
        (cp_dir / "meta.json").write_text(
            json.dumps({"image_sha256": "ef" * 32, "profile": "hardened"})
        )
        r = await api.client.post("/v1/checkpoints", json={"path": str(cp_dir)})
        assert r.status_code == 201, r.text
        assert api.sup.checkpoints[r.json()["id"]].lower == str(
            tmp_path / "images" / "base-new" / "root"
        )
