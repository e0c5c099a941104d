"""Config fields doing what docs/runtime.md says, through the API over the in-memory runtime:
capture's quiet wait and retries, leases that turn off, cost not reported, retention that keeps
failures, state-dir space counted after the admitted work."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from drumsd.core.admission import HostSample
from drumsd.core.config import Config
from drumsd.core.leases import checkpoint_lease, slot_lease
from drumsd.core.records import CheckpointKind
from drumsd.core.retention import GIB, Archived, files_to_delete
from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotHandle
from drumsd.runtime.memory_runtime import MemoryRuntime
from harness import TOKEN, create, error_of, open_api


async def test_capture_waits_for_quiet_then_dumps(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        sid = (await create(api))["id"]
        r = await api.client.post(f"/v1/slots/{sid}/capture")
        assert r.status_code == 201, r.text
        mine = [c[0] for c in api.runtime.calls if c[1] == sid]
        assert mine[-2:] == ["quiescent", "capture"], mine


async def test_a_desktop_that_keeps_moving_is_409_not_quiescent(tmp_path: Path) -> None:
    async with open_api(tmp_path, quiesce={"timeout_s": 0.2}) as api:
        sid = (await create(api))["id"]
        api.runtime.quiet = False
        err = error_of(await api.client.post(f"/v1/slots/{sid}/capture"), 409, "not_quiescent")
        assert f"/v1/slots/{sid}/quiescent" in err["message"], err
        assert "quiesce.timeout_s=0.2" in err["message"], err
        assert "last seen moving: sh(4242) started" in err["message"], err
        assert err["detail"]["moving"] == ["sh(4242) started"], err
        assert api.runtime.captures == 0
        assert api.sup.checkpoints.keys() == {"tpl-base"} or all(
            cp.kind is CheckpointKind.template for cp in api.sup.checkpoints.values()
        )
        assert [s.id for s in api.sup.slots.values()] == [sid]  # no child was started
        assert api.sup.slots[sid].status.value == "ready"
        api.runtime.quiet = True
        assert (await api.client.post(f"/v1/slots/{sid}/capture")).status_code == 201


async def test_a_failed_dump_is_tried_again_up_to_quiesce_max_attempts(tmp_path: Path) -> None:
    async with open_api(tmp_path, quiesce={"max_attempts": 3}) as api:
        sid = (await create(api))["id"]
        api.runtime.fail_captures = 2
        assert (await api.client.post(f"/v1/slots/{sid}/capture")).status_code == 201
        assert api.runtime.captures == 3
        mine = [c[0] for c in api.runtime.calls if c[1] == sid and c[0] != "restore"]
        assert mine[-6:] == ["quiescent", "capture"] * 3, mine  # a quiet wait before each try

        api.runtime.fail_captures = 3
        before = api.runtime.captures
        r = await api.client.post(f"/v1/slots/{sid}/capture")
        assert r.status_code >= 500 and r.json()["error"]["code"] == "runtime_error", r.text
        assert api.runtime.captures - before == 3
        assert api.sup.slots[sid].status.value == "ready"


async def test_max_attempts_one_means_no_retry(tmp_path: Path) -> None:
    async with open_api(tmp_path, quiesce={"max_attempts": 1}) as api:
        sid = (await create(api))["id"]
        api.runtime.fail_captures = 1
        r = await api.client.post(f"/v1/slots/{sid}/capture")
        assert r.json()["error"]["code"] == "runtime_error", r.text
        assert api.runtime.captures == 1


class LimitedDumps(MemoryRuntime):
    """Every dump fails on a kernel limit, as the Linux runtime's Dumper reports one."""

    async def capture(
        self, handle: SlotHandle, checkpoint_id: str, dest: Path, **kw: Any
    ) -> CheckpointRef:
        self.captures += 1
        raise RuntimeError_(
            "runtime_error", "fs.inotify.max_user_instances=1 reached dumping", limit="x"
        )


async def test_a_dump_on_a_kernel_limit_is_not_tried_again(tmp_path: Path) -> None:
    async with open_api(tmp_path, quiesce={"max_attempts": 3}, runtime_cls=LimitedDumps) as api:
        sid = (await create(api))["id"]
        r = await api.client.post(f"/v1/slots/{sid}/capture")
        assert "fs.inotify.max_user_instances=1 reached" in r.json()["error"]["message"], r.text
        assert api.runtime.captures == 1


def config(**raw: object) -> Config:
    return Config.model_validate({"token_file": "/t", **raw})


def test_lease_limits_turn_off_with_null_or_zero() -> None:
    for off in (None, 0):
        c = config(lease={"env_idle_timeout_s": off, "state_idle_timeout_s": off, "env_ttl_s": 0})
        lease = slot_lease(c, None, None)
        assert lease.idle_timeout_s is None and lease.ttl_s is None
        assert checkpoint_lease(c, CheckpointKind.saved, None, None).idle_timeout_s is None
    assert slot_lease(config(), None, None).idle_timeout_s == 1800.0


async def test_a_slot_with_leases_off_is_never_reaped(tmp_path: Path) -> None:
    async with open_api(tmp_path, lease={"reap_interval_s": 3600, "env_idle_timeout_s": 0}) as api:
        sid = (await create(api))["id"]
        api.clock[0] += 40 * 86400
        assert (await api.sup.reap_once())["slots"] == []
        assert api.sup.slots[sid].status.value == "ready"


