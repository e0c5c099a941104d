"""Spares and warm uppers: frozen restores of a checkpoint kept ready for the next claim (refilled
one restore at a time, recycled when old or above target), and a slot's next filesystem prepared
ahead of its reset."""

from __future__ import annotations

import time

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotLimits
from drumsd.linux import procfs, slot_fs
from drumsd.linux.process_trees import kill_pending
from drumsd.runtime.linux.base import SPARE_PASS_S, RuntimeBase, _Instance, _log, _Prepared


class SparesMixin(RuntimeBase):
    # ------------------------------------------------------------------ warm uppers

    def _after_restore(self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        if self.config.warm_upper and slot_id not in self._warm and self._nursery is not None:
            self._nursery.start_soon(self._make_warm, slot_id, checkpoint, limits)

    async def _make_warm(self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        iid = self._busy_iid(f"warm-{slot_id}")
        index = self._alloc_range()
        try:
            with trio.CancelScope(shield=True):
                paths = await trio.to_thread.run_sync(
                    self._prepare_fs,
                    iid,
                    f"warm:{slot_id}",
                    checkpoint.dir / "upper",
                    (checkpoint.lower,),
                    limits.tmpfs_mib,
                    index,
                )
        except OSError as exc:
            if index is not None:
                self._free_range(index)
            _log("warm_upper_failed", slot=slot_id, error=exc)
            return
        if slot_id in self._slots and slot_id not in self._warm:
            self._warm[slot_id] = _Prepared(iid, paths, checkpoint.id, index)
        else:
            await trio.to_thread.run_sync(self._teardown_fs, paths)

    async def _drop_warm(self, slot_id: str) -> None:
        prep = self._warm.pop(slot_id, None)
        if prep is not None:
            await self._off_loop(self._teardown_fs, prep.paths)

    # ------------------------------------------------------------------ warm spares

    def enable_spares(self, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        """Keep `spares_per_checkpoint` frozen restores of `checkpoint` ready for claims."""
        if self.config.spares_per_checkpoint <= 0:
            return
        self._spare_refs[checkpoint.id] = (checkpoint, limits)
        self._spare_wakeup.set()

    def set_spare_target(self, checkpoint_id: str, n: int) -> None:
        """How many spares `checkpoint_id` should keep (at most spares_per_checkpoint); extra
        spares are disposed of on the next pass of the refiller."""
        if self._spare_targets.get(checkpoint_id) != n:
            self._spare_targets[checkpoint_id] = n
            self._spare_wakeup.set()

    def _spare_target(self, checkpoint_id: str) -> int:
        wanted = self._spare_targets.get(checkpoint_id, self.config.spares_per_checkpoint)
        return max(0, min(wanted, self.config.spares_per_checkpoint))

    async def drop_spares(self, checkpoint_id: str) -> None:
        """A checkpoint deleted or replaced: its spares go."""
        self._spare_refs.pop(checkpoint_id, None)
        self._spare_targets.pop(checkpoint_id, None)
        for inst in self._spares.pop(checkpoint_id, []):
            await self._dispose(inst, background=False)

    async def forget_checkpoint(self, checkpoint_id: str) -> None:
        """A checkpoint was deleted or replaced: drop its spares and its image copies on the
        runtime's tmpfs (they would otherwise hold its memory image in RAM)."""
        await self.drop_spares(checkpoint_id)
        for key in [k for k in self._image_cache if k.rsplit("-", 2)[0] == checkpoint_id]:
            path = self._image_cache.pop(key)
            await trio.to_thread.run_sync(slot_fs.remove_image_copies, path)

    def spare_counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._spares.items()}

    async def _claim_spare(
        self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> _Instance | None:
        ref = self._spare_refs.get(checkpoint.id)
        if ref is None or ref[0].dir != checkpoint.dir or ref[1] != limits:
            return None
        pool = self._spares.get(checkpoint.id) or []
        while pool:
            inst = pool.pop(0)
            self._spare_wakeup.set()
            if (
                inst.exited.is_set()
                or not procfs.is_same_process(inst.pid, inst.starttime)
                or kill_pending(inst.pid)
            ):
                await self._dispose(inst, background=True)
                continue
            t0 = time.monotonic()
            # Where a claim's time goes (the spare p99): parked age, whether a refill restore
            # was running beside it, and each step.
            inst.phases.update(
                parked_s=round(t0 - inst.born, 3), refill_running=float(self._refill_running)
            )
            # Inline, not in a worker thread: a small file on the state tmpfs takes microseconds,
            # while the hop to a thread (and back, for the GIL, beside the old tree's teardown
            # thread) took 15 ms p50 and up to 180 ms on a loaded host: most of a claim's time.
            slot_fs.write_owner(inst.paths, f"slot:{slot_id}")
            t1 = time.monotonic()
            self.driver.thaw(inst.cgroups)
            inst.frozen = False
            t2 = time.monotonic()
            try:
                await self._wait_agent(inst, self.config.agent_ready_timeout_s)
            except RuntimeError_:
                await self._dispose(inst, background=True)
                continue
            inst.phases.update(
                claim_owner=round(t1 - t0, 4),
                claim_thaw=round(t2 - t1, 4),
                claim_agent=round(time.monotonic() - t2, 4),
            )
            if not procfs.is_same_process(inst.pid, inst.starttime):
                # Killed while parked: the agent can still answer while the pid namespace
                # is being torn down after its init died.
                await self._dispose(inst, background=True)
                continue
            inst.restore_s = time.monotonic() - t0
            self.stats["spare_hits"] += 1
            return inst
        self.stats["spare_misses"] += 1
        return None

    async def _serve_spares(self) -> None:
        """Refill pools one restore at a time (never more than one restore slot taken from live
        work), recycle spares older than spare_max_age_s."""
        while True:
            self._spare_wakeup = trio.Event()
            while True:
                need = self._next_spare_need()
                if need is None:
                    break
                ref, limits = need
                self._refill_running = True
                try:
                    inst = await self._restore_instance(f"spare:{ref.id}", ref, limits, freeze=True)
                except RuntimeError_ as exc:
                    _log("spare_refill_failed", checkpoint=ref.id, error=exc.message)
                    await trio.sleep(1.0)
                    continue
                finally:
                    self._refill_running = False
                if ref.id in self._spare_refs:
                    self._spares.setdefault(ref.id, []).append(inst)
                else:
                    await self._dispose(inst, background=True)
            # Wake at least every few seconds even when idle: old spares must be recycled and
            # a refill refused by admission retried without anyone claiming.
            with trio.move_on_after(min(SPARE_PASS_S, max(1.0, self.config.spare_max_age_s / 4))):
                await self._spare_wakeup.wait()
            await self._recycle_old_spares()

    def _next_spare_need(self) -> tuple[CheckpointRef, SlotLimits] | None:
        total = sum(len(v) for v in self._spares.values())
        if total >= self.config.spares_per_host or not self.refill_allowed():
            return None
        for cid, (ref, limits) in self._spare_refs.items():
            if len(self._spares.get(cid, [])) < self._spare_target(cid):
                return ref, limits
        return None

    async def _recycle_old_spares(self) -> None:
        now = time.monotonic()
        for cid, pool in list(self._spares.items()):
            old = [i for i in pool if now - i.born > self.config.spare_max_age_s]
            # Above target (the claim rate fell): the oldest extras go, they are not renewed.
            extra = len(pool) - len(old) - self._spare_target(cid)
            if extra > 0:
                old += [i for i in pool if all(i is not o for o in old)][:extra]
            for inst in old:
                pool.remove(inst)
                await self._dispose(inst, background=True)
            if old:
                self._spare_wakeup.set()
