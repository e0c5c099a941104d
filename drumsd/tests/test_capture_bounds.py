"""A capture is bounded (issue 39, D3): refused when the slot's files hold more data than
admission.capture_max_mib (holes are free), abandoned at capture_timeout_s with the slot free
again, and /v1/health names an operation holding its slot too long and a worker thread still
running after its operation gave up on it. The in-memory runtime stands in for the desktops;
the slot's upper layer is a real dir."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import trio
from drumsd.core.seams import SlotHandle
from drumsd.linux.sparse import CancelFlag
from drumsd.runtime.memory_runtime import MemoryRuntime
from drumsd.runtime.slot_locks import Holder, SlotLock, held_too_long, run_stoppable
from drumsd.runtime.supervisor import handle_from_json
from harness import create, error_of, open_api
from trio.testing import MockClock


def _upper(api, sid: str) -> Path:
    upper = handle_from_json(api.sup.slots[sid].handle).upper
    upper.mkdir(parents=True, exist_ok=True)
    return upper


async def test_a_capture_past_the_size_bound_is_refused_naming_it_and_holes_are_free(
    tmp_path: Path,
) -> None:
    async with open_api(tmp_path, admission={"capture_max_mib": 2}) as api:
        sid = (await create(api))["id"]
        upper = _upper(api, sid)
        with (upper / "sparse.bin").open("wb") as f:
            f.truncate(1 << 40)  # 1 TiB apparent, nothing held
        r = await api.client.post(f"/v1/slots/{sid}/capture", json={})
        assert r.status_code == 201, r.text

        (upper / "data.bin").write_bytes(os.urandom(3 << 20))
        r = await api.client.post(f"/v1/slots/{sid}/capture", json={})
        err = error_of(r, 409, "conflict")
        assert "admission.capture_max_mib=2" in err["message"], err
        assert "Delete large files" in err["message"], err
        assert err["detail"]["real_mib"] >= 3 and err["detail"]["apparent_mib"] >= 1 << 20
        saved = [c for c in api.sup.checkpoints.values() if c.kind.value == "saved"]
        assert len(saved) == 1, "a refused capture leaves no checkpoint record"


class SlowCapture(MemoryRuntime):
    """A capture whose file work is a worker thread that ignores its cancel flag until the test
    lets it go (a copy stuck in one huge chunk)."""

    release = threading.Event()

    async def capture(self, handle: SlotHandle, checkpoint_id: str, dest: Path, **kw: Any):
        def stuck(cancel: CancelFlag) -> None:
            self.release.wait(30)

        await run_stoppable(stuck, what=f"copying {handle.slot_id}'s upper")
        return await super().capture(handle, checkpoint_id, dest, **kw)


async def test_a_capture_past_its_deadline_frees_the_slot_and_health_names_the_worker(
    tmp_path: Path,
) -> None:
    SlowCapture.release.clear()
    async with open_api(tmp_path, runtime_cls=SlowCapture, capture_timeout_s=1.0) as api:
        sid = (await create(api))["id"]
        started = time.monotonic()
        r = await api.client.post(f"/v1/slots/{sid}/capture", json={})
        err = error_of(r, 504, "timeout")
        assert time.monotonic() - started < 10
        assert "capture_timeout_s=1" in err["message"], err
        assert not api.sup.table.lock(sid).locked(), "the slot lock outlived the capture's deadline"
        r = await api.client.post(f"/v1/slots/{sid}/reset")
        assert r.status_code == 200, r.text

        health = (await api.client.get("/v1/health")).json()
        stuck = [w for w in health["warnings"] if "worker thread" in w]
        assert stuck and f"copying {sid}'s upper" in stuck[0], health["warnings"]
        assert health["status"] == "degraded"

        SlowCapture.release.set()

        async def still_listed() -> bool:
            warnings = (await api.client.get("/v1/health")).json()["warnings"]
            return any("worker thread" in w for w in warnings)

        with trio.fail_after(10):
            while await still_listed():  # noqa: ASYNC110 (health is polled: no event to wait on)
                await trio.sleep(0.05)


async def test_health_names_the_slot_and_operation_holding_a_lock_too_long(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    async with open_api(tmp_path, stuck_operation_s=0.2) as api:
        sid = (await create(api))["id"]
        lock = api.sup.table.lock(sid)
        async with lock.hold("capture", deadline_s=0.1):
            await trio.sleep(0.3)  # virtual: past the holder's deadline and stuck_operation_s
            warnings = (await api.client.get("/v1/health")).json()["warnings"]
        assert any(
            w.startswith(f"slot {sid}: capture has held the slot for") and "deadline of 0.1" in w
            for w in warnings
        ), warnings
        warnings = (await api.client.get("/v1/health")).json()["warnings"]
        assert not any(w.startswith(f"slot {sid}:") for w in warnings), warnings


async def test_a_plain_async_with_names_the_calling_function() -> None:
    lock = SlotLock()

    async def destroy_like() -> Holder | None:
        async with lock:
            return lock.holder

    holder = await destroy_like()
    assert holder is not None and holder.op == "destroy_like"
    assert lock.holder is None and not lock.locked()
    assert held_too_long({"s1": lock}, trio.current_time() + 1e6, 1.0) == []
