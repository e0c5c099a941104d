"""The reaper: expired slots and states destroyed, tombstones dropped, renewals flushed, the
journal compacted and the forgotten_dir archives held to their caps."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.leases import (
    expired_checkpoints,
    expired_slots,
    stale_tombstones,
)
from drumsd.core.retention import files_to_delete
from drumsd.runtime.forgotten import delete_archives, scan_forgotten
from drumsd.runtime.ops_checkpoints import delete_checkpoint_record, referenced_checkpoints
from drumsd.runtime.ops_task_checkpoints import TaskCheckpointsHost, reap_over_cap
from drumsd.runtime.services import guarded_loop
from drumsd.runtime.store import snapshot_of

if TYPE_CHECKING:
    from collections.abc import Callable

    from drumsd.core.config import Config
    from drumsd.core.records import CheckpointRecord, SlotRecord
    from drumsd.runtime.slot_table import SlotTable
    from drumsd.runtime.store import RecordStore

log = logging.getLogger("drumsd.supervisor")


class ReaperHost(TaskCheckpointsHost, Protocol):
    """What the reaper uses of the supervisor."""

    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def config(self) -> Config: ...
    async def destroy(self, slot_id: str, reason: str = "api") -> tuple[SlotRecord, bool]: ...

    forgotten_bytes: int

    async def reap_once(self) -> dict[str, list[str]]: ...
    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def store(self) -> RecordStore: ...
    @property
    def table(self) -> SlotTable: ...


async def run(sup: ReaperHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
    await guarded_loop(
        sup,
        "reaper",
        sup.reap_once,
        sup.config.lease.reap_interval_s,
        sleep_first=True,
        task_status=task_status,
    )


async def reap_once(sup: ReaperHost) -> dict[str, list[str]]:
    """Destroy expired slots and states, drop old tombstones, flush renewals, apply caps."""
    now = sup.clock()
    done: dict[str, list[str]] = {"slots": [], "checkpoints": [], "archives": []}
    for rec, reason in expired_slots(list(sup.slots.values()), now):
        log.info("slot=%s lease over: %s", rec.id, reason)
        await sup.destroy(rec.id, reason=f"lease: {reason}")
        done["slots"].append(rec.id)
    referenced = referenced_checkpoints(sup)
    for cp, reason in expired_checkpoints(list(sup.checkpoints.values()), referenced, now):
        await delete_checkpoint_record(sup, cp, f"lease: {reason}")
        done["checkpoints"].append(cp.id)
    done["checkpoints"] += await reap_over_cap(sup)  # task checkpoints past their MiB cap
    for rec in stale_tombstones(list(sup.slots.values()), now):
        sup.table.forget(rec.id)
        sup.store.delete("slot", rec.id, "forgotten", now)
    sup.table.flush_dirty()
    await compact_if_large(sup)
    files = await trio.to_thread.run_sync(scan_forgotten, sup.config.forgotten_dir)
    doomed = files_to_delete(files, sup.config)
    if doomed:
        await trio.to_thread.run_sync(delete_archives, [f.path for f in doomed])
        done["archives"] = [f.path for f in doomed]
    sup.forgotten_bytes = sum(f.size for f in files) - sum(f.size for f in doomed)
    return done


async def compact_if_large(sup: ReaperHost) -> None:
    """Bound events.jsonl between restarts (the store keeps appends from interleaving)."""
    size = await sup.store.events_size()
    if size is not None and size > sup.config.journal_compact_mib * 1024 * 1024:
        await sup.store.compact(partial(snapshot_of, sup))
        log.info("journal compacted (events.jsonl was %d bytes)", size)
