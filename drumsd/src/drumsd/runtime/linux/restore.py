"""Instances and the restore queue: a CRIU restore of a checkpoint into a fresh instance (its
images on tmpfs, mapped to the slot's uid range; retried when nothing restored ran yet), and the
`SlotRuntime` calls that give a slot a new instance or take it away (restore, reset, destroy)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotHandle, SlotLimits
from drumsd.linux import cgroups, criu, procfs, slot_fs
from drumsd.linux.exec_helper import helper_argv
from drumsd.linux.process_trees import cpu_seconds, restore_outcome
from drumsd.runtime.linux.base import RuntimeBase, _Instance, _log, _Prepared


class RestoreMixin(RuntimeBase):
    # ------------------------------------------------------------------ images

    async def _images_for(self, checkpoint: CheckpointRef, uid_index: int | None) -> Path:
        """The checkpoint's images with the userns map of the target range (a dir of hard links
        and a rewritten userns image, made once per range next to the images)."""
        images, probe = await self._images_of(checkpoint)
        extents = self._id_map(uid_index)
        if probe.uid_map is None or probe.uid_map == tuple(extents):
            return images
        tag = "identity" if uid_index is None else str(uid_index)
        variant = images.parent / f".{images.name}-map-{tag}"
        if not slot_fs.exists(variant):
            async with self._image_lock:
                await trio.to_thread.run_sync(slot_fs.ensure_map_variant, images, variant, extents)
        return variant

    async def _images_of(self, checkpoint: CheckpointRef) -> tuple[Path, slot_fs.ImageProbe]:
        """CRIU images on tmpfs: used in place when already there, else copied once into the
        runtime's own tmpfs (a restore that reads disk is 3x slower)."""
        images = checkpoint.dir / "images"
        probe = await trio.to_thread.run_sync(slot_fs.probe_images, checkpoint.id, images)
        if not probe.present:
            raise RuntimeError_(
                "restore_failed",
                f"checkpoint {checkpoint.id}: no CRIU images at {images}; re-create the "
                "checkpoint (make_template or capture)",
            )
        if probe.on_tmpfs:
            return images, probe
        key = probe.cache_key
        async with self._image_lock:
            if key in self._image_cache:
                return self._image_cache[key], probe
            dest = await trio.to_thread.run_sync(
                slot_fs.cache_images,
                images,
                self.state_dir / "images",
                key,
                self.config.images_tmpfs_mib,
            )
            self._image_cache[key] = dest
            return dest, probe

    # ------------------------------------------------------------------ restore

    async def _restore_instance(
        self,
        owner: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        prepared: _Prepared | None = None,
        freeze: bool = False,
    ) -> _Instance:
        """Restore one tree. Retries failures that happened before any restored task ran."""
        self._require_running()
        lower = (checkpoint.lower,)
        last_error = ""
        for attempt in range(1, self.config.max_attempts + 1):
            t_fs = time.monotonic()
            if prepared is not None and prepared.checkpoint_id == checkpoint.id:
                iid, paths, index, prepared = (
                    prepared.iid,
                    prepared.paths,
                    prepared.uid_index,
                    None,
                )
                await trio.to_thread.run_sync(slot_fs.write_owner, paths, owner)
            else:
                if prepared is not None:
                    await trio.to_thread.run_sync(self._teardown_fs, prepared.paths)
                    prepared = None
                iid = self._busy_iid(owner.replace(":", "-"))
                index = self._alloc_range()
                # Shielded: a cancel arriving while the thread works must not lose the mounts.
                with trio.CancelScope(shield=True):
                    try:
                        paths = await trio.to_thread.run_sync(
                            self._prepare_fs,
                            iid,
                            owner,
                            checkpoint.dir / "upper",
                            lower,
                            limits.tmpfs_mib,
                            index,
                        )
                    except BaseException:
                        if index is not None:
                            self._free_range(index)
                        raise
            inst = _Instance(
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
            try:
                images = await self._images_for(checkpoint, index)
            except BaseException:
                with self._cleanup_scope():
                    await self._off_loop(self._teardown, inst)
                raise
            ok = False
            try:
                ok = await self._restore_once(inst, images, limits, freeze=freeze)
            finally:
                if not ok:
                    with self._cleanup_scope():
                        await self._off_loop(self._teardown, inst)
            if ok:
                self.stats["restores"] += 1
                return inst
            last_error = inst.error
            self.stats["restore_retries"] += 1
            _log("restore_retry", owner=owner, iid=iid, attempt=attempt, error=last_error)
        raise RuntimeError_(
            "restore_failed",
            f"restore of checkpoint {checkpoint.id} for {owner} failed {self.config.max_attempts}"
            f" times; last error: {last_error}. Check the CRIU log and `drumsd doctor`",
            checkpoint=checkpoint.id,
        )

    async def _restore_once(
        self, inst: _Instance, images: Path, limits: SlotLimits, *, freeze: bool
    ) -> bool:
        assert self._launcher is not None
        inst.cgroups = await trio.to_thread.run_sync(self.driver.create, inst.iid, limits)
        if self.config.restore_cpu_boost:
            self.driver.set_cpu(inst.cgroups, None)
        work = inst.paths.rw / "criu"
        pidfile = work / "pid"
        argv = helper_argv(
            self._helper,
            self.driver.procs_files(inst.cgroups),
            self.config.ksm,
            criu.restore_argv(self.config.criu, images, work, inst.paths.root, pidfile),
        )
        t0 = time.monotonic()
        async with self.restore_limiter:
            t_criu = time.monotonic()
            inst.restore_started_at = time.time()  # after the upper copy (see split_written_since)
            done = await self._launcher.run(
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
            return False
        inst.pid, inst.pidfd, inst.starttime = outcome.pid, outcome.pidfd, outcome.starttime
        if freeze:
            await trio.to_thread.run_sync(self.driver.freeze, inst.cgroups)
            inst.frozen = True
            if self.config.restore_cpu_boost:
                self.driver.set_cpu(inst.cgroups, limits.vcpus)
        else:
            try:
                await self._wait_agent(inst, self.config.agent_ready_timeout_s)
            finally:
                if self.config.restore_cpu_boost and inst.pidfd >= 0:
                    with contextlib.suppress(cgroups.CgroupError):
                        self.driver.set_cpu(inst.cgroups, limits.vcpus)
        inst.restore_s = time.monotonic() - t0
        inst.phases["agent"] = round(inst.restore_s - inst.phases["queue"] - inst.phases["criu"], 4)
        # The restorer runs in the restored tasks: their CPU so far is the rest of the cost.
        ticks = sum(t for _, _, t in procfs.activity(self.driver.pids(inst.cgroups)))
        inst.phases["restore_cpu"] = round(done.cpu_s + cpu_seconds(ticks), 4)
        self._watch(inst)
        return True

    async def _check_lower(self, checkpoint: CheckpointRef) -> None:
        if not await trio.to_thread.run_sync(slot_fs.is_dir, checkpoint.lower):
            raise RuntimeError_(
                "restore_failed",
                f"checkpoint {checkpoint.id}: lower layer "
                f"{checkpoint.lower} is missing; rebuild the image",
            )

    # ------------------------------------------------------------------ SlotRuntime

    async def restore(
        self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        await self._check_lower(checkpoint)
        if slot_id in self._slots:
            raise RuntimeError_(
                "invalid_request", f"slot {slot_id} already exists; reset or destroy it first"
            )
        inst = await self._claim_spare(slot_id, checkpoint, limits)
        spare = inst is not None
        if inst is None:
            inst = await self._restore_instance(f"slot:{slot_id}", checkpoint, limits)
        self._slots[slot_id] = inst
        self._after_restore(slot_id, checkpoint, limits)
        _log(
            "restored",
            slot=slot_id,
            iid=inst.iid,
            pid=inst.pid,
            spare=spare,
            restore_s=f"{inst.restore_s:.3f}",
            attempts=inst.attempts,
        )
        return self._handle(slot_id, inst, spare)

    async def reset(
        self, handle: SlotHandle, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        await self._check_lower(checkpoint)
        old = self._slots.pop(handle.slot_id, None)
        try:
            # A warm spare is claimed before the old tree is killed: killing a desktop (its
            # exit_mmap, the teardown thread) beside the thaw was the rest of a claim's tail.
            inst = await self._claim_spare(handle.slot_id, checkpoint, limits)
            spare = inst is not None
            if old is not None:
                await self._dispose(old, background=self.config.async_kill or spare)
                old = None
            if inst is None:
                prepared = self._warm.pop(handle.slot_id, None)
                inst = await self._restore_instance(
                    f"slot:{handle.slot_id}", checkpoint, limits, prepared=prepared
                )
        except BaseException:
            with self._cleanup_scope():
                if old is not None:
                    await self._dispose(old, background=False)
                await self._drop_warm(handle.slot_id)
            raise
        self._slots[handle.slot_id] = inst
        self._after_restore(handle.slot_id, checkpoint, limits)
        _log(
            "reset",
            slot=handle.slot_id,
            iid=inst.iid,
            pid=inst.pid,
            spare=spare,
            restore_s=f"{inst.restore_s:.3f}",
        )
        return self._handle(handle.slot_id, inst, spare)

    async def destroy(self, slot_id: str) -> None:
        """Tear the slot down within cleanup_timeout_s (shielded from the caller's cancel, but
        bounded: a step that overruns is left to finish in its thread)."""
        with self._cleanup_scope() as scope:
            inst = self._slots.pop(slot_id, None)
            if inst is not None:
                await self._dispose(inst, background=False)
            await self._drop_warm(slot_id)
            # Leftovers of this slot from a previous daemon (not in memory).
            await self._off_loop(self._sweep_owned_by, {f"slot:{slot_id}", f"warm:{slot_id}"})
        if scope.cancelled_caught:
            _log("destroy_overran", slot=slot_id, timeout_s=self.config.cleanup_timeout_s)
