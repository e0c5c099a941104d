"""The supervisor's warm-spare wiring over the in-memory runtime with the Linux runtime's spare
calls recorded: pools enabled for templates and preforks, forgotten on delete, claims counted as
hits and misses in health and metrics, targets pushed within per_host, refills under admission."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from drumsd.core.admission import HostSample
from drumsd.core.seams import CheckpointRef, SlotHandle, SlotLimits
from drumsd.runtime.memory_runtime import MemoryRuntime
from drumsd.runtime.services.spares import SparePools
from harness import create, open_api


class SpareRecordingRuntime(MemoryRuntime):
    """MemoryRuntime plus the spare calls of the Linux runtime; claims alternate hit/miss."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.enabled: dict[str, SlotLimits] = {}
        self.forgotten: list[str] = []
        self.targets: dict[str, int] = {}
        self.claims = 0
        self.refill_allowed = lambda: True

    def enable_spares(self, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        self.enabled[checkpoint.id] = limits

    async def forget_checkpoint(self, checkpoint_id: str) -> None:
        self.enabled.pop(checkpoint_id, None)
        self.forgotten.append(checkpoint_id)

    def set_spare_target(self, checkpoint_id: str, n: int) -> None:
        self.targets[checkpoint_id] = n

    async def drop_spares(self, checkpoint_id: str) -> None:
        self.enabled.pop(checkpoint_id, None)

    def spare_counts(self) -> dict[str, int]:
        return {cid: 2 for cid in self.enabled}

    def ksm_stats(self) -> dict[str, Any]:
        return {"enabled": True, "saved_bytes": 3 * 1024 * 1024}

    def _mark(self, handle: SlotHandle) -> SlotHandle:
        self.claims += 1
        handle.extra["spare"] = self.claims % 2 == 1
        return handle

    async def restore(self, slot_id, checkpoint, limits, **kw):  # type: ignore[override]
        return self._mark(await super().restore(slot_id, checkpoint, limits, **kw))

    async def reset(self, handle, checkpoint, limits):  # type: ignore[override]
        return self._mark(await super().reset(handle, checkpoint, limits))


async def test_pools_follow_checkpoints_and_claims(tmp_path: Path) -> None:
    rt = SpareRecordingRuntime(tmp_path / "state")
    async with open_api(tmp_path, runtime=rt, spares={"per_checkpoint": 3, "per_host": 4}) as api:
        tpl = next(iter(api.sup.checkpoints))
        assert set(rt.enabled) == {tpl}

        slot = await create(api)  # a hit
        r = await api.client.post(f"/v1/slots/{slot['id']}/reset", json={})  # a miss
        assert r.status_code == 200, r.text
        health = (await api.client.get("/v1/health")).json()
        pool = health["pools"]["spares"]["checkpoints"][tpl]
        assert (pool["hits"], pool["misses"], pool["size"]) == (1, 1, 2)
        assert pool["claim_p50_s"] is not None and pool["restore_p50_s"] is not None
        assert health["ksm"]["saved_mib"] == 3.0
        metrics = (await api.client.get("/v1/metrics")).json()
        assert metrics["latencies"]["spare_claim"]["count"] == 1
        assert metrics["latencies"]["spare_miss_restore"]["count"] == 1
        assert metrics["counters"]["spare_hits"] == 1 and metrics["counters"]["spares_parked"] == 2

        r = await api.client.post(f"/v1/slots/{slot['id']}/prefork", json={})
        assert r.status_code in (200, 201), r.text
        pf = r.json()["id"]
        assert set(rt.enabled) == {tpl, pf}
        targets = api.sup.size_pools()
        # The new prefork wants the maximum (3), the template MIN_SPARES: 4 shared fairly.
        assert rt.targets == targets == {tpl: 2, pf: 2}

        r = await api.client.delete(f"/v1/checkpoints/{pf}")
        assert r.status_code == 200, r.text
        assert rt.forgotten == [pf] and set(rt.enabled) == {tpl}
        health = (await api.client.get("/v1/health")).json()
        assert pf not in health["pools"]["spares"]["checkpoints"]


async def test_refills_wait_for_admission(tmp_path: Path) -> None:
    rt = SpareRecordingRuntime(tmp_path / "state")
    async with open_api(tmp_path, runtime=rt) as api:
        assert rt.refill_allowed() is True
        api.sup.admission_book.sample = HostSample(time.time(), 100, 24_000, 0.0, 50_000, 100_000)
        assert rt.refill_allowed() is False
        health = (await api.client.get("/v1/health")).json()
        assert health["pools"]["spares"]["refill_allowed"] is False


async def test_spares_off_enables_no_pool(tmp_path: Path) -> None:
    rt = SpareRecordingRuntime(tmp_path / "state")
    async with open_api(tmp_path, runtime=rt, spares={"enabled": False}) as api:
        await create(api)
        assert rt.enabled == {}
        pools = (await api.client.get("/v1/health")).json()["pools"]["spares"]
        assert pools["enabled"] is False and pools["checkpoints"] == {}


def test_spare_pools_state_adds_once_sizes_from_claims_and_forgets_all() -> None:
    pools = SparePools()
    pools.add("cp1", now=10.0)
    pools.add("cp1", now=99.0)  # a second enable keeps the pool's age and its claims
    pools.add("cp2", now=10.0)
    assert pools.since == {"cp1": 10.0, "cp2": 10.0}
    assert pools.wanted(11.0, per_checkpoint=4) == {"cp1": 4, "cp2": 4}  # never claimed: all
    for t in range(20):  # cp1 claimed every second, each a 2 s restore
        pools.stats["cp1"].record(10.0 + t, False, 2.0)
    wanted = pools.wanted(30.0, per_checkpoint=4)
    assert wanted["cp1"] >= 2 and wanted["cp2"] == 4
    pools.targets = {"cp1": 2, "cp2": 1}
    pools.forget("cp1")
    assert "cp1" not in pools.since and "cp1" not in pools.stats and pools.targets == {"cp2": 1}
    assert pools.wanted(31.0, per_checkpoint=4) == {"cp2": 4}
