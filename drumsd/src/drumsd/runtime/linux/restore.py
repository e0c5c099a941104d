"""The restore queue: a CRIU restore of a checkpoint into a fresh instance (its images on tmpfs,
mapped to the instance's uid range; retried when nothing restored ran yet, unless a kernel limit
stopped it), at most max_concurrent_restores at once."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import trio

from drumsd.core import host_limits as core_limits
from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotLimits
from drumsd.linux import (
    cgroups,
    checkpoint_files,
    criu,
    host_limits,
    procfs,
    procview,
    slot_fs,
    write_track,
)
from drumsd.linux.exec_helper import helper_argv, lo_up_script
from drumsd.linux.process_trees import (
    cpu_seconds,
    init_log_size,
    restore_evidence,
    restore_outcome,
)
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, Prepared, log_event
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.images import ImageCache
from drumsd.runtime.linux.supervision import Supervision


class Restorer:
    def __init__(
        self,
        config: LinuxRuntimeConfig,
        sup: Supervision,
        fs: InstanceFs,
        images: ImageCache,
        stats: dict[str, int],
    ) -> None:
        self.config = config
        self.sup = sup
        self.driver = sup.driver
        self.fs = fs
        self.images = images
        self.stats = stats
        self.limiter = trio.CapacityLimiter(config.max_concurrent_restores)
        view = config.procview_dir
        self._procview = procview.restore_externals(view) if view is not None else None

    async def restore(
        self,
        owner: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        prepared: Prepared | None = None,
        freeze: bool = False,
    ) -> Instance:
        """Restore one tree (into `prepared` when it is of this checkpoint). Retries failures
        that happened before any restored task ran."""
        self.sup.running()
        last_error = ""
        for attempt in range(1, self.config.max_attempts + 1):
            inst = await self._new_instance(owner, checkpoint, limits, prepared, attempt)
            prepared = None
            ok = False
            try:
                t_images = time.monotonic()
                images = await self.images.images_for(checkpoint, inst.uid_index)
                inst.phases["images"] = round(time.monotonic() - t_images, 4)
                ok = await self._restore_once(inst, images, limits, freeze=freeze)
            finally:
                if not ok:
                    await self.sup.discard(inst)
            if ok:
                self.stats["restores"] += 1
                return inst
            last_error = inst.error
            self.stats["restore_retries"] += 1
            log_event("restore_retry", owner=owner, iid=inst.iid, attempt=attempt, error=last_error)
        raise RuntimeError_(
            "restore_failed",
            f"restore of checkpoint {checkpoint.id} for {owner} failed {self.config.max_attempts}"
            f" times; last error: {last_error}. Check the CRIU log and `drumsd doctor`",
            checkpoint=checkpoint.id,
        )

    async def _new_instance(
        self,
        owner: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        prepared: Prepared | None,
        attempt: int,
    ) -> Instance:
        """An instance record on `prepared` (a warm upper of this checkpoint) or a fresh fs."""
        t_fs = time.monotonic()
        lower = (checkpoint.lower,)
        if prepared is not None and prepared.checkpoint_id == checkpoint.id:
            iid, paths, index = prepared.iid, prepared.paths, prepared.uid_index
            await trio.to_thread.run_sync(slot_fs.write_owner, paths, owner)
        else:
            if prepared is not None:
                await trio.to_thread.run_sync(self.fs.teardown, prepared.paths)
            iid = self.fs.new_iid(owner.replace(":", "-"))
            paths, index = await self.fs.make(
                iid, owner, checkpoint.dir / "upper", lower, limits.tmpfs_mib
            )
        inst = Instance(
            iid,
            paths,
            {},
            checkpoint.id,
            lower,
            attempts=attempt,
            image_sha256=checkpoint.image_sha256,
            uid_index=index,
        )
        inst.phases["fs"] = round(time.monotonic() - t_fs, 4)
        return inst

    async def _restore_once(
        self, inst: Instance, images: Path, limits: SlotLimits, *, freeze: bool
    ) -> bool:
        _, launcher = self.sup.running()
        inst.cgroups = await trio.to_thread.run_sync(self.driver.create, inst.iid, limits)
        if self.config.restore_cpu_boost:
            self.driver.set_cpu(inst.cgroups, None)
        if self.config.restore_cpu_weight is not None:
            self.driver.set_shares(inst.cgroups, self.config.restore_cpu_weight)
        work = inst.paths.rw / "criu"
        track = self.config.track_writes and await trio.to_thread.run_sync(self._tracks, images)
        argv = helper_argv(
            self.fs.helper,
            self.driver.procs_files(inst.cgroups),
            self.config.ksm,
            criu.restore_argv(
                self.config.criu,
                images,
                work,
                inst.paths.root,
                work / "pid",
                externals=self._procview,
                leave_stopped=track,
                log_level=self.config.criu_log_level,
                lo_up_script=lo_up_script(self.fs.helper) if self.config.netns_fast else None,
            ),
        )
        t0 = time.monotonic()
        init_log_from = init_log_size(inst.paths)  # a stat on the slot's tmpfs: microseconds
        async with self.limiter:
            t_criu = time.monotonic()
            inst.restore_started_at = time.time()  # after the upper copy (see split_written_since)
            done = await launcher.run(
                argv, work / "criu.out", timeout_s=self.config.restore_timeout_s
            )
        inst.phases["queue"] = round(t_criu - t0, 4)
        inst.phases["criu"] = round(time.monotonic() - t_criu, 4)
        inst.phases["criu_cpu"] = round(done.cpu_s, 4)
        outcome = await trio.to_thread.run_sync(
            restore_outcome, work, done.returncode == 0, inst.paths
        )
        if outcome.pid is None:
            inst.error = (
                f"criu restore timed out after {self.config.restore_timeout_s} s"
                if done.timed_out
                else f"criu exit {done.returncode}: {outcome.log_errors or outcome.out_tail}"
            )
            if outcome.limit is not None:
                raise self._limit_error(inst, outcome.limit)
            return False
        inst.pid, inst.pidfd, inst.starttime = outcome.pid, outcome.pidfd, outcome.starttime
        if track:
            await self._arm(inst)
        try:
            await self._start(inst, limits, freeze)
        except RuntimeError_ as exc:
            # The slot's files go with the discard: keep what they say in the error (the
            # forgotten records of a fork's children carry it too).
            evidence = await trio.to_thread.run_sync(restore_evidence, inst.paths, init_log_from)
            raise RuntimeError_(exc.code, f"{exc.message}; {evidence}", **exc.detail) from exc
        inst.restore_s = time.monotonic() - t0
        inst.phases["agent"] = round(inst.restore_s - inst.phases["queue"] - inst.phases["criu"], 4)
        # The restorer runs in the restored tasks: their CPU so far is the rest of the cost.
        ticks = sum(t for _, _, t in procfs.activity(self.driver.pids(inst.cgroups)))
        inst.phases["restore_cpu"] = round(done.cpu_s + cpu_seconds(ticks), 4)
        self.sup.watch(inst)
        return True

    def _tracks(self, images: Path) -> bool:
        """Whether this restore, with linux.track_writes on, leaves the tree stopped for `_arm`:
        drums' CRIU, and no task dumped stopped (resuming the tree would resume it too). A
        spare is armed too (it is armed before it runs at all, then frozen): arming costs a
        restore ~10 ms of CPU for an office desktop's ten processes."""
        if not write_track.criu_tracks_writes(self.config.criu):
            return False
        return not checkpoint_files.holds_stopped_task(images)

    async def _arm(self, inst: Instance) -> None:
        """The tree CRIU left stopped armed for write tracking, then resumed (whatever the
        arming did: a process it missed only makes its pages count as written)."""
        pids = await trio.to_thread.run_sync(self.driver.pids, inst.cgroups)
        try:
            armed = await trio.to_thread.run_sync(
                write_track.arm_tree, inst.checkpoint_id, pids, abandon_on_cancel=False
            )
            inst.write_track = armed
            inst.phases["arm"] = round(armed.took_s, 4)
            if armed.failed:
                log_event("arm_partial", iid=inst.iid, **armed.as_meta())
        finally:
            await trio.to_thread.run_sync(write_track.resume, pids)

    @staticmethod
    def _limit_error(inst: Instance, hit: core_limits.LimitHit) -> RuntimeError_:
        """A kernel limit reached: every retry would hit it too, so the restore fails at once
        with the limit named (restore() discards the instance on the way out)."""
        log_event("restore_limit", iid=inst.iid, limit=hit.name, error=hit.line)
        what = f"restoring checkpoint {inst.checkpoint_id} (instance {inst.iid})"
        return RuntimeError_(
            "restore_failed",
            core_limits.limit_message(hit, host_limits.current(hit.name), what),
            checkpoint=inst.checkpoint_id,
            limit=hit.name,
        )

    async def _start(self, inst: Instance, limits: SlotLimits, freeze: bool) -> None:
        """The restored tree frozen (a spare) or its agent answering, on its own CPU quota and
        weight."""
        if freeze:
            await trio.to_thread.run_sync(self.driver.freeze, inst.cgroups)
            inst.frozen = True
            self._end_boost(inst, limits)
            return
        try:
            await self.sup.wait_agent(inst, self.config.agent_ready_timeout_s)
        finally:
            if inst.pidfd >= 0:
                with contextlib.suppress(cgroups.CgroupError):
                    self._end_boost(inst, limits)

    def _end_boost(self, inst: Instance, limits: SlotLimits) -> None:
        if self.config.restore_cpu_boost:
            self.driver.set_cpu(inst.cgroups, limits.vcpus)
        if self.config.restore_cpu_weight is not None:
            self.driver.set_shares(inst.cgroups, None)

    @staticmethod
    async def check_lower(checkpoint: CheckpointRef) -> None:
        if not await trio.to_thread.run_sync(slot_fs.is_dir, checkpoint.lower):
            raise RuntimeError_(
                "restore_failed",
                f"checkpoint {checkpoint.id}: lower layer "
                f"{checkpoint.lower} is missing; rebuild the image",
            )
