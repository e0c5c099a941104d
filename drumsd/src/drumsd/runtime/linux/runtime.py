"""`LinuxRuntime`: the owners of the runtime's state and its parts held together, each
`SlotRuntime` call forwarded to its part (restore, reset, destroy and fork to `slots.Slots`), the
slots' group memory limit, and the runtime's lifetime (`run`, `open_linux_runtime`)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import trio

from drumsd.core.admission import floor_group_limit_mib, group_memory_limit_mib
from drumsd.core.host_limits import LimitNeed, max_admitted_slots
from drumsd.core.seams import (
    CheckpointRef,
    CommandResult,
    Quiescence,
    RuntimeError_,
    SaveParent,
    Screenshot,
    SlotFacts,
    SlotHandle,
    SlotLimits,
    StepOutcome,
)
from drumsd.guest import protocol
from drumsd.linux import (
    cgroups,
    criu,
    host_limits,
    host_sampler,
    host_share,
    procview,
    slot_fs,
    sysinfo_preload,
)
from drumsd.linux.exec_helper import ensure_exec_helper
from drumsd.linux.launcher import Launcher
from drumsd.linux.process_trees import close_fd
from drumsd.runtime.linux.adoption import Adoption
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, log_event
from drumsd.runtime.linux.boot import Booter
from drumsd.runtime.linux.dumps import Dumper
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.images import ImageCache
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.ksm import KSM_DIR, KsmBoost, KsmMembership
from drumsd.runtime.linux.restore import Restorer
from drumsd.runtime.linux.slot_io import SlotIO
from drumsd.runtime.linux.slots import Slots
from drumsd.runtime.linux.spares import Spares
from drumsd.runtime.linux.supervision import Supervision
from drumsd.runtime.linux.uids import UidRanges
from drumsd.runtime.linux.waits import TreeWaits


class LinuxRuntime:
    """The `SlotRuntime` on Linux. Construct with a `LinuxRuntimeConfig`, then run it inside
    `open_linux_runtime` (or start `run()` in a nursery you own)."""

    def __init__(self, config: LinuxRuntimeConfig, driver: cgroups.CgroupDriver | None = None):
        self.config = config
        self.state_dir = config.state_dir
        # One cgroup group per state dir: sweep must never see another runtime's slots.
        state = config.state_dir.resolve()
        group = "drums-" + hashlib.sha256(str(state).encode()).hexdigest()[:8]
        view = config.procview_dir is not None
        self.driver = driver or cgroups.detect_driver(group, procview=view)
        self.stats = {"spare_hits": 0, "spare_misses": 0, "restores": 0, "restore_retries": 0}
        # The owners: host uid ranges (claimed host-wide), image copies, instances per slot.
        self.uids = UidRanges(host_share.UidRanges(state), hardened=config.profile == "hardened")
        self.images = ImageCache(config.state_dir / "images", config.images_tmpfs_mib)
        self.instances = InstanceTable()
        self.ksm = KsmMembership(
            host_share.KsmShare(KSM_DIR),
            enabled=config.ksm,
            pages_to_scan=config.ksm_pages_to_scan,
            sleep_millisecs=config.ksm_sleep_millisecs,
            boost=KsmBoost(
                config.ksm_boost_s, config.ksm_boost_pages_to_scan, config.ksm_boost_sleep_millisecs
            ),
        )
        # The parts, each given the owners it needs.
        self.fs = InstanceFs(config.state_dir, self.uids)
        self.sup = Supervision(self.driver, self.fs, config.teardown_timeout_s)
        self.restorer = Restorer(config, self.sup, self.fs, self.images, self.stats)
        self.io = SlotIO(config, self.sup, self.fs, self.instances)
        self.dumper = Dumper(config, self.sup)
        self.waits = TreeWaits(config, self.sup, self.instances)
        self.booter = Booter(config, self.sup, self.fs, self.waits, self.dumper)
        self.spares = Spares(config, self.sup, self.fs, self.instances, self.restorer, self.stats)
        self.adoption = Adoption(self.sup, self.fs, self.instances, self.spares.pool)
        self.slots = Slots(
            config,
            self.sup,
            self.instances,
            self.restorer,
            self.spares,
            self.adoption,
            before_fork=self.ksm.start_boost,
            after_fork=self.ksm.boost,
        )
        self._group_limit_mib: int | None = None  # the slots' group memory limit last set
        self.host_limits: list[LimitNeed] = []  # the shared kernel limits, as sized at start

    @property
    def hardened(self) -> bool:
        return self.uids.hardened

    @property
    def refill_allowed(self) -> Callable[[], bool]:
        """Whether admission control lets spare refills start now (set by the control plane)."""
        return self.spares.refill_allowed

    @refill_allowed.setter
    def refill_allowed(self, allowed: Callable[[], bool]) -> None:
        self.spares.refill_allowed = allowed

    # ------------------------------------------------------------------ SlotRuntime

    async def restore(
        self,
        slot_id: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        warm_upper: bool = True,
    ) -> SlotHandle:
        return await self.slots.restore(slot_id, checkpoint, limits, warm_upper=warm_upper)

    async def reset(
        self, handle: SlotHandle, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        return await self.slots.reset(handle, checkpoint, limits)

    async def destroy(self, slot_id: str) -> None:
        await self.slots.destroy(slot_id)

    async def fork(
        self,
        handle: SlotHandle,
        source: CheckpointRef,
        child_ids: Sequence[str],
        limits: SlotLimits,
    ) -> list[SlotHandle]:
        return await self.slots.fork(handle, source, child_ids, limits)

    async def capture(
        self,
        handle: SlotHandle,
        checkpoint_id: str,
        dest: Path,
        *,
        parent: SaveParent | None = None,
    ) -> CheckpointRef:
        inst = self.instances.of(handle)
        return await self.dumper.dump(
            inst, checkpoint_id, dest, inst.image_sha256, True, inst.checkpoint_id, parent
        )

    async def checkpoint_problems(self, path: Path, meta: dict[str, Any]) -> list[str]:
        return await self.dumper.checkpoint_problems(path, meta)

    async def step(
        self, handle: SlotHandle, action: Mapping[str, Any], shot: protocol.ShotSpec | None = None
    ) -> StepOutcome:
        return await self.io.step(handle, action, shot)

    async def step_batch(
        self,
        handle: SlotHandle,
        actions: Sequence[Mapping[str, Any]],
        shot: protocol.ShotSpec | None = None,
    ) -> tuple[list[dict[str, Any]], Screenshot | None]:
        return await self.io.step_batch(handle, actions, shot)

    async def windows(self, handle: SlotHandle) -> list[dict[str, Any]]:
        return await self.io.windows(handle)

    async def screenshot(self, handle: SlotHandle) -> bytes:
        return await self.io.screenshot(handle)

    async def grab(
        self, handle: SlotHandle, spec: protocol.ShotSpec, *, fresh: bool = False
    ) -> Screenshot:
        return await self.io.grab(handle, spec, fresh=fresh)

    async def exec_user(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        return await self.io.exec_user(handle, command, timeout_s)

    async def exec_trusted(
        self, handle: SlotHandle, command: str, timeout_s: float
    ) -> CommandResult:
        return await self.io.exec_trusted(handle, command, timeout_s)

    async def exec_checker(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        return await self.io.exec_checker(handle, command, timeout_s)

    async def connect_guest(self, handle: SlotHandle, port: int) -> trio.SocketStream:
        return await self.io.connect_guest(handle, port)

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes:
        return await self.io.read_file(handle, path, max_bytes)

    async def freeze(self, handle: SlotHandle, timeout_s: float = 2.0) -> None:
        """Stop every process of the slot until `thaw`: verify reads the desktop's files and
        scans its upper layer while nothing in it can change them (issue 36). RuntimeError_
        when the cgroup does not freeze in `timeout_s` (the slot is left running)."""
        dirs = self.instances.of(handle).cgroups
        try:
            await trio.to_thread.run_sync(cgroups.freeze_whole, self.driver, dirs, timeout_s)
        except cgroups.CgroupError as exc:
            raise RuntimeError_("runtime_error", str(exc), slot=handle.slot_id) from exc

    async def thaw(self, handle: SlotHandle) -> None:
        dirs = self.instances.of(handle).cgroups
        await trio.to_thread.run_sync(self.driver.thaw, dirs)

    async def write_file(
        self, handle: SlotHandle, path: str, data: bytes, *, user: bool = True
    ) -> None:
        await self.io.write_file(handle, path, data, user=user)

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        return await self.io.facts(handle)

    async def wait_exit(self, handle: SlotHandle) -> str:
        return await self.waits.wait_exit(handle)

    async def quiescent(
        self, handle: SlotHandle, window_s: float, timeout_s: float, poll_ms: int
    ) -> Quiescence:
        return await self.waits.quiescent(handle, window_s, timeout_s, poll_ms)

    async def make_template(
        self,
        image_root: Path,
        image_sha256: str,
        checkpoint_id: str,
        dest: Path,
        *,
        apps: Sequence[str] = (),
    ) -> CheckpointRef:
        return await self.booter.make_template(
            image_root, image_sha256, checkpoint_id, dest, apps=apps
        )

    async def adopt(self, handle: SlotHandle) -> bool:
        return await self.adoption.adopt(handle)

    async def sweep(self, live_slot_ids: Sequence[str], *, own: bool = False) -> list[str]:
        return await self.adoption.sweep(live_slot_ids, own=own)

    # ------------------------------------------------------------------ spares, KSM, bench

    def enable_spares(self, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        """Keep `spares_per_checkpoint` frozen restores of `checkpoint` ready for claims."""
        self.spares.pool.enable(checkpoint, limits)

    def set_spare_target(self, checkpoint_id: str, n: int) -> None:
        """How many spares `checkpoint_id` should keep (at most spares_per_checkpoint); extra
        spares are disposed of on the next pass of the refiller."""
        self.spares.pool.set_target(checkpoint_id, n)

    async def drop_spares(self, checkpoint_id: str) -> None:
        await self.spares.drop(checkpoint_id)

    async def forget_checkpoint(self, checkpoint_id: str) -> None:
        """A checkpoint was deleted or replaced: its spares and its image copies on the
        runtime's tmpfs go (they would otherwise hold its memory image in RAM)."""
        await self.spares.drop(checkpoint_id)
        await self.images.forget(checkpoint_id)

    def spare_counts(self) -> dict[str, int]:
        return self.spares.pool.counts()

    def ksm_stats(self) -> dict[str, int | bool]:
        """For /v1/health and metrics: whether KSM is on and the memory it saves right now."""
        return self.ksm.stats()

    async def cold_boot(
        self, image_root: Path, owner: str, apps: Sequence[str] = ()
    ) -> tuple[Instance, float]:
        """A booted instance that serves no slot, and its boot time (the bench's baseline)."""
        return await self.booter.cold_boot(image_root, owner, apps)

    async def wait_instance_quiet(self, inst: Instance, window_s: float, timeout_s: float) -> bool:
        return await self.waits.tree_quiet(inst, window_s, timeout_s, self.config.quiesce_poll_ms)

    async def dispose_instance(self, inst: Instance) -> None:
        await self.sup.dispose(inst, background=False)

    # ------------------------------------------------------------------ lifetime

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background work until cancelled; on exit, live slots keep running (a restarted
        daemon adopts them) but spares and warm uppers are removed."""
        held = await trio.to_thread.run_sync(slot_fs.held_uid_ranges, self.state_dir / "slots")
        self.uids.hold(held)  # held by slots of a previous daemon until swept
        for index in self.uids.recover_claims():
            log_event("uid_range_conflict", index=index, claims=self.uids.claims.root)
        self.fs.helper = await trio.to_thread.run_sync(ensure_exec_helper, self.state_dir / "bin")
        if self.config.procview_dir is not None:
            await self._serve_procview(self.config.procview_dir)
        try:
            self.driver.set_group_weight(self.config.group_cpu_shares)
        except (cgroups.CgroupError, OSError) as exc:
            log_event("group_cpu_weight_unset", error=exc)
        if self.config.daemon_cpu_weight is not None:
            try:
                where = self.driver.set_daemon_weight(self.config.daemon_cpu_weight)
                log_event("daemon_cpu_weight", shares=self.config.daemon_cpu_weight, cgroup=where)
            except (cgroups.CgroupError, OSError) as exc:
                log_event("daemon_cpu_weight_unset", error=exc)
        await self._limit_group_memory()
        await self.size_host_limits()  # before the launcher: it and criu inherit RLIMIT_NOFILE
        unready = await trio.to_thread.run_sync(host_share.ensure_criu_cache_dir, criu.KDAT_DIR)
        if unready is not None:  # CRIU probes the kernel at each run, as a stock one on ext4
            log_event("criu_cache_dir_unready", error=unready)
        self.sup.launcher = Launcher(self.config.max_concurrent_restores + 2)
        self.ksm.join()
        try:
            async with trio.open_nursery() as nursery:
                self.sup.nursery = nursery
                nursery.start_soon(self.spares.serve)
                nursery.start_soon(self.ksm.serve_boosts)
                task_status.started()
                await trio.sleep_forever()
        except Exception as exc:
            while isinstance(exc, ExceptionGroup) and exc.exceptions:  # the nursery's: its first
                exc = exc.exceptions[0]
            self.sup.stopped_by = f"{type(exc).__name__}: {exc}"[:300]
            raise
        finally:
            self.sup.nursery = None
            with trio.CancelScope(shield=True):
                await self._close()

    async def _serve_procview(self, view_dir: Path) -> None:
        """The slots' /proc view (config procview_dir): LXCFS there, started if absent, and the
        sysinfo() library stage 1 preloads in templates, built if absent."""
        try:
            started = await trio.to_thread.run_sync(procview.ensure, view_dir)
            self.fs.sysinfo_lib = await trio.to_thread.run_sync(
                sysinfo_preload.ensure_lib, self.state_dir / "bin"
            )
        except (procview.ProcViewError, sysinfo_preload.SysinfoLibError, OSError) as exc:
            raise RuntimeError_("runtime_error", f"procview_dir: {exc}") from None
        log_event(
            "procview",
            dir=view_dir,
            lxcfs="started" if started else "already mounted",
            sysinfo_lib=self.fs.sysinfo_lib,
        )

    async def _close(self) -> None:
        await self.spares.close()
        for inst in self.instances.serving():
            if inst.pidfd >= 0:
                close_fd(inst.pidfd)
        assert self.sup.launcher is not None
        self.sup.launcher.close()
        self.ksm.leave()
        self.uids.close()
        self.driver.remove_group_if_empty()
        if not len(self.instances):  # nothing left to adopt: the image cache goes too
            await trio.to_thread.run_sync(self.images.drop)

    async def size_host_limits(self) -> list[LimitNeed]:
        """Raise the kernel limits all slots share (inotify instances and watches, open files)
        to what the most slots this host admits need; what stays short is logged, and
        `drumsd doctor` and /v1/health report it. Returns the needs as they are now."""
        _, total_mib = await trio.to_thread.run_sync(host_sampler.read_meminfo)
        slots = max_admitted_slots(self.config.slot_range, total_mib)
        needs = await trio.to_thread.run_sync(host_limits.host_needs, slots)
        for raised in await trio.to_thread.run_sync(host_limits.raise_short, needs):
            if raised.after is None:
                log_event(
                    "host_limit_short",
                    limit=raised.name,
                    value=raised.before,
                    slots=slots,
                    error=raised.error,
                )
            else:
                log_event(
                    "host_limit_raised",
                    limit=raised.name,
                    before=raised.before,
                    after=raised.after,
                    slots=slots,
                )
        self.host_limits = await trio.to_thread.run_sync(host_limits.host_needs, slots)
        return self.host_limits

    async def _limit_group_memory(self) -> None:
        _, total_mib = await trio.to_thread.run_sync(host_sampler.read_meminfo)
        limit_mib = group_memory_limit_mib(
            self.config.group_memory_mib, total_mib, self.config.group_memory_reserve_mib
        )
        try:
            await trio.to_thread.run_sync(self.driver.set_group_memory, limit_mib)
        except (cgroups.CgroupError, OSError) as exc:
            # EBUSY: slots of a previous daemon already use more than the new limit.
            log_event("group_memory_limit_unset", limit_mib=limit_mib, error=exc)
            return
        self._group_limit_mib = limit_mib
        log_event("group_memory_limit", limit_mib=limit_mib if limit_mib else "none")

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
            log_event("group_memory_limit_unset", limit_mib=limit_mib, error=exc)
            return self._group_limit_mib
        self._group_limit_mib = limit_mib
        return limit_mib


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
