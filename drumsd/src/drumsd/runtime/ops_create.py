"""create: resolve the source checkpoint, admit, save the record, restore, begin the episode."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio
from drums.models import (
    SlotCreate,
    TaskInfo,
)

from drumsd.core.errors import DrumsdError
from drumsd.core.leases import (
    slot_lease,
)
from drumsd.core.records import (
    CheckpointKind,
    CheckpointRecord,
    SlotRecord,
    SlotStatus,
)
from drumsd.core.seams import (
    SlotHandle,
)
from drumsd.runtime.episodes import begin_episode
from drumsd.runtime.failures import failure_text, runtime_failures
from drumsd.runtime.handles import checkpoint_ref, new_id, slot_limits
from drumsd.runtime.ops_checkpoints import resolve_source
from drumsd.runtime.ops_task_checkpoints import (
    TaskCheckpointsHost,
    capture_after_setup,
    load_cached,
    plan_create,
    wait_probed,
)
from drumsd.runtime.teardown import destroy_locked, discard

if TYPE_CHECKING:
    from collections.abc import Callable

    from drumsd.core.config import Config
    from drumsd.core.metrics import MetricsWindow
    from drumsd.core.seams import SlotRuntime
    from drumsd.runtime.ports import PortForwards
    from drumsd.runtime.slot_table import SlotTable
    from drumsd.runtime.store import RecordStore

log = logging.getLogger("drumsd.supervisor")


class CreateHost(TaskCheckpointsHost, Protocol):
    """What create and a task's load use of the supervisor."""

    def check_open(self) -> None: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def config(self) -> Config: ...
    @property
    def metrics(self) -> MetricsWindow: ...
    def observe(self, operation: str, slot_id: str | None, seconds: float) -> None: ...
    @property
    def ports(self) -> PortForwards: ...
    @property
    def runtime(self) -> SlotRuntime: ...
    def slot_cost_mib(self) -> float: ...
    @property
    def store(self) -> RecordStore: ...
    @property
    def table(self) -> SlotTable: ...


async def create(sup: CreateHost, req: SlotCreate) -> SlotRecord:
    sup.check_open()
    await wait_probed(sup, req.from_state)  # a task checkpoint just captured: its verdict
    source = resolve_source(sup, req)
    sup.admission_book.check_state_space("create")
    sup.admission_book.admit("create", sup.slot_cost_mib())
    # On a task: its task checkpoint, when one is ready, is what the slot restores.
    plan = await plan_create(sup, source, req.task)
    cp = plan.restore if plan is not None else source
    now = sup.clock()
    lease = slot_lease(sup.config, req.idle_timeout_s, req.ttl_s)
    rec = SlotRecord(
        id=new_id("s"),
        created_at=now,
        last_used_at=now,
        idle_timeout_s=lease.idle_timeout_s,
        ttl_s=lease.ttl_s,
        checkpoint=cp.id,
        image=cp.image,
        profile=sup.config.profile,
        labels=dict(req.labels),
        task_id=cp.task_id,
        task=cp.task,
        task_source=plan.source.id if plan is not None and plan.source is not None else None,
    )
    if cp.kind is not CheckpointKind.template:
        cp.last_used_at = now
        sup.table.save_checkpoint(cp, "used")
    started = trio.current_time()
    async with sup.table.lock(rec.id):
        await sup.ports.assign(rec)
        sup.table.save_slot(rec, "created")  # before any work: a crash now is reconciled
        await sup.store.durable()
        handle = await restore_new(sup, rec, cp)
        try:
            await begin_episode(sup, rec, handle, "ready")
            sup.observe("create", rec.id, trio.current_time() - started)
            if plan is not None and plan.cached:
                await load_cached(sup, rec, handle, cp, destroy_on_error=True)
            elif req.task is not None:
                await load_task_locked(sup, rec, handle, req.task, destroy_on_error=True)
                if plan is not None:
                    await capture_after_setup(sup, rec, plan)
        except BaseException:
            # A create that answers an error (or whose caller went away) leaves no slot: the
            # caller never learns its id, so nothing else would ever destroy it.
            if rec.status is not SlotStatus.destroyed:
                with trio.CancelScope(shield=True):
                    await destroy_locked(sup, rec, "create failed after its restore", rejected=True)
            raise
    return rec


async def restore_new(sup: CreateHost, rec: SlotRecord, cp: CheckpointRecord) -> SlotHandle:
    with (
        sup.admission_book.reserve("create", sup.slot_cost_mib()),
        runtime_failures(sup.metrics, what=f"restore of slot {rec.id}", slot_id=rec.id),
    ):
        try:
            return await sup.runtime.restore(rec.id, checkpoint_ref(cp), slot_limits(sup.config))
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                await discard(sup, rec, failure_text(exc, "create was cancelled"))
            raise


async def load_task_locked(
    sup: CreateHost,
    rec: SlotRecord,
    handle: SlotHandle,
    task: str | dict[str, Any],
    *,
    destroy_on_error: bool = False,
) -> TaskInfo:
    started = trio.current_time()
    try:
        info, task_json = await sup.tasks.load(rec, handle, task)
    except BaseException as exc:
        # Whatever the error (a bug in a setup step included), a slot made for this create
        # must not outlive it: the caller never learns its id (issue 14, finding 3).
        if destroy_on_error:
            with trio.CancelScope(shield=True):
                await destroy_locked(sup, rec, "task setup failed", rejected=True)
        if isinstance(exc, Exception) and not isinstance(exc, DrumsdError):
            log.exception("slot=%s task setup raised %r", rec.id, exc)
            raise DrumsdError(
                "setup_failed", f"task setup failed on slot {rec.id}: {exc!r}", slot=rec.id
            ) from exc
        raise
    rec.task_id = info.id
    rec.task = task_json
    rec.task_setup = "replayed"
    sup.table.save_slot(rec, "task_loaded")
    sup.observe("task_setup", rec.id, trio.current_time() - started)
    return info
