"""Task checkpoints: which one an episode of a task restores instead of replaying its setup,
capturing one after a task's first setup, loading a cached episode, reaping them past their cap.

A create or reset on a task asks `plan_setup` first: the key of the task's setup on its source
checkpoint (core/task_checkpoints.py) and the ready task checkpoint under that key, if any. With
one, the slot restores it (rec.checkpoint is the task checkpoint, so the state_hash gate judges
the episode against it) and `load_cached` carries the setup's host-side files; without, the
setup replays on the source and `capture_after_setup` dumps the result for the next episode.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core.errors import DrumsdError
from drumsd.core.leases import checkpoint_lease
from drumsd.core.records import CheckpointKind, CheckpointRecord, SlotRecord, SlotStatus
from drumsd.core.seams import SlotHandle
from drumsd.core.task_checkpoints import (
    SetupFingerprint,
    find_task_checkpoint,
    source_identity,
    task_checkpoint_key,
    task_checkpoints_over_cap,
)
from drumsd.runtime.ops_checkpoints import delete_checkpoint_record, referenced_checkpoints
from drumsd.runtime.ops_fork import ForkHost, capture_deadline, dump
from drumsd.runtime.services.spares import enable_spares, spares_on
from drumsd.runtime.teardown import destroy_locked
from drumsd.runtime.verifier import TaskSetupCache

if TYPE_CHECKING:
    from drumsd.runtime.admission_book import AdmissionBook
    from drumsd.runtime.services.spares import SparePools
    from drumsd.runtime.verifier import TaskCatalog

log = logging.getLogger("drumsd.supervisor")

# Sources a task setup may be cached on: a fork's prefork lives for seconds, a task checkpoint
# is already a setup's result.
CACHEABLE_SOURCES = (CheckpointKind.template, CheckpointKind.saved)
# After a refused capture (a tree that never goes quiet would cost every episode
# quiesce.timeout_s), the same key is not tried again for this long.
CAPTURE_RETRY_S = 600.0


class TaskCheckpointsHost(ForkHost, Protocol):
    """What task checkpoints use of the supervisor."""

    @property
    def admission_book(self) -> AdmissionBook: ...
    @property
    def pools(self) -> SparePools: ...
    @property
    def task_capture_refused(self) -> dict[str, float]: ...
    @property
    def tasks(self) -> TaskCatalog: ...


@dataclass(frozen=True)
class SetupPlan:
    """How an episode of a task starts: restore `restore` and then either load the cached
    setup (`cached`) or replay the steps (and capture the result under `key` if it is set)."""

    source: CheckpointRecord | None  # what the setup runs on (None: unknown, e.g. deleted)
    restore: CheckpointRecord
    cached: bool
    key: str | None = None
    fingerprint: SetupFingerprint | None = None


def setup_cache(sup: TaskCheckpointsHost) -> TaskSetupCache | None:
    return sup.tasks if isinstance(sup.tasks, TaskSetupCache) else None


async def plan_setup(
    sup: TaskCheckpointsHost, source: CheckpointRecord, task: str | dict[str, Any]
) -> SetupPlan:
    """The plan for a task on `source`: its task checkpoint when one is ready under the key."""
    cache = setup_cache(sup)
    replay = SetupPlan(source, source, cached=False)
    if cache is None or source.kind not in CACHEABLE_SOURCES:
        return replay
    enabled = sup.config.task_checkpoints.enabled
    if not enabled:
        return replay
    fp = await cache.setup_fingerprint(task, enabled=enabled)
    if not fp.cacheable:
        log.debug("task=%s setup replayed per episode: %s", fp.task_id, fp.reason)
        return SetupPlan(source, source, cached=False, fingerprint=fp)
    key = task_checkpoint_key(source_identity(source), fp)
    found = find_task_checkpoint(sup.checkpoints.values(), key)
    if found is not None:
        return SetupPlan(source, found, cached=True, key=key, fingerprint=fp)
    return SetupPlan(source, source, cached=False, key=key, fingerprint=fp)


async def plan_create(
    sup: TaskCheckpointsHost, source: CheckpointRecord, task: str | dict[str, Any] | None
) -> SetupPlan | None:
    """A create's plan: on a task, as plan_setup; from a task checkpoint named as the state,
    that checkpoint's cached setup; else None (no task)."""
    if task is not None:
        return await plan_setup(sup, source, task)
    if source.kind is CheckpointKind.task:
        return SetupPlan(sup.checkpoints.get(source.task_source or ""), source, cached=True)
    return None


