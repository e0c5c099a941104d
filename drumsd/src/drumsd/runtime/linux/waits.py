"""Waits on a slot's process tree: quiescence (no process moving for a window, proven by the
kernel's process events as well as samples), a booting tree's CPU going quiet, and the init's
exit."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import trio

from drumsd.core.seams import Quiescence, SlotHandle
from drumsd.guest import protocol
from drumsd.linux import criu, proc_events, procfs
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, log_event
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.supervision import Supervision


class TreeWaits:
    def __init__(self, config: LinuxRuntimeConfig, sup: Supervision, table: InstanceTable) -> None:
        self.config = config
        self.driver = sup.driver
        self.table = table

    async def wait_exit(self, handle: SlotHandle) -> str:
        inst = self.table.get(handle.slot_id)
        if inst is None or inst.pid != handle.init_pid:
            # Not ours (no pidfd): poll its identity in /proc.
            same = partial(procfs.is_same_process, handle.init_pid, handle.init_starttime)
            while await trio.to_thread.run_sync(same):  # noqa: ASYNC110 (no event to wait on)
                await trio.sleep(0.1)
            return "gone from /proc (not watched by a pidfd of this runtime)"
        await inst.exited.wait()
        how = inst.exit_how or "exited"
        init_log = await trio.to_thread.run_sync(
            criu.tail, inst.paths.upper / protocol.INIT_LOG_PATH.lstrip("/"), 2
        )
        return how + (f"; desktop-init.log ends: {' | '.join(init_log)}" if init_log else "")

    async def quiescent(
        self, handle: SlotHandle, window_s: float, timeout_s: float, poll_ms: int
    ) -> Quiescence:
        inst = self.table.of(handle)

        def shape() -> dict[tuple[int, int], tuple[str, str]]:
            return procfs.tree_shape(self.driver.pids(inst.cgroups))

        # quiesce.events: the kernel's process events prove the window, so a process that starts
        # and ends between two samples counts too; the samples still catch D and Z states.
        events = await self._quiesce_events(handle.slot_id) if window_s > 0 else None
        try:
            deadline = trio.current_time() + timeout_s
            since = trio.current_time()
            last = await trio.to_thread.run_sync(shape)
            moved: list[str] = procfs.moving(last, last)
            if window_s <= 0 and not moved:
                return Quiescence(True)  # a fork's check: nothing in D or Z right now
            while trio.current_time() < deadline:
                await trio.sleep(poll_ms / 1000)
                now = await trio.to_thread.run_sync(shape)
                seen: list[str] = []
                if events is not None:
                    names = {pid: comm for (pid, _), (comm, _) in [*last.items(), *now.items()]}
                    got = await trio.to_thread.run_sync(events.read_ready)
                    seen = proc_events.tree_moves(got, names, names)
                if now != last or any(state for _, state in now.values()) or seen:
                    moved = procfs.moving(last, now) or [f"process events: {m}" for m in seen]
                    last, since = now, trio.current_time()
                elif trio.current_time() - since >= window_s:
                    return Quiescence(True)
            return Quiescence(False, tuple(moved[:12]))
        finally:
            if events is not None:
                await trio.to_thread.run_sync(events.close)

    async def _quiesce_events(self, slot_id: str) -> proc_events.ProcEventsSocket | None:
        """A socket on the kernel's process events for one quiet wait (quiesce.events), or None
        (off, or the connector cannot be opened: then the samples alone decide, and the log says
        so)."""
        if not self.config.quiesce_events:
            return None
        try:
            return await trio.to_thread.run_sync(
                lambda: proc_events.ProcEventsSocket.open(events=proc_events.QUIESCE_EVENTS)
            )
        except proc_events.ProcEventsError as exc:
            log_event("quiesce_events_unavailable", slot=slot_id, error=exc)
            return None

    async def tree_settled(
        self, inst: Instance, window_s: float, timeout_s: float, poll_ms: int
    ) -> bool:
        """No process of a booting tree started or exited for window_s: the helpers a desktop
        starts on its own some seconds after login (D-Bus activated services that exit when
        idle, an indexer's delayed crawl) have come and gone. CPU use does not count."""

        def processes() -> set[tuple[int, int]]:
            return set(procfs.tree_shape(self.driver.pids(inst.cgroups)))

        return await _unchanged_for(processes, window_s, timeout_s, poll_ms)

    async def tree_quiet(
        self, inst: Instance, window_s: float, timeout_s: float, poll_ms: int
    ) -> bool:
        """A booting desktop is done when its CPU ticks stop too (drawn, apps started)."""

        def activity() -> Any:
            return procfs.activity(self.driver.pids(inst.cgroups))

        return await _unchanged_for(activity, window_s, timeout_s, poll_ms)


async def _unchanged_for(
    sample: Callable[[], Any], window_s: float, timeout_s: float, poll_ms: int
) -> bool:
    """True once `sample()` (read in a thread every poll_ms) has not changed for window_s;
    False if that has not happened within timeout_s."""
    deadline = trio.current_time() + timeout_s
    since = trio.current_time()
    last = await trio.to_thread.run_sync(sample)
    while trio.current_time() < deadline:
        await trio.sleep(poll_ms / 1000)
        now = await trio.to_thread.run_sync(sample)
        if now != last:
            last, since = now, trio.current_time()
        elif trio.current_time() - since >= window_s:
            return True
    return False
