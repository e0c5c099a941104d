"""Cold boots and templates: stage 1 of an image in a fresh instance until its agent answers, the
desktop is drawn and each app has a window; a template is such a boot, quiet, dumped."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_
from drumsd.guest import protocol
from drumsd.linux import checkpoint_files, criu, idmap, procfs, slot_fs
from drumsd.linux.exec_helper import helper_argv
from drumsd.linux.process_trees import (
    DEVNULL,
    boot_env,
    in_slot_exists,
    open_boot_log,
    pidfd_open,
)
from drumsd.runtime import agent_client
from drumsd.runtime.linux.base import READY_FILE, TEMPLATE_LIMITS, RuntimeBase, _Instance, _log

# drumsd's package root (drumsd/src): stage 1 runs as `python -m drumsd.linux.stage1` from it.
PKG_ROOT = Path(__file__).resolve().parents[3]


class BootMixin(RuntimeBase):
    async def make_template(
        self,
        image_root: Path,
        image_sha256: str,
        checkpoint_id: str,
        dest: Path,
        *,
        apps: Sequence[str] = (),
    ) -> CheckpointRef:
        """Cold boot: stage 1 in fresh namespaces, wait for the agent, the ready file, a window
        per app (`apps`: shell commands the desktop init starts, e.g. `libreoffice --calc`) and a
        quiet tree, then dump (the booted tree is killed by the dump)."""
        self._require_running()
        # Pin the real directory: overlay's index ties the upper snapshot to this exact lower
        # (a rebuilt image behind the same symlink would fail with ESTALE).
        image_root = await trio.to_thread.run_sync(image_root.resolve)
        inst, boot_s = await self.cold_boot(image_root, f"template:{checkpoint_id}", apps=apps)
        try:
            ok = await self._quiescent(
                inst,
                self.config.quiesce_window_s,
                self.config.quiesce_timeout_s,
                self.config.quiesce_poll_ms,
            )
            if not ok:
                _log("template_not_quiescent", checkpoint=checkpoint_id)
            ref = await self._dump(inst, checkpoint_id, dest, image_sha256, False, None)
            await trio.to_thread.run_sync(
                partial(checkpoint_files.update_meta, dest, boot_s=round(boot_s, 3))
            )
            return ref
        finally:
            with self._cleanup_scope():
                await self._dispose(inst, background=False)

    async def cold_boot(
        self, image_root: Path, owner: str, apps: Sequence[str] = ()
    ) -> tuple[_Instance, float]:
        """Boot the image in a fresh instance until its agent answers and the desktop says it is
        drawn (the ready file). Returns the instance and the boot time (the bench baseline)."""
        self._require_running()
        limits = TEMPLATE_LIMITS
        iid = self._busy_iid(owner.replace(":", "-"))
        index = self._alloc_range()
        with trio.CancelScope(shield=True):
            try:
                paths = await trio.to_thread.run_sync(
                    self._prepare_fs, iid, owner, None, (image_root,), limits.tmpfs_mib, index
                )
            except BaseException:
                if index is not None:
                    self._free_range(index)
                raise
        inst = _Instance(iid, paths, {}, owner, (image_root,), uid_index=index)
        ok = False
        try:
            inst.cgroups = await trio.to_thread.run_sync(self.driver.create, iid, limits)
            stage1 = [
                sys.executable,
                "-m",
                "drumsd.linux.stage1",
                "--root",
                str(paths.root),
                "--tmpfs-mib",
                str(limits.tmpfs_mib),
                "--hostname",
                "drums",
            ]
            if index is not None:
                stage1 += ["--uid-base", str(idmap.uid_base(index))]
            for app in apps:
                stage1 += ["--init-arg=--app", f"--init-arg={app}"]
            argv = helper_argv(self._helper, self.driver.procs_files(inst.cgroups), False, stage1)
            env = boot_env(PKG_ROOT)
            t0 = time.monotonic()
            log = await trio.to_thread.run_sync(open_boot_log, paths.rw / "criu" / "boot.out")
            proc = await trio.lowlevel.open_process(
                argv, stdin=DEVNULL, stdout=log, stderr=log, env=env
            )
            log.close()
            inst.boot_proc = proc
            deadline = trio.current_time() + 10
            while not (init := procfs.find_ns_init(proc.pid)):
                if proc.returncode is not None or trio.current_time() > deadline:
                    tail = await trio.to_thread.run_sync(criu.tail, paths.rw / "criu/boot.out", 5)
                    raise RuntimeError_(
                        "runtime_error", "stage1 did not start: " + " | ".join(tail)
                    )
                await trio.sleep(0.005)
            inst.pid = init
            inst.pidfd = pidfd_open(inst.pid)
            inst.starttime = procfs.starttime(inst.pid) or 0
            await trio.to_thread.run_sync(
                partial(slot_fs.write_owner, paths, None, init=(inst.pid, inst.starttime))
            )
            self._watch(inst)
            try:
                await self._wait_agent(inst, self.config.boot_timeout_s)
            except RuntimeError_ as exc:
                # The instance dir goes with the teardown: keep the evidence in the error.
                stage1_tail = await trio.to_thread.run_sync(
                    criu.tail, paths.rw / "criu" / "boot.out", 6
                )
                init_tail = await trio.to_thread.run_sync(
                    criu.tail, paths.upper / protocol.INIT_LOG_PATH.lstrip("/"), 6
                )
                stage1_log, init_log = " | ".join(stage1_tail), " | ".join(init_tail)
                raise RuntimeError_(
                    exc.code,
                    f"{exc.message}; stage1: {stage1_log or '-'}; desktop-init: {init_log or '-'}",
                    image=str(image_root),
                ) from exc
            deadline = trio.current_time() + self.config.boot_timeout_s
            # No event exists for "a file appeared in another mount namespace": poll (a stat).
            while (  # noqa: ASYNC110
                not in_slot_exists(inst.pid, READY_FILE) and trio.current_time() < deadline
            ):
                await trio.sleep(0.01)
            # Drawn = the agent sees a window. The tree can sit idle before that (an app waiting
            # on a timeout), so quiescence alone would dump a half-started desktop.
            windows: list[Any] = []
            unanswered: agent_client.AgentError | None = None
            while trio.current_time() < deadline:
                # A loaded host can leave one query unanswered while the apps start: keep
                # asking until the boot deadline, not the first timeout.
                remaining = max(0.5, min(5.0, deadline - trio.current_time()))
                try:
                    header, _ = await self._agent_raw(inst, {"op": "windows"}, remaining)
                except agent_client.AgentError as exc:
                    unanswered = exc
                    await trio.sleep(0.2)
                    continue
                windows = list(header.get("windows") or [])
                if len(windows) > len(apps):  # the xterm and one window per app
                    break
                await trio.sleep(0.05)
            if not windows and unanswered is not None:
                raise RuntimeError_(
                    "timeout",
                    f"the agent of instance {iid} listed no windows within "
                    f"{self.config.boot_timeout_s} s ({unanswered.message}); the desktop may "
                    "have failed to start or the host is overloaded",
                    image=str(image_root),
                )
            boot_s = time.monotonic() - t0
            _log(
                "cold_boot",
                owner=owner,
                iid=iid,
                pid=inst.pid,
                boot_s=f"{boot_s:.3f}",
                ready_file=in_slot_exists(inst.pid, READY_FILE),
                windows=len(windows),
            )
            ok = True
            return inst, boot_s
        finally:
            if not ok:
                with self._cleanup_scope():
                    self._kill_boot(inst)
                    await self._off_loop(self._teardown, inst)

    async def wait_instance_quiet(self, inst: _Instance, window_s: float, timeout_s: float) -> bool:
        """Quiescence of an instance that serves no slot (a cold boot being measured)."""
        return await self._quiescent(inst, window_s, timeout_s, self.config.quiesce_poll_ms)

    async def dispose_instance(self, inst: _Instance) -> None:
        await self._dispose(inst, background=False)
