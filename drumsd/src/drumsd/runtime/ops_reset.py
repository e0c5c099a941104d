"""reset (the same slot, a fresh restore of its checkpoint) and destroy (idempotent, archived)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.records import (
    CheckpointKind,
    SlotRecord,
    SlotStatus,
    check_can_reset,
    check_is_known,
)
from drumsd.runtime.episodes import begin_episode, finish_episode, retiring
from drumsd.runtime.failures import failure_text, runtime_failures
from drumsd.runtime.handles import checkpoint_ref, handle_of, slot_limits
from drumsd.runtime.ops_create import CreateHost, load_task_locked
from drumsd.runtime.ops_task_checkpoints import capture_after_setup, load_cached, plan_reset
from drumsd.runtime.teardown import destroy_locked

if TYPE_CHECKING:
    from drumsd.core.records import CheckpointRecord, SlotRecord

log = logging.getLogger("drumsd.supervisor")


class ResetHost(CreateHost, Protocol):
    """What reset and destroy use of the supervisor."""

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord: ...
    def get_slot(self, slot_id: str, *, renew: bool = True) -> SlotRecord: ...
    @property
    def slots(self) -> dict[str, SlotRecord]: ...


async def reset(sup: ResetHost, slot_id: str) -> SlotRecord:
    sup.check_open()
    sup.get_slot(slot_id)
    async with sup.table.locked(slot_id, check_can_reset) as rec:
        cp = sup.get_checkpoint(rec.checkpoint)
        # On a task: its task checkpoint when one is ready, else its source (setup replays).
        plan = await plan_reset(sup, rec, cp) if rec.task is not None else None
        if plan is not None:
            cp = plan.restore
            rec.checkpoint = cp.id
            rec.task_source = plan.source.id if plan.source is not None else rec.task_source
        if cp.kind is CheckpointKind.task:
            cp.last_used_at = sup.clock()  # task checkpoints are reaped least recently used
            sup.table.save_checkpoint(cp, "used")
        old = handle_of(rec)
        finish_episode(sup, rec)
        # Busy in memory only: after a crash mid-reset the journal still names the old tree,
        # which adopt() finds gone, so the slot is marked down and cleaned.
        rec.status = SlotStatus.busy
        started = trio.current_time()
        with runtime_failures(sup.metrics, what=f"reset of slot {slot_id}", slot_id=slot_id):
            try:
                # The old tree's namespaces are freed during the reset; the new handle is
                # recorded by begin_episode before anything else can run.
                with retiring(sup, slot_id):
                    handle = await sup.runtime.reset(
                        old, checkpoint_ref(cp), slot_limits(sup.config)
                    )
            except BaseException as exc:
                rec.status = SlotStatus.failed
                rec.failure = f"reset: {failure_text(exc, 'cancelled midway')}"
                sup.table.save_slot(rec, "failed")
                raise
        await begin_episode(sup, rec, handle, "reset", file=False)
        sup.observe("reset", slot_id, trio.current_time() - started)
        if plan is not None and plan.cached and rec.status is SlotStatus.ready:
            await load_cached(sup, rec, handle, cp)
        elif rec.task is not None and rec.status is SlotStatus.ready:
            await load_task_locked(sup, rec, handle, rec.task)
            if plan is not None:
                await capture_after_setup(sup, rec, plan)
    return rec


async def destroy(sup: ResetHost, slot_id: str, reason: str = "api") -> tuple[SlotRecord, bool]:
    """Idempotent: (record, already_destroyed)."""
    rec = check_is_known(sup.slots.get(slot_id), slot_id)
    if rec.status is SlotStatus.destroyed:
        return rec, True
    with trio.CancelScope(shield=True):  # a half-done destroy would leak a desktop
        async with sup.table.lock(slot_id):
            if rec.status is SlotStatus.destroyed:
                return rec, True
            await destroy_locked(sup, rec, reason)
    return rec, False