async def plan_reset(
    sup: TaskCheckpointsHost, rec: SlotRecord, current: CheckpointRecord
) -> SetupPlan:
    """A reset of a slot on a task: from the task's source, cached or replayed again (the key
    is computed again: a changed asset or task file means a new setup)."""
    assert rec.task is not None
    source = sup.checkpoints.get(rec.task_source or "") if rec.task_source else None
    if source is None and current.kind is CheckpointKind.task:
        # Its source is gone (deleted by hand): the task checkpoint is restored as it is.
        return SetupPlan(None, current, cached=True)
    return await plan_setup(sup, source or current, rec.task)


def use_spares(sup: TaskCheckpointsHost, cp: CheckpointRecord) -> None:
    """A task checkpoint restored by a later episode is hot: keep warm spares of it."""
    if (
        cp.kind is CheckpointKind.task
        and sup.config.task_checkpoints.spares
        and spares_on(sup)
        and cp.id not in sup.pools.stats
    ):
        enable_spares(sup, cp)


async def load_cached(
    sup: TaskCheckpointsHost,
    rec: SlotRecord,
    handle: SlotHandle,
    cp: CheckpointRecord,
    *,
    destroy_on_error: bool = False,
) -> None:
    """The episode restored task checkpoint `cp`: no setup step runs; the record says which
    task and that its setup was cached, and the setup's host-side files are in place."""
    cache = setup_cache(sup)
    started = trio.current_time()
    try:
        if cache is None:
            raise DrumsdError(
                "unsupported_task",
                f"checkpoint {cp.id} is a task checkpoint, but this daemon's task catalog "
                "cannot load one; create from the task's image instead",
            )
        info = await cache.load_cached(rec, handle, cp.task or {}, Path(cp.dir))
    except BaseException:
        if destroy_on_error:
            with trio.CancelScope(shield=True):
                await destroy_locked(sup, rec, "task setup failed", rejected=True)
        raise
    rec.task_id = info.id
    rec.task = cp.task
    rec.task_setup = "cached"
    sup.table.save_slot(rec, "task_loaded")
    sup.observe("task_setup_cached", rec.id, trio.current_time() - started)
    use_spares(sup, cp)


async def capture_after_setup(sup: TaskCheckpointsHost, rec: SlotRecord, plan: SetupPlan) -> None:
    """The task's first setup on this source just finished on `rec`: dump it as the task's
    checkpoint (waiting for a quiet tree, as a saved state does). A capture that cannot happen
    (no space, a tree that does not go quiet) is logged and the episode goes on: the next one
    replays the setup again."""
    if plan.key is None or rec.status is not SlotStatus.ready or plan.source is None:
        return
    if find_task_checkpoint(sup.checkpoints.values(), plan.key) is not None:
        return  # another slot captured it meanwhile
    refused_at = sup.task_capture_refused.get(plan.key)
    if refused_at is not None and trio.current_time() - refused_at < CAPTURE_RETRY_S:
        return
    cache = setup_cache(sup)
    assert cache is not None
    mib = sup.config.admission.capture_mib
    lease = checkpoint_lease(sup.config, CheckpointKind.task, None, None)
    try:
        sup.admission_book.check_state_space("task checkpoint", mib)
        sup.admission_book.admit("task checkpoint", mib, mib)
        with capture_deadline(sup, rec.id, "the task checkpoint capture"):
            cp = await dump(
                sup,
                rec,
                CheckpointKind.task,
                lease.idle_timeout_s,
                lease.ttl_s,
                task_key=plan.key,
                before_ready=partial(keep_run_files, cache, rec.id),
            )
    except DrumsdError as exc:
        sup.task_capture_refused[plan.key] = trio.current_time()
        log.warning(
            "slot=%s task=%s no task checkpoint (episodes replay setup; tried again after "
            f"{CAPTURE_RETRY_S:g} s): %s",
            rec.id,
            rec.task_id,
            exc.message,
        )
        return
    sup.task_capture_refused.pop(plan.key, None)
    cp.task_source = plan.source.id
    sup.table.save_checkpoint(cp, "task checkpoint")
    log.info("slot=%s task=%s task checkpoint %s captured", rec.id, rec.task_id, cp.id)
    await reap_over_cap(sup)


async def keep_run_files(cache: TaskSetupCache, slot_id: str, cp: CheckpointRecord) -> None:
    await cache.keep_run_files(slot_id, Path(cp.dir))


async def reap_over_cap(sup: TaskCheckpointsHost) -> list[str]:
    """Least recently used task checkpoints past task_checkpoints.max_mib are deleted."""
    doomed = task_checkpoints_over_cap(
        list(sup.checkpoints.values()),
        referenced_checkpoints(sup),
        sup.config.task_checkpoints.max_mib,
    )
    for cp, reason in doomed:
        await delete_checkpoint_record(sup, cp, reason)
    return [cp.id for cp, _ in doomed]