async def test_cost_is_not_reported_without_a_host_price(tmp_path: Path) -> None:
    for price in (None, 0):
        (tmp_path / str(price)).mkdir()
        async with open_api(tmp_path / str(price), host_usd_per_hour=price) as api:
            cost = (await api.client.get("/v1/metrics")).json()["cost"]
            assert cost and all(v is None for v in cost.values()), cost
            text = (await api.client.get("/metrics")).text
            assert "drums_cost_usd{" not in text
    (tmp_path / "priced").mkdir()
    async with open_api(tmp_path / "priced", host_usd_per_hour=3.6) as api:
        cost = (await api.client.get("/v1/metrics")).json()["cost"]
        assert cost["usd_in_window"] is not None and cost["usd_in_window"] >= 0


def test_failure_archives_are_never_pruned_by_default() -> None:
    fulls = [Archived(f"full/{i}", "full", 5 * GIB, float(i)) for i in range(20)]  # 100 GiB
    summaries = [Archived(f"summary/{i}", "summary", GIB, float(i)) for i in range(3)]
    doomed = files_to_delete(fulls + summaries, config())
    assert [f.path for f in doomed] == ["summary/0"]  # only summaries have a default cap (2 GiB)
    capped = files_to_delete(fulls, config(retention={"full_max_gib": 10}))
    assert len(capped) == 18


async def test_create_below_state_min_free_is_507(tmp_path: Path) -> None:
    def low(_: Path) -> HostSample:
        return HostSample(time.time(), 20_000, 24_000, 0.0, 500, 100_000)

    async with open_api(tmp_path, sampler=low, admission={"min_state_free_mib": 0}) as api:
        err = error_of(await api.client.post("/v1/slots", json={}), 507, "state_dir_full")
        assert "state_min_free_mib=1024" in err["message"]
        assert not [c for c in api.runtime.calls if c[0] == "restore"]
        health = (await api.client.get("/v1/health")).json()
        assert any("state_min_free_mib" in w for w in health["warnings"])


async def test_admission_counts_the_dump_it_admits(tmp_path: Path) -> None:
    # 9000 MiB free is above admission.min_state_free_mib (8192) now, not after a 2048 MiB dump.
    def roomy_but_not_for_a_dump(_: Path) -> HostSample:
        return HostSample(time.time(), 20_000, 24_000, 0.0, 9000, 100_000)

    async with open_api(tmp_path, sampler=roomy_but_not_for_a_dump) as api:
        sid = (await create(api))["id"]
        err = error_of(await api.client.post(f"/v1/slots/{sid}/capture"), 429, "overloaded")
        assert err["detail"]["limit"] == "admission.min_state_free_mib"
        assert api.runtime.captures == 0


async def test_a_state_deleted_when_unused_goes_with_its_last_child(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        parent = (await create(api))["id"]
        state = (await api.client.post(f"/v1/slots/{parent}/prefork", json={})).json()["id"]
        r = await api.client.post(f"/v1/slots/{parent}/fork", json={"n": 2, "prefork": state})
        assert r.status_code == 201, r.text
        kids = [c["id"] for c in r.json()["children"]]
        # Plain DELETE still refuses (live children restore from it) and says what to do.
        err = error_of(await api.client.delete(f"/v1/checkpoints/{state}"), 409, "conflict")
        assert "when_unused=true" in err["message"]
        r = await api.client.delete(f"/v1/checkpoints/{state}", params={"when_unused": "true"})
        assert r.status_code == 200, r.text
        # No new slot starts from it, the parent's next fork dumps afresh, children still reset.
        error_of(await api.client.post("/v1/slots", json={"from_state": state}), 409, "conflict")
        r = await api.client.post(f"/v1/slots/{parent}/fork", json={"n": 1, "prefork": state})
        error_of(r, 409, "conflict")
        assert (await api.client.post(f"/v1/slots/{kids[0]}/reset")).status_code == 200
        await api.client.delete(f"/v1/slots/{kids[0]}")
        assert state in api.sup.checkpoints
        await api.client.delete(f"/v1/slots/{kids[1]}")
        assert state not in api.sup.checkpoints
        error_of(await api.client.get(f"/v1/checkpoints/{state}"), 404, "not_found")
        assert (await api.client.get(f"/v1/slots/{parent}")).json()["state"] == "ready"


async def test_sdk_fork_without_keep_state_leaves_no_state_even_if_never_closed(
    tmp_path: Path,
) -> None:
    from drums import AsyncClient

    async with open_api(tmp_path) as api:
        client = AsyncClient("http://drumsd", token=TOKEN, transport=api.client._transport)
        env = await client.create()
        forked = await env.fork(2).__aenter__()  # never exited: as if the process died inside
        state = forked.state.id
        assert api.sup.checkpoints[state].delete_when_unused is True
        for child in forked:
            await api.client.delete(f"/v1/slots/{child.id}")  # e.g. their leases running out
        assert state not in api.sup.checkpoints
        await client.aclose()


async def test_a_fork_dumps_a_busy_desktop_without_a_quiet_wait(tmp_path: Path) -> None:
    # A fork is taken mid-episode with apps still working (a live test's app polls every 10 ms
    # and never goes quiet): its prefork dumps the tree as it is, it is never refused.
    async with open_api(tmp_path, quiesce={"timeout_s": 0.2}) as api:
        sid = (await create(api))["id"]
        api.runtime.quiet = False
        r = await api.client.post(f"/v1/slots/{sid}/prefork", json={})
        assert r.status_code in (200, 201), r.text
        r = await api.client.post(f"/v1/slots/{sid}/fork", json={"n": 2})
        assert r.status_code == 201, r.text
        mine = [c[0] for c in api.runtime.calls if c[1] == sid]
        assert "quiescent" not in mine and "settle" in mine, mine
