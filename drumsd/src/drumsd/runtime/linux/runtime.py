"""`LinuxRuntime`: the parts combined, and its lifetime (`run`, `open_linux_runtime`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import trio

from drumsd.core.admission import floor_group_limit_mib, group_memory_limit_mib
from drumsd.linux import cgroups, host_sampler, slot_fs
from drumsd.linux.exec_helper import ensure_exec_helper
from drumsd.linux.launcher import Launcher
from drumsd.linux.process_trees import close_fd
from drumsd.runtime.linux.adoption import AdoptionMixin
from drumsd.runtime.linux.base import LinuxRuntimeConfig, _log
from drumsd.runtime.linux.boot import BootMixin
from drumsd.runtime.linux.dumps import DumpMixin
from drumsd.runtime.linux.ksm import KsmMixin
from drumsd.runtime.linux.restore import RestoreMixin
from drumsd.runtime.linux.slot_io import SlotIOMixin
from drumsd.runtime.linux.spares import SparesMixin


class LinuxRuntime(
    RestoreMixin, SlotIOMixin, DumpMixin, BootMixin, SparesMixin, AdoptionMixin, KsmMixin
):
    """The `SlotRuntime` on Linux. Construct with a `LinuxRuntimeConfig`, then run it inside
    `open_linux_runtime` (or start `run()` in a nursery you own)."""

    async def _limit_group_memory(self) -> None:
        _, total_mib = await trio.to_thread.run_sync(host_sampler.read_meminfo)
        limit_mib = group_memory_limit_mib(
            self.config.group_memory_mib, total_mib, self.config.group_memory_reserve_mib
        )
        try:
            await trio.to_thread.run_sync(self.driver.set_group_memory, limit_mib)
        except (cgroups.CgroupError, OSError) as exc:
            # EBUSY: slots of a previous daemon already use more than the new limit.
            _log("group_memory_limit_unset", limit_mib=limit_mib, error=exc)
            return
        self._group_limit_mib = limit_mib
        _log("group_memory_limit", limit_mib=limit_mib if limit_mib else "none")

    async def hold_memory_floor(self, mem_available_mib: float, floor_mib: float) -> int | None:
        """The slots' group limit follows MemAvailable (`GroupMemoryControl`): the admission
        service calls this after every sample, so memory used outside slots lowers it."""
        usage_mib = await trio.to_thread.run_sync(self.driver.group_memory_bytes) / (1 << 20)
        limit_mib = floor_group_limit_mib(
            self.config.group_memory_mib, usage_mib, mem_available_mib, floor_mib
        )
        if limit_mib == self._group_limit_mib:
            return limit_mib
        try:
            await trio.to_thread.run_sync(self.driver.set_group_memory, limit_mib)
        except (cgroups.CgroupError, OSError) as exc:
            # EBUSY: the slots grew past it between the read and the write; the next sample
            # sets it again from their new usage.
            _log("group_memory_limit_unset", limit_mib=limit_mib, error=exc)
            return self._group_limit_mib
        self._group_limit_mib = limit_mib
        return limit_mib

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background work until cancelled; on exit, live slots keep running (a restarted
        daemon adopts them) but spares and warm uppers are removed."""
        held = await trio.to_thread.run_sync(slot_fs.held_uid_ranges, self.state_dir / "slots")
        self._ranges |= held  # held by slots of a previous daemon until swept
        if self.hardened:
            for index in self._uid_claims.recover(self._ranges):
                _log("uid_range_conflict", index=index, claims=self._uid_claims.root)
        self._helper = await trio.to_thread.run_sync(ensure_exec_helper, self.state_dir / "bin")
        try:
            self.driver.set_group_weight(self.config.group_cpu_shares)
        except (cgroups.CgroupError, OSError) as exc:
            _log("group_cpu_weight_unset", error=exc)
        await self._limit_group_memory()
        self._launcher = Launcher(self.config.max_concurrent_restores + 2)
        if self.config.ksm:
            self._ksm_on()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._serve_spares)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                for pool in self._spares.values():
                    for inst in pool:
                        await trio.to_thread.run_sync(self._teardown, inst)
                self._spares.clear()
                for prep in list(self._warm.values()):
                    await trio.to_thread.run_sync(self._teardown_fs, prep.paths)
                self._warm.clear()
                for inst in self._slots.values():
                    if inst.pidfd >= 0:
                        close_fd(inst.pidfd)
                self._launcher.close()
                self._ksm_restore()
                for fd in self._userns_fds.values():
                    close_fd(fd)
                self._userns_fds.clear()
                self.driver.remove_group_if_empty()
                if not self._slots:  # nothing left to adopt: the image cache goes too
                    await trio.to_thread.run_sync(self._drop_image_cache)

    def _drop_image_cache(self) -> None:
        slot_fs.drop_image_cache(self.state_dir / "images")
        self._image_cache.clear()


@contextlib.asynccontextmanager
async def open_linux_runtime(
    config: LinuxRuntimeConfig, driver: cgroups.CgroupDriver | None = None
) -> AsyncIterator[LinuxRuntime]:
    """The runtime with its background work running; cancelled and cleaned up on exit."""
    rt = LinuxRuntime(config, driver)
    async with trio.open_nursery() as nursery:
        await nursery.start(rt.run)
        try:
            yield rt
        finally:
            nursery.cancel_scope.cancel()
