"""Supervision of instances while the runtime runs: its nursery and launcher, a watch on each
init's pidfd, agent calls, and disposal (kill, reap, cgroups and mounts gone) within the cleanup
deadline, in the background or not."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from drumsd.core.seams import RuntimeError_
from drumsd.linux import cgroups, procfs
from drumsd.linux.launcher import Launcher
from drumsd.linux.process_trees import close_fd, dup_fd, exit_text, kill_tree, reap_nohang
from drumsd.runtime import agent_client
from drumsd.runtime.linux.base import Instance, log_event
from drumsd.runtime.linux.fs import InstanceFs

EXIT_REPORT_S = 2.0  # the launcher's process reports a reaped init within milliseconds


class Supervision:
    def __init__(
        self, driver: cgroups.CgroupDriver, fs: InstanceFs, teardown_timeout_s: float
    ) -> None:
        self.driver = driver
        self.fs = fs
        self.teardown_timeout_s = teardown_timeout_s
        self.nursery: trio.Nursery | None = None  # both set while the runtime runs
        self.launcher: Launcher | None = None
        self.stopped_by = ""  # why the runtime's background work ended, when an error ended it

    def running(self) -> tuple[trio.Nursery, Launcher]:
        if self.stopped_by:  # requests still arriving while the daemon shuts down
            raise RuntimeError_(
                "runtime_error",
                f"the Linux runtime stopped on an error ({self.stopped_by}); drumsd is exiting: "
                "restart it (its slots are adopted) and report the error with the daemon's log",
            )
        if self.nursery is None or self.launcher is None:
            raise RuntimeError_(
                "runtime_error", "the Linux runtime is not running; use open_linux_runtime()"
            )
        return self.nursery, self.launcher

    def start_soon(self, fn: Callable[..., Any], *args: Any) -> bool:
        """Background work in the runtime's nursery; False when it is not running."""
        if self.nursery is None:
            return False
        self.nursery.start_soon(fn, *args)
        return True

    # ------------------------------------------------------------------ watch and agent

    def watch(self, inst: Instance) -> None:
        nursery, launcher = self.running()
        # An init this runtime restored is the launcher's child (it reports how the init
        # ended); an adopted one is not, and nobody will.
        nursery.start_soon(self._supervise, inst, launcher.is_parent_of(inst.pid))
        inst.watched = True

    async def _supervise(self, inst: Instance, launched: bool) -> None:
        """Own the pidfd: wait until the init exits, learn how it ended from the launcher's
        process that reaps it (restore-sibling makes it that process's child) and keep it
        (`exit_how`: no I/O, since a teardown waits for `exited`), close the pidfd."""
        fd = inst.pidfd
        try:
            await trio.lowlevel.wait_readable(fd)
            status = reap_nohang(inst.pid)
            if status is None and launched and self.launcher is not None:
                status = await self.launcher.exit_status(inst.pid, EXIT_REPORT_S)
            inst.exit_how = exit_text(status)
        except (trio.ClosedResourceError, trio.BusyResourceError):
            alive = procfs.is_same_process(inst.pid, inst.starttime)
            inst.exit_how = "its pidfd was closed under the watch" + (
                " (the init is still running: a runtime fault)" if alive else ""
            )
            raise
        finally:
            inst.exited.set()
            trio.lowlevel.notify_closing(fd)
            close_fd(fd)
            inst.pidfd = -1

    async def wait_agent(self, inst: Instance, timeout_s: float) -> None:
        deadline = trio.current_time() + timeout_s
        last: Exception | None = None
        while trio.current_time() < deadline:
            if inst.exited.is_set() or not procfs.is_same_process(inst.pid, inst.starttime):
                how = await self._exit_how(inst)
                how = f" ({how})" if how else ""
                raise RuntimeError_(
                    "restore_failed",
                    f"slot init {inst.pid} exited{how} before its agent answered",
                )
            try:
                await self.agent_call(inst, {"op": "ping"}, 1.0)
                return
            except agent_client.AgentError as exc:
                last = exc
            await trio.sleep(0.003)
        raise RuntimeError_(
            "timeout",
            f"agent of instance {inst.iid} did not answer within "
            f"{timeout_s} s ({last}); the desktop may have failed to start",
        )

    async def _exit_how(self, inst: Instance) -> str:
        """How an init that died before its agent answered ended: from its watch (a boot's), or,
        for a restore's init (watched only once its agent answers), from the launcher's process
        that reaped it."""
        if inst.watched or inst.exited.is_set():
            with trio.move_on_after(1.0):
                await inst.exited.wait()
            return inst.exit_how
        status = reap_nohang(inst.pid)
        if status is None and self.launcher is not None:
            status = await self.launcher.exit_status(inst.pid, EXIT_REPORT_S)
        return exit_text(status)

    @staticmethod
    async def agent_call(
        inst: Instance, request: dict[str, Any], limit_s: float
    ) -> tuple[dict[str, Any], bytes]:
        async with inst.gate.call():
            return await agent_client.call(Path(inst.sock), request, timeout=limit_s)

    # ------------------------------------------------------------------ teardown

    @staticmethod
    def kill_boot(inst: Instance) -> None:
        """Before a cold boot's teardown (in trio's thread: the process handle needs it). A
        boot torn down before its exec helper joined the cgroups (a SIGTERM to drumsd right
        after the spawn) is in none of them: killed first, it never execs stage 1, else it
        boots a desktop that nothing owns (seen once, under load, in CI)."""
        boot = inst.boot_proc
        if boot is not None and boot.returncode is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                boot.kill()

    @staticmethod
    def own_pidfd(inst: Instance) -> int:
        """In trio's thread, before `teardown` goes to a worker: a copy of the init's pidfd that
        the teardown owns. The watch closes the instance's own as soon as the init exits, which
        the teardown's cgroup kill brings about: the number read from the instance was signalled
        after that close in 93 of 240 teardowns of a validator run, and once a concurrent
        restore has reopened it as its new init's pidfd, that init is SIGKILLed before its
        agent answers (CI's validator lost a fork child's init so)."""
        return dup_fd(inst.pidfd)

    def teardown(self, inst: Instance, pidfd: int) -> None:
        """Blocking: kill the tree, reap, remove cgroups and mounts. Nothing remains. `pidfd`
        (from `own_pidfd`) is closed here, and the tree's userfaultfds."""
        try:
            kill_tree(self.driver, inst.cgroups, inst.pid, pidfd)
        finally:
            if pidfd >= 0:
                close_fd(pidfd)
            if inst.write_track is not None:  # after the kill: no protections to undo
                inst.write_track.close()
        self.fs.teardown(inst.paths)
        if not inst.watched and inst.pidfd >= 0:  # a watched pidfd is closed by its watcher
            close_fd(inst.pidfd)
            inst.pidfd = -1

    def cleanup_scope(self) -> trio.CancelScope:
        """A shield with its own deadline for cleanup that must survive the caller's cancel."""
        return trio.move_on_after(self.teardown_timeout_s, shield=True)

    @staticmethod
    @trio.lowlevel.enable_ki_protection
    async def off_loop(fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking cleanup step in a thread the caller's deadline can abandon (the thread
        goes on and finishes the step). KI-protected: a Ctrl-C waits for the step instead of
        abandoning it to a process about to exit."""
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    async def discard(self, inst: Instance) -> None:
        """Tear down an instance that never ran to serve (a failed restore or boot)."""
        with self.cleanup_scope():
            self.kill_boot(inst)
            await self.off_loop(self.teardown, inst, self.own_pidfd(inst))

    async def dispose(self, inst: Instance, background: bool) -> None:
        async def go() -> None:
            with self.cleanup_scope() as scope:
                self.kill_boot(inst)
                await self.off_loop(self.teardown, inst, self.own_pidfd(inst))
                if inst.boot_proc is not None:
                    await inst.boot_proc.wait()
                if inst.watched:
                    with trio.move_on_after(5):
                        await inst.exited.wait()
            if scope.cancelled_caught:
                log_event(
                    "teardown_overran",
                    iid=inst.iid,
                    pid=inst.pid,
                    timeout_s=self.teardown_timeout_s,
                )

        if not (background and self.start_soon(go)):
            await go()
