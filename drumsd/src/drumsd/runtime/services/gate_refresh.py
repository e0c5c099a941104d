"""Gate refresh: live slots' running gates (crash, OOM, mounts, init) judged without a request, so
a failure quarantines the slot mid-episode even when nobody asks for its gates."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.records import (
    SlotStatus,
)
from drumsd.runtime.services import ServiceHost, guarded_loop

if TYPE_CHECKING:
    from drumsd.core.records import SlotRecord
    from drumsd.runtime.slot_table import SlotTable


class GateRefreshHost(ServiceHost, Protocol):
    """What the gate refresh uses of the supervisor: the slots, their locks, the refresh."""

    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def table(self) -> SlotTable: ...
    async def refresh_gates(self, rec: SlotRecord) -> None: ...


log = logging.getLogger("drumsd.supervisor")


async def run(
    sup: GateRefreshHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
):
    await guarded_loop(
        sup,
        "gate_refresh",
        partial(refresh_all, sup),
        sup.config.gate_refresh_s,
        sleep_first=True,
        task_status=task_status,
    )


async def refresh_all(sup: GateRefreshHost) -> None:
    """One pass over the ready slots. A slot whose refresh raises is logged by name and skipped:
    one bad slot must not stop the others' gates (the pass then fails, so health shows it)."""
    failed: list[str] = []
    for slot_id in [r.id for r in sup.slots.values() if r.status is SlotStatus.ready]:
        lock = sup.table.lock(slot_id)
        if lock.locked():
            continue  # a request holds it (and refreshes gates itself when it matters)
        async with lock:
            rec = sup.slots.get(slot_id)
            if rec is None or rec.status is not SlotStatus.ready:
                continue
            try:
                await sup.refresh_gates(rec)
            except Exception:
                log.exception("slot=%s episode=%s gate refresh failed", rec.id, rec.episode)
                failed.append(slot_id)
    if failed:
        raise RuntimeError(f"gate refresh failed for slots {', '.join(failed)}")
