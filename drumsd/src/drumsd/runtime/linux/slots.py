"""The `SlotRuntime` calls that give a slot an instance or take it away: restore (a warm spare's
thaw or a CRIU restore), reset (the instance swapped, the old one torn down in the background),
destroy, and fork (N restores of one checkpoint side by side)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotHandle, SlotLimits
from drumsd.linux import idmap, procfs
from drumsd.runtime.linux.adoption import Adoption
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, log_event
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.restore import Restorer
from drumsd.runtime.linux.spares import Spares
from drumsd.runtime.linux.supervision import Supervision


class Slots:
    def __init__(
        self,
        config: LinuxRuntimeConfig,
        sup: Supervision,
        table: InstanceTable,
        restorer: Restorer,
        spares: Spares,
        adoption: Adoption,
        before_fork: Callable[[], None] = lambda: None,
        after_fork: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.sup = sup
        self.table = table
        self.restorer = restorer
        self.spares = spares
        self.adoption = adoption
        # Called as a fork's restores start and once its children all answer (the runtime's
        # KSM scan boost: the scan rate up from the first restored page, ksmd's priority up
        # only after the last, so the merging does not slow the restores).
        self.before_fork = before_fork
        self.after_fork = after_fork

    async def restore(
        self,
        slot_id: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        warm_upper: bool = True,
    ) -> SlotHandle:
        await self.restorer.check_lower(checkpoint)
        if slot_id in self.table:
            raise RuntimeError_(
                "invalid_request", f"slot {slot_id} already exists; reset or destroy it first"
            )
        inst = await self.spares.claim(slot_id, checkpoint, limits)
        spare = inst is not None
        if inst is None:
            inst = await self.restorer.restore(f"slot:{slot_id}", checkpoint, limits)
        self._serve(slot_id, inst, checkpoint, limits, warm_upper=warm_upper)
        log_event(
            "restored",
            slot=slot_id,
            iid=inst.iid,
            pid=inst.pid,
            spare=spare,
            restore_s=f"{inst.restore_s:.3f}",
            attempts=inst.attempts,
        )
        return self.handle(slot_id, inst, spare)

    async def reset(
        self, handle: SlotHandle, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        await self.restorer.check_lower(checkpoint)
        slot_id = handle.slot_id
        old = self.table.release(slot_id)
        try:
            # A warm spare is claimed before the old tree is killed: killing a desktop (its
            # exit_mmap, the teardown thread) beside the thaw was the rest of a claim's tail.
            inst = await self.spares.claim(slot_id, checkpoint, limits)
            spare = inst is not None
            if old is not None:
                await self.sup.dispose(old, background=self.config.async_kill or spare)
                old = None
            if inst is None:
                prepared = self.table.take_warm(slot_id)
                inst = await self.restorer.restore(
                    f"slot:{slot_id}", checkpoint, limits, prepared=prepared
                )
        except BaseException:
            with self.sup.cleanup_scope():
                if old is not None:
                    await self.sup.dispose(old, background=False)
                await self.spares.drop_warm(slot_id)
            raise
        self._serve(slot_id, inst, checkpoint, limits)
        log_event(
            "reset",
            slot=slot_id,
            iid=inst.iid,
            pid=inst.pid,
            spare=spare,
            restore_s=f"{inst.restore_s:.3f}",
        )
        return self.handle(slot_id, inst, spare)

    def _serve(
        self,
        slot_id: str,
        inst: Instance,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        warm_upper: bool = True,
    ) -> None:
        """The slot's instance is `inst`; its next fs is prepared ahead unless the caller said
        there is no next restore (`warm_upper=False`)."""
        self.table.serve(slot_id, inst)
        if warm_upper:
            self.spares.after_restore(slot_id, checkpoint, limits)

    async def destroy(self, slot_id: str) -> None:
        """Tear the slot down within teardown_timeout_s (shielded from the caller's cancel, but
        bounded: a step that overruns is left to finish in its thread)."""
        with self.sup.cleanup_scope() as scope:
            inst = self.table.release(slot_id)
            if inst is not None:
                await self.sup.dispose(inst, background=False)
            await self.spares.drop_warm(slot_id)
            # Leftovers of this slot from a previous daemon (not in memory).
            owners = {f"slot:{slot_id}", f"warm:{slot_id}"}
            await self.sup.off_loop(self.adoption.sweep_owned_by, owners)
        if scope.cancelled_caught:
            log_event("destroy_overran", slot=slot_id, timeout_s=self.config.teardown_timeout_s)

    async def fork(
        self,
        handle: SlotHandle,
        source: CheckpointRef,
        child_ids: Sequence[str],
        limits: SlotLimits,
    ) -> list[SlotHandle]:
        self.table.of(handle)
        results: dict[str, SlotHandle] = {}
        if len(child_ids) > 1:
            self.before_fork()

        async def one(cid: str) -> None:
            results[cid] = await self.restore(cid, source, limits)

        try:
            async with trio.open_nursery() as nursery:
                for cid in child_ids:
                    nursery.start_soon(one, cid)
        except BaseException as exc:
            with self.sup.cleanup_scope():
                for done_id in results:
                    await self.destroy(done_id)
            failure = one_failure(exc)
            if failure is exc:
                raise
            raise failure from exc
        if len(child_ids) > 1:
            self.after_fork()
        return [results[c] for c in child_ids]

    def handle(self, slot_id: str, inst: Instance, spare: bool = False) -> SlotHandle:
        """What the control plane keeps of the slot's instance (journaled: adopt reads it)."""
        return SlotHandle(
            slot_id=slot_id,
            init_pid=inst.pid,
            init_starttime=inst.starttime,
            root=inst.paths.root,
            upper=inst.paths.upper,
            checkpoint_id=inst.checkpoint_id,
            cgroups=dict(inst.cgroups),
            namespaces=procfs.namespaces(inst.pid),
            restore_s=inst.restore_s,
            attempts=inst.attempts,
            extra={
                "iid": inst.iid,
                "lower": [str(p) for p in inst.lower],
                "spare": spare,
                "cgroup_version": self.sup.driver.version,
                "profile": self.config.profile,
                "image_sha256": inst.image_sha256,
                "phases": dict(inst.phases),
                "restore_started_at": inst.restore_started_at or None,
                "uid_index": inst.uid_index,
                "uid_base": None if inst.uid_index is None else idmap.uid_base(inst.uid_index),
            },
        )


def one_failure(exc: BaseException) -> BaseException:
    """The children's restores fail in a nursery, as a group: when only RuntimeError_s are in it,
    the one to answer with (a kernel limit first, it names what to raise), so the API maps its
    code instead of seeing an unexpected group. Anything else (a cancel) goes up unchanged."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    matched, rest = exc.split(RuntimeError_)
    if matched is None or rest is not None:
        return exc
    leaves = list(_leaves(matched))
    return next((e for e in leaves if "limit" in e.detail), leaves[0])


def _leaves(group: BaseExceptionGroup) -> Iterator[RuntimeError_]:
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            yield from _leaves(e)
        elif isinstance(e, RuntimeError_):
            yield e
