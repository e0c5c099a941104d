"""Spares and warm uppers: frozen restores of a checkpoint kept ready for the next claim (refilled
one restore at a time, recycled when old or above target), and a slot's next filesystem prepared
ahead of its reset. The bookkeeping is `SparePool`'s; this module does the I/O."""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotLimits
from drumsd.linux import procfs, slot_fs
from drumsd.linux.process_trees import kill_pending
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, Prepared, log_event
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.restore import Restorer
from drumsd.runtime.linux.spare_pool import SparePool
from drumsd.runtime.linux.supervision import Supervision

SPARE_PASS_S = 5.0  # the refiller's idle period: recycling and refused refills are retried


class Spares:
    def __init__(
        self,
        config: LinuxRuntimeConfig,
        sup: Supervision,
        fs: InstanceFs,
        table: InstanceTable,
        restorer: Restorer,
        stats: dict[str, int],
    ) -> None:
        self.config = config
        self.sup = sup
        self.fs = fs
        self.table = table
        self.restorer = restorer
        self.stats = stats
        self.pool = SparePool(config.spares_per_checkpoint, config.spares_per_host)
        # Set by the control plane (services/spares.py): whether admission control lets
        # refills start right now.
        self.refill_allowed: Callable[[], bool] = lambda: True
        # Refills do not boost KSM's scan (forks do): under a stream of episodes, whose claims
        # refill back to back, the boost kept ksmd at the boost rate and nice -20 most of the
        # time: 0.31 CPU-s of ksmd per 20 steps at the median (0.05-1.20) against 0.01 without,
        # more than the steps' own 0.2 (README, "Where a step's CPU goes").

    # ------------------------------------------------------------------ warm uppers

    def after_restore(self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        """A slot (re)started: prepare its next fs in the background (warm_upper)."""
        if self.config.warm_upper and not self.table.has_warm(slot_id):
            self.sup.start_soon(self._make_warm, slot_id, checkpoint, limits)

    async def _make_warm(self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        iid = self.fs.new_iid(f"warm-{slot_id}")
        try:
            paths, index = await self.fs.make(
                iid,
                f"warm:{slot_id}",
                checkpoint.dir / "upper",
                (checkpoint.lower,),
                limits.tmpfs_mib,
            )
        except OSError as exc:
            log_event("warm_upper_failed", slot=slot_id, error=exc)
            return
        if not self.table.park_warm(slot_id, Prepared(iid, paths, checkpoint.id, index)):
            await trio.to_thread.run_sync(self.fs.teardown, paths)

    async def drop_warm(self, slot_id: str) -> None:
        prep = self.table.take_warm(slot_id)
        if prep is not None:
            await self.sup.off_loop(self.fs.teardown, prep.paths)

    # ------------------------------------------------------------------ claims

    async def drop(self, checkpoint_id: str) -> None:
        """A checkpoint deleted or replaced: its spares go."""
        for inst in self.pool.forget(checkpoint_id):
            await self.sup.dispose(inst, background=False)

    async def claim(
        self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> Instance | None:
        """A live spare of `checkpoint` thawed for `slot_id`, or None (a miss)."""
        if not self.pool.keeps(checkpoint, limits):
            return None
        while (inst := self.pool.take(checkpoint.id)) is not None:
            why = "its init exited while parked" if _dead(inst) else await self._thaw(inst, slot_id)
            if why is not None:
                # A parked desktop should not die: say which one and why, the claim goes on to
                # the next spare or a restore.
                log_event(
                    "spare_dead",
                    slot=slot_id,
                    iid=inst.iid,
                    checkpoint=checkpoint.id,
                    parked_s=round(time.monotonic() - inst.born, 1),
                    error=why,
                )
                await self.sup.dispose(inst, background=True)
                continue
            self.stats["spare_hits"] += 1
            return inst
        self.stats["spare_misses"] += 1
        return None

    async def _thaw(self, inst: Instance, slot_id: str) -> str | None:
        """Owner, thaw, agent: why the spare turned out dead, or None when it answers."""
        t0 = time.monotonic()
        # Where a claim's time goes (the spare p99): parked age, whether a refill restore was
        # running beside it, and each step.
        inst.phases.update(
            parked_s=round(t0 - inst.born, 3), refill_running=float(self.pool.refilling)
        )
        # Inline, not in a worker thread: a small file on the state tmpfs takes microseconds,
        # while the hop to a thread (and back, for the GIL, beside the old tree's teardown
        # thread) took 15 ms p50 and up to 180 ms on a loaded host: most of a claim's time.
        slot_fs.write_owner(inst.paths, f"slot:{slot_id}")
        t1 = time.monotonic()
        self.sup.driver.thaw(inst.cgroups)
        inst.frozen = False
        t2 = time.monotonic()
        try:
            await self.sup.wait_agent(inst, self.config.agent_ready_timeout_s)
        except RuntimeError_ as exc:
            return exc.message
        inst.phases.update(
            claim_owner=round(t1 - t0, 4),
            claim_thaw=round(t2 - t1, 4),
            claim_agent=round(time.monotonic() - t2, 4),
        )
        inst.restore_s = time.monotonic() - t0
        # Killed while parked: the agent can still answer while the pid namespace is being
        # torn down after its init died.
        if not procfs.is_same_process(inst.pid, inst.starttime):
            return "its init exited as it was thawed"
        return None

    # ------------------------------------------------------------------ refills

    async def serve(self) -> None:
        """Refill pools one restore at a time (never more than one restore slot taken from live
        work), recycle spares older than spare_max_age_s."""
        # Wake at least every few seconds even when idle: old spares must be recycled and a
        # refill refused by admission retried without anyone claiming.
        idle_s = min(SPARE_PASS_S, max(1.0, self.config.spare_max_age_s / 4))
        while True:
            while (
                need := self.pool.next_need(self.refill_allowed, trio.current_time())
            ) is not None:
                try:
                    await self._refill(*need)
                except Exception as exc:
                    # A refill is background work: whatever it hits (a checkpoint deleted
                    # mid-copy ended the whole daemon once) costs a spare, never the runtime.
                    log_event(
                        "spare_refill_crashed",
                        checkpoint=need[0].id,
                        error=f"{type(exc).__name__}: {exc}"[:500],
                        retry_in_s=self.pool.refill_failed(need[0].id, trio.current_time()),
                    )
            await self.pool.wait_wakeup(idle_s)
            for inst in self.pool.take_expired(time.monotonic(), self.config.spare_max_age_s):
                await self.sup.dispose(inst, background=True)

    async def _refill(self, ref: CheckpointRef, limits: SlotLimits) -> None:
        self.pool.refilling = True
        try:
            inst = await self.restorer.restore(f"spare:{ref.id}", ref, limits, freeze=True)
        except RuntimeError_ as exc:
            # Backing off: a refill that fails on a kernel limit or a broken checkpoint would
            # otherwise take a restore slot every second for as long as the daemon runs.
            log_event(
                "spare_refill_failed",
                checkpoint=ref.id,
                error=exc.message,
                retry_in_s=self.pool.refill_failed(ref.id, trio.current_time()),
            )
            return
        finally:
            self.pool.refilling = False
        self.pool.refill_done(ref.id)
        if not self.pool.park(ref.id, inst):
            await self.sup.dispose(inst, background=True)

    async def close(self) -> None:
        """Blocking teardowns of every spare and warm upper (the runtime stops)."""
        for inst in self.pool.take_all():
            await trio.to_thread.run_sync(self.sup.teardown, inst, self.sup.own_pidfd(inst))
        for prep in self.table.take_all_warm():
            await trio.to_thread.run_sync(self.fs.teardown, prep.paths)


def _dead(inst: Instance) -> bool:
    """A parked spare whose init exited, was replaced, or has a kill pending."""
    return (
        inst.exited.is_set()
        or not procfs.is_same_process(inst.pid, inst.starttime)
        or kill_pending(inst.pid)
    )
