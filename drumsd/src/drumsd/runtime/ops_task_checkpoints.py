"""Task checkpoints: which one an episode of a task restores instead of replaying its setup,
capturing one after a task's first setup, loading a cached episode, reaping them past their cap.

A create or reset on a task asks `plan_setup` first: the key of the task's setup on its source
checkpoint (core/task_checkpoints.py) and the ready task checkpoint under that key, if any. With
one, the slot restores it (rec.checkpoint is the task checkpoint, so the state_hash gate judges
the episode against it) and `load_cached` carries the setup's host-side files; without, the
setup replays on the source and `capture_after_setup` dumps the result for the next episode.

A new task checkpoint serves episodes only after `probe_task_checkpoint` has restored it into a
throwaway instance (a probe, never a user's slot) and watched that for the alive_after_resume
gate's window (core `held_watch_s`): a process it holds that exits there by itself would exit in
every episode restored from it, so it is dropped instead. The source slot's episode goes on
untouched and waits for nothing. An episode of the task that arrives meanwhile waits for the
verdict (seconds), then restores the checkpoint or replays the setup.
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
from drumsd.core.seams import RuntimeError_, SlotFacts, SlotHandle
from drumsd.core.task_checkpoints import (
    HeldVerdict,
    SetupFingerprint,
    find_task_checkpoint,
    held_watch_s,
    judge_held_processes,
    source_identity,
    task_checkpoint_key,
    task_checkpoints_over_cap,
)
from drumsd.runtime.episodes import (
    AFTER_RESTORE_TIMEOUT_S,
    JUDGE_READ_TIMEOUT_S,
    EpisodesHost,
    after_restore,
    natural_exits,
    read_facts,
)
from drumsd.runtime.handles import checkpoint_ref, slot_limits
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
    def task_checkpoint_probes(self) -> dict[str, trio.Event]: ...
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
    # Its checkpoint may just have been captured and be being proven: then restore it if it
    # was kept, else replay.
    await wait_verdict(sup, key)
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
    if plan.key in sup.task_checkpoint_probes:
        return  # another slot's capture is being proven
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
                ready=False,  # made ready once a probe of it passed
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
    probe = trio.Event()  # set once the checkpoint is ready or dropped
    sup.task_checkpoint_probes[plan.key] = probe
    log.info(
        "slot=%s task=%s task checkpoint %s captured; it serves episodes once a probe restored "
        "from it has run for %g s",
        rec.id,
        rec.task_id,
        cp.id,
        held_watch_s(sup.config.alive_after_s),
    )
    sup.spawn(probe_task_checkpoint, sup, cp, plan.key, rec.id, probe)


async def wait_probed(sup: TaskCheckpointsHost, checkpoint_id: str | None) -> None:
    """A create naming a task checkpoint still being proven (`from_state`) waits for its
    verdict: then it restores the checkpoint, or is told it is gone."""
    cp = sup.checkpoints.get(checkpoint_id or "")
    if cp is None or cp.kind is not CheckpointKind.task or cp.ready or cp.task_key is None:
        return
    await wait_verdict(sup, cp.task_key)


async def wait_verdict(sup: TaskCheckpointsHost, key: str) -> None:
    """Wait (at most `probe_bound_s`) for the verdict on the task checkpoint under `key` when one
    is being proven; at once otherwise."""
    probe = sup.task_checkpoint_probes.get(key)
    if probe is not None:
        with trio.move_on_after(probe_bound_s(sup)):
            await probe.wait()


# A probe waits this long for admission's room to restore (work admitted before it ending, a
# new sample); still none, the checkpoint is dropped and its key not captured again for
# CAPTURE_RETRY_S: a host at its limit would otherwise dump and probe again every episode.
PROBE_ROOM_WAIT_S = 5.0
# A probe's restore that takes longer than this (a host far too loaded) leaves the checkpoint
# unproven: dropped, and its key not captured again for CAPTURE_RETRY_S.
PROBE_RESTORE_TIMEOUT_S = 30.0


def probe_bound_s(sup: TaskCheckpointsHost) -> float:
    """The longest a probe takes: its wait for room, its restore, the image's after-restore
    command, its window, and its two reads, each bounded."""
    return (
        PROBE_ROOM_WAIT_S
        + PROBE_RESTORE_TIMEOUT_S
        + AFTER_RESTORE_TIMEOUT_S
        + held_watch_s(sup.config.alive_after_s)
        + 2 * JUDGE_READ_TIMEOUT_S
        + 1.0
    )


async def probe_task_checkpoint(
    sup: TaskCheckpointsHost, cp: CheckpointRecord, key: str, slot_id: str, probe: trio.Event
) -> None:
    """Prove new task checkpoint `cp` (captured from slot `slot_id`) on a restore of itself
    (`run_probe`), then make it ready, or drop it when a process it holds exited there by
    itself (or the probe could not restore or be read). Episodes waiting on `probe` go on
    either way."""
    try:
        verdict = await run_probe(sup, cp)
        if sup.checkpoints.get(cp.id) is not cp:
            return  # deleted meanwhile (by hand, or the daemon stopping)
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
        await delete_checkpoint_record(sup, cp, f"dropped by its probe: {verdict.reason}")
    finally:
        if sup.task_checkpoint_probes.get(key) is probe:
            del sup.task_checkpoint_probes[key]
        probe.set()


async def run_probe(sup: TaskCheckpointsHost, cp: CheckpointRecord) -> HeldVerdict:
    """Restore `cp` into a throwaway instance (admitted as a new desktop is, waiting up to
    PROBE_ROOM_WAIT_S for room; no slot record, no port, not in any listing, no warm upper),
    read its tree as an episode's start reads it (after the image's after-restore command), let
    it run for core `held_watch_s`, read it again with the gate's reader, and judge it with the
    gate's own judge. The instance is destroyed either way."""
    decision = await sup.admission_book.wait_for_room(
        sup.slot_cost_mib, PROBE_ROOM_WAIT_S, checkers=False
    )
    if not decision.admit:
        return HeldVerdict(
            False,
            f"no room to restore a probe of it within {PROBE_ROOM_WAIT_S:g} s: {decision.reason}",
            retry_later=True,
        )
    if sup.checkpoints.get(cp.id) is not cp:
        return HeldVerdict(False, "deleted while its probe waited for room")
    now = sup.clock()
    rec = SlotRecord(
        id=f"probe-{cp.id}",
        checkpoint=cp.id,
        image=cp.image,
        profile=cp.profile,
        created_at=now,
        last_used_at=now,
        episode_started_at=now,
    )
    try:
        handle = None
        with (
            sup.admission_book.reserve("task checkpoint probe", sup.slot_cost_mib()),
            trio.move_on_after(PROBE_RESTORE_TIMEOUT_S),
        ):
            try:
                # Destroyed within seconds: no next restore to prepare an upper for.
                handle = await sup.runtime.restore(
                    rec.id, checkpoint_ref(cp), slot_limits(sup.config), warm_upper=False
                )
            except RuntimeError_ as exc:
                return HeldVerdict(
                    False, f"a probe restore of it failed: {exc.message}", retry_later=True
                )
        if handle is None:  # a host far too loaded: capturing again at once would add to it
            return HeldVerdict(
                False,
                f"a probe restore of it took over {PROBE_RESTORE_TIMEOUT_S:g} s",
                retry_later=True,
            )
        await after_restore(sup, rec, handle)
        baseline = held_baseline(await read_probe(sup, rec, handle))
        if baseline is None:
            return HeldVerdict(False, "its probe's tree could not be read after its restore")
        await trio.sleep(held_watch_s(sup.config.alive_after_s))
        facts = await read_probe(sup, rec, handle)
        return judge_held_processes(baseline, facts, natural_exits(sup, rec))
    finally:
        with trio.CancelScope(shield=True):
            try:
                await sup.runtime.destroy(rec.id)
            except RuntimeError_ as exc:
                log.error("probe %s of checkpoint %s: destroy failed: %s", rec.id, cp.id, exc)
        sup.admission_book.forget(rec.id)


async def read_probe(
    sup: TaskCheckpointsHost, rec: SlotRecord, handle: SlotHandle
) -> SlotFacts | None:
    """The probe's facts as the gates read a slot's (None: not read in time, or failed)."""
    with trio.move_on_after(JUDGE_READ_TIMEOUT_S):
        return await read_facts(sup, rec, handle)
    return None


def held_baseline(facts: SlotFacts | None) -> dict[str, Any] | None:
    """The probe's tree right after its restore as alive_after_resume's baseline (begin_episode's
    form: only the processes whose names were read), or None when it could not be read."""
    names = facts.extra.get("proc_names") if facts is not None else None
    if facts is None or not isinstance(names, dict):
        return None
    return {
        "pids": [p for p in facts.pids if str(p) in names],
        "proc_names": names,
        "guest_workers": facts.extra.get("guest_workers", []),
    }


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
