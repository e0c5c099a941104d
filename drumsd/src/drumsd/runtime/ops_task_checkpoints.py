"""Task checkpoints: which one an episode of a task restores instead of replaying its setup,
capturing one after a task's first setup, loading a cached episode, reaping them past their cap.

A create or reset on a task asks `plan_setup` first: the key of the task's setup on its source
checkpoint (core/task_checkpoints.py) and the ready task checkpoint under that key, if any. With
one, the slot restores it (rec.checkpoint is the task checkpoint, so the state_hash gate judges
the episode against it) and `load_cached` carries the setup's host-side files; without, the
setup replays on the source and `capture_after_setup` dumps the result for the next episode.

A new task checkpoint serves episodes only after `watch_held_processes` has watched its source
slot for the alive_after_resume gate's window (core `held_watch_s`): a process it holds that
exits there by itself would exit in every episode restored from it, so it is dropped instead.
An episode of the task that arrives meanwhile waits for that verdict (seconds), then restores
the checkpoint or replays the setup.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core.errors import DrumsdError
from drumsd.core.leases import checkpoint_lease
from drumsd.core.records import CheckpointKind, CheckpointRecord, SlotRecord, SlotStatus
from drumsd.core.seams import SlotFacts, SlotHandle
from drumsd.core.task_checkpoints import (
    SetupFingerprint,
    find_task_checkpoint,
    held_watch_s,
    judge_held_processes,
    source_identity,
    task_checkpoint_key,
    task_checkpoints_over_cap,
)
from drumsd.runtime.episodes import (
    JUDGE_READ_TIMEOUT_S,
    EpisodesHost,
    episode_record,
    natural_exits,
    read_facts,
)
from drumsd.runtime.handles import handle_of
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


class TaskCheckpointsHost(ForkHost, EpisodesHost, Protocol):
    """What task checkpoints use of the supervisor."""

    @property
    def admission_book(self) -> AdmissionBook: ...
    @property
    def pools(self) -> SparePools: ...
    @property
    def task_capture_refused(self) -> dict[str, float]: ...
    @property
    def task_checkpoint_watches(self) -> dict[str, HeldWatch]: ...
    @property
    def tasks(self) -> TaskCatalog: ...


@dataclass(frozen=True)
class HeldWatch:
    """A new task checkpoint's watch (`watch_held_processes`): its source slot, and `done` set
    once the checkpoint is ready or dropped."""

    slot_id: str
    done: trio.Event = field(default_factory=trio.Event)


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
    watch = sup.task_checkpoint_watches.get(key)
    if watch is not None:
        # Its checkpoint was just captured and is being watched: wait for the verdict (at most
        # the watch and its read), then restore it if it was kept, else replay.
        with trio.move_on_after(watch_bound_s(sup)):
            await watch.done.wait()
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
    if plan.key in sup.task_checkpoint_watches:
        return  # another slot's capture is being watched
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
                ready=False,  # made ready once its source was watched
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
    cp.task_source = plan.source.id
    sup.table.save_checkpoint(cp, "task checkpoint")
    watch = HeldWatch(rec.id)
    sup.task_checkpoint_watches[plan.key] = watch
    window = held_watch_s(sup.config.alive_after_s)
    log.info(
        "slot=%s task=%s task checkpoint %s captured; it serves episodes once its source has "
        "been watched for %g s",
        rec.id,
        rec.task_id,
        cp.id,
        window,
    )
    sup.spawn(
        watch_held_processes,
        sup,
        rec.id,
        rec.episode_id,
        cp,
        plan.key,
        rec.actions,
        natural_exits(sup, rec),
        watch,
    )


async def wait_watched(sup: TaskCheckpointsHost, checkpoint_id: str | None) -> None:
    """A create naming a task checkpoint still under watch (`from_state`) waits for its verdict:
    then it restores the checkpoint, or is told it is gone."""
    cp = sup.checkpoints.get(checkpoint_id or "")
    if cp is None or cp.kind is not CheckpointKind.task or cp.ready or cp.task_key is None:
        return
    watch = sup.task_checkpoint_watches.get(cp.task_key)
    if watch is not None:
        with trio.move_on_after(watch_bound_s(sup)):
            await watch.done.wait()


async def wait_source_watch(sup: TaskCheckpointsHost, slot_id: str) -> None:
    """A verify of a slot whose new task checkpoint is being watched waits for the verdict
    first, as it waits for alive_after_resume: its postconfig and checker may end processes the
    checkpoint holds (OSWorld's GIMP tasks quit GIMP), which the watch would take for processes
    exiting by themselves (seen live on gimp_theme before this wait: sh, gimp and script-fu
    'exited' 2 s after a capture whose episode verified at once)."""
    for watch in [w for w in sup.task_checkpoint_watches.values() if w.slot_id == slot_id]:
        with trio.move_on_after(watch_bound_s(sup)):
            await watch.done.wait()


def watch_bound_s(sup: TaskCheckpointsHost) -> float:
    """The longest a watch takes: its window, then its read of the source (a wait while the
    source is busy, then the read), each bounded by the judge's read timeout."""
    return held_watch_s(sup.config.alive_after_s) + 2 * JUDGE_READ_TIMEOUT_S + 1.0


async def watch_held_processes(
    sup: TaskCheckpointsHost,
    slot_id: str,
    episode_id: str,
    cp: CheckpointRecord,
    key: str,
    actions: int,
    exits: list[str],
    watch: HeldWatch,
) -> None:
    """Watch a new task checkpoint's source slot for core `held_watch_s`, then make the
    checkpoint ready, or drop it when a process it holds exited there (or the source was gone
    before the window ended). The tree as the dump left it running is read first, as an
    episode's start reads it (here, beside the source's episode: its create does not wait for
    the read). `actions` is the source's step count at the dump. Episodes waiting on `watch` go
    on either way."""
    try:
        facts = await read_source(sup, slot_id, episode_id)
        baseline = held_baseline(facts)
        if baseline is not None:
            await trio.sleep(held_watch_s(sup.config.alive_after_s))
            facts = await read_source(sup, slot_id, episode_id)
        if sup.checkpoints.get(cp.id) is not cp:
            return  # deleted meanwhile (by hand, or the daemon stopping)
        source = episode_record(sup, slot_id, episode_id)
        acted = source.actions - actions if source is not None else 0
        verdict = judge_held_processes(baseline or {}, facts, exits, actions=acted)
        if verdict.keep:
            sup.task_capture_refused.pop(key, None)
            cp.ready = True
            sup.table.save_checkpoint(cp, "ready")
            log.info(
                "slot=%s task=%s task checkpoint %s ready: %s",
                slot_id,
                cp.task_id,
                cp.id,
                verdict.reason,
            )
            await reap_over_cap(sup)
            return
        if verdict.retry_later:
            sup.task_capture_refused[key] = trio.current_time()
        again = f"after {CAPTURE_RETRY_S:g} s" if verdict.retry_later else "at the next episode"
        log.warning(
            "slot=%s task=%s task checkpoint %s dropped (episodes replay the setup; captured "
            "again %s): %s",
            slot_id,
            cp.task_id,
            cp.id,
            again,
            verdict.reason,
        )
        await delete_checkpoint_record(
            sup, cp, f"dropped after its source was watched: {verdict.reason}"
        )
    finally:
        if sup.task_checkpoint_watches.get(key) is watch:
            del sup.task_checkpoint_watches[key]
        watch.done.set()


def held_baseline(facts: SlotFacts | None) -> dict[str, Any] | None:
    """The tree right after the dump as alive_after_resume's baseline (begin_episode's form:
    only the processes whose names were read), or None when it could not be read."""
    names = facts.extra.get("proc_names") if facts is not None else None
    if facts is None or not isinstance(names, dict):
        return None
    return {
        "pids": [p for p in facts.pids if str(p) in names],
        "proc_names": names,
        "guest_workers": facts.extra.get("guest_workers", []),
    }


async def read_source(sup: TaskCheckpointsHost, slot_id: str, episode_id: str) -> SlotFacts | None:
    """The source slot's facts while `episode_id` is still its episode (waiting while it is busy,
    e.g. a fork's dump), or None: replaced, destroyed, failed, or not read in time."""
    with trio.move_on_after(JUDGE_READ_TIMEOUT_S):
        while (rec := episode_record(sup, slot_id, episode_id)) and rec.status is SlotStatus.busy:  # noqa: ASYNC110
            await trio.sleep(0.2)
    rec = episode_record(sup, slot_id, episode_id)
    if rec is None or rec.handle is None:
        return None
    if rec.status not in (SlotStatus.ready, SlotStatus.quarantined):
        return None
    facts = None
    with trio.move_on_after(JUDGE_READ_TIMEOUT_S):
        facts = await read_facts(sup, rec, handle_of(rec))
    if episode_record(sup, slot_id, episode_id) is not rec:
        return None  # its tree was replaced while it was read
    return facts


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
