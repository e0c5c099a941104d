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
from drumsd.guest.session import SESSION_FILE, read_session
from drumsd.linux import checkpoint_files, criu, idmap, mounts, procfs, slot_fs
from drumsd.linux.exec_helper import helper_argv
from drumsd.linux.process_trees import (
    DEVNULL,
    boot_env,
    in_slot_exists,
    open_boot_log,
    pidfd_open,
)
from drumsd.runtime import agent_client
from drumsd.runtime.linux.base import (
    READY_FILE,
    TEMPLATE_LIMITS,
    Instance,
    LinuxRuntimeConfig,
    log_event,
)
from drumsd.runtime.linux.dumps import Dumper
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.supervision import Supervision
from drumsd.runtime.linux.waits import TreeWaits

# drumsd's package root (drumsd/src): stage 1 runs as `python -m drumsd.linux.stage1` from it.
PKG_ROOT = Path(__file__).resolve().parents[3]


class Booter:
    def __init__(
        self,
        config: LinuxRuntimeConfig,
        sup: Supervision,
        fs: InstanceFs,
        waits: TreeWaits,
        dumper: Dumper,
    ) -> None:
        self.config = config
        self.sup = sup
        self.driver = sup.driver
        self.fs = fs
        self.waits = waits
        self.dumper = dumper

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
        self.sup.running()
        # Pin the real directory: overlay's index ties the upper snapshot to this exact lower
        # (a rebuilt image behind the same symlink would fail with ESTALE).
        image_root = await trio.to_thread.run_sync(image_root.resolve)
        inst, boot_s = await self.cold_boot(image_root, f"template:{checkpoint_id}", apps=apps)
        try:
            settle_s = read_session(str(image_root / SESSION_FILE.lstrip("/"))).settle_s
            limit = self.config.boot_timeout_s
            poll = self.config.quiesce_poll_ms
            if settle_s > 0 and not await self.waits.tree_settled(inst, settle_s, limit, poll):
                log_event("template_not_settled", checkpoint=checkpoint_id, settle_s=settle_s)
            quiet = self.config.quiesce_window_s, self.config.quiesce_timeout_s
            if not await self.waits.tree_quiet(inst, *quiet, self.config.quiesce_poll_ms):
                log_event("template_not_quiescent", checkpoint=checkpoint_id)
            await self._encode_screen(inst, checkpoint_id)
            ref = await self.dumper.dump(inst, checkpoint_id, dest, image_sha256, False, None)
            await trio.to_thread.run_sync(
                partial(checkpoint_files.update_meta, dest, boot_s=round(boot_s, 3))
            )
            return ref
        finally:
            with self.sup.cleanup_scope():
                await self.sup.dispose(inst, background=False)

    async def _encode_screen(self, inst: Instance, checkpoint_id: str) -> None:
        """The template's screen encoded as a full-size PNG just before its dump, as a fork's
        prefork and a task checkpoint are (`ops_fork.encode_screen`): the guest keeps the image
        with the X DAMAGE state it was taken at, so every slot restored from the template
        answers its first screenshot from it, unless it drew since, instead of encoding the
        whole screen on its first step (~95 ms against ~20 ms, README "Density ramp"). Nothing
        under `linux.screen_grab: full`, which keeps nothing; a grab that fails is logged and
        the dump goes on (each restore encodes its own)."""
        if self.config.screen_grab == "full":
            return
        try:
            await self.sup.agent_call(inst, {"op": "screenshot"}, 15.0)
        except agent_client.AgentError as exc:
            log_event("template_screen_not_encoded", checkpoint=checkpoint_id, error=exc.message)

    async def cold_boot(
        self, image_root: Path, owner: str, apps: Sequence[str] = ()
    ) -> tuple[Instance, float]:
        """Boot the image in a fresh instance until its agent answers and the desktop says it is
        drawn (the ready file). Returns the instance and the boot time (the bench baseline)."""
        self.sup.running()
        iid = self.fs.new_iid(owner.replace(":", "-"))
        paths, index = await self.fs.make(
            iid, owner, None, (image_root,), TEMPLATE_LIMITS.tmpfs_mib
        )
        inst = Instance(iid, paths, {}, owner, (image_root,), uid_index=index)
        ok = False
        try:
            inst.cgroups = await trio.to_thread.run_sync(self.driver.create, iid, TEMPLATE_LIMITS)
            t0 = time.monotonic()
            await self._spawn(inst, apps)
            await self._wait_agent(inst, image_root)
            windows = await self._wait_drawn(inst, apps, image_root)
            boot_s = time.monotonic() - t0
            log_event(
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
                await self.sup.discard(inst)

    def _stage1_argv(self, inst: Instance, apps: Sequence[str]) -> list[str]:
        stage1 = [
            sys.executable,
            "-m",
            "drumsd.linux.stage1",
            "--root",
            str(inst.paths.root),
            "--tmpfs-mib",
            str(TEMPLATE_LIMITS.tmpfs_mib),
            "--hostname",
            "drums",
        ]
        if inst.uid_index is not None:
            stage1 += ["--uid-base", str(idmap.uid_base(inst.uid_index))]
        if self.config.procview_dir is not None:
            stage1 += ["--procview", str(self.config.procview_dir)]
            if self.fs.sysinfo_lib is not None:
                stage1 += ["--sysinfo-lib", str(self.fs.sysinfo_lib)]
        for app in apps:
            stage1 += ["--init-arg=--app", f"--init-arg={app}"]
        return helper_argv(self.fs.helper, self.driver.procs_files(inst.cgroups), False, stage1)

    async def _spawn(self, inst: Instance, apps: Sequence[str]) -> None:
        """Stage 1 started (through the exec helper, in the instance's cgroups), its namespace
        init found and watched."""
        paths = inst.paths
        log = await trio.to_thread.run_sync(open_boot_log, paths.rw / "criu" / "boot.out")
        proc = await trio.lowlevel.open_process(
            self._stage1_argv(inst, apps),
            stdin=DEVNULL,
            stdout=log,
            stderr=log,
            env=boot_env(PKG_ROOT),
        )
        log.close()
        inst.boot_proc = proc
        deadline = trio.current_time() + 10
        while not (init := procfs.find_ns_init(proc.pid)):
            if proc.returncode is not None or trio.current_time() > deadline:
                tail = await trio.to_thread.run_sync(criu.tail, paths.rw / "criu/boot.out", 5)
                raise RuntimeError_("runtime_error", "stage1 did not start: " + " | ".join(tail))
            await trio.sleep(0.005)
        inst.pid = init
        inst.pidfd = pidfd_open(inst.pid)
        inst.starttime = procfs.starttime(inst.pid) or 0
        await trio.to_thread.run_sync(
            partial(slot_fs.write_owner, paths, None, init=(inst.pid, inst.starttime))
        )
        self.sup.watch(inst)

    async def _wait_agent(self, inst: Instance, image_root: Path) -> None:
        try:
            await self.sup.wait_agent(inst, self.config.boot_timeout_s)
        except RuntimeError_ as exc:
            # The instance dir goes with the teardown: keep the evidence in the error.
            stage1_log, init_log = await _boot_logs(inst.paths)
            raise RuntimeError_(
                exc.code,
                f"{exc.message}; stage1: {stage1_log or '-'}; desktop-init: {init_log or '-'}",
                image=str(image_root),
            ) from exc

    async def _wait_drawn(
        self, inst: Instance, apps: Sequence[str], image_root: Path
    ) -> list[dict[str, Any]]:
        """The ready file, then the windows the desktop's session and apps map (the printing
        xterm of a session that runs one, a window per app) under a running window manager:
        the tree can sit idle before that (an app waiting on a timeout), so quiescence alone
        would dump a half-started desktop. A session that maps no window of its own (osworld's
        GNOME Shell) is ready once its window manager runs; the quiet tree after this is the
        rest of its drawing. Raises a timeout naming what was missing past boot_timeout_s.
        Returns the windows seen."""
        session = read_session(str(image_root / SESSION_FILE.lstrip("/")))
        want = expected_windows(session.xterm, apps)
        limit = self.config.boot_timeout_s
        deadline = trio.current_time() + limit
        # No event exists for "a file appeared in another mount namespace": poll (a stat).
        while (  # noqa: ASYNC110
            not in_slot_exists(inst.pid, READY_FILE) and trio.current_time() < deadline
        ):
            await trio.sleep(0.01)
        if not in_slot_exists(inst.pid, READY_FILE):
            _, init_log = await _boot_logs(inst.paths)
            raise RuntimeError_(
                "timeout",
                f"the desktop init of instance {inst.iid} wrote no {READY_FILE} within "
                f"boot_timeout_s={limit:g} s; desktop-init: {init_log or '-'}",
                image=str(image_root),
            )
        windows: list[dict[str, Any]] = []
        wm = False
        unanswered: agent_client.AgentError | None = None
        while trio.current_time() < deadline:
            # A loaded host can leave one query unanswered while the apps start: keep asking
            # until the boot deadline, not the first timeout.
            remaining = max(0.5, min(5.0, deadline - trio.current_time()))
            try:
                header, _ = await self.sup.agent_call(inst, {"op": "windows"}, remaining)
                windows = list(header.get("windows") or [])
                # A window manager lists client windows (_NET_CLIENT_LIST): with one window
                # listed it runs; with none wanted, ask the root window who manages it.
                wm = bool(windows) or (want == 0 and await self._wm_running(inst, remaining))
            except agent_client.AgentError as exc:
                unanswered = exc
                await trio.sleep(0.2)
                continue
            if wm and len(windows) >= want:
                return windows
            await trio.sleep(0.05)
        seen = ", ".join(w.get("class") or w.get("name") or "?" for w in windows) or "none"
        why = f"; the agent did not answer: {unanswered.message}" if unanswered else ""
        raise RuntimeError_(
            "timeout",
            f"the desktop of instance {inst.iid} (session {session.name!r}) was not drawn "
            f"within boot_timeout_s={limit:g} s: it wants {want} window(s) (the session's "
            f"xterm: {'yes' if session.xterm else 'no'}, apps: {list(apps) or 'none'}) under a "
            f"window manager; seen: {seen}, window manager: {'yes' if wm else 'no'}{why}. The "
            "desktop may have failed to start (see its desktop-init log) or the host is "
            "overloaded (raise linux.boot_timeout_s)",
            image=str(image_root),
        )

    async def _wm_running(self, inst: Instance, limit_s: float) -> bool:
        """An EWMH window manager has set the root window's _NET_SUPPORTING_WM_CHECK."""
        request = {"op": "exec", "argv": ["xprop", "-root", WM_CHECK], "timeout_s": limit_s}
        header, _ = await self.sup.agent_call(inst, request, limit_s + 1.0)
        return wm_check_set(str(header.get("stdout", "")))


WM_CHECK = "_NET_SUPPORTING_WM_CHECK"


def expected_windows(session_xterm: bool, apps: Sequence[str]) -> int:
    """Top-level windows a booted desktop maps: the session's printing xterm and one per app."""
    return int(session_xterm) + len(apps)


def wm_check_set(xprop_out: str) -> bool:
    """xprop's answer for the root's _NET_SUPPORTING_WM_CHECK names a window (when no window
    manager set it, xprop prints "not found" and exits 0)."""
    return any(
        line.startswith(WM_CHECK) and "window id #" in line for line in xprop_out.splitlines()
    )


async def _boot_logs(paths: mounts.SlotPaths) -> tuple[str, str]:
    """The last lines of stage 1's log and of the desktop init's, each joined on one line."""
    stage1 = await trio.to_thread.run_sync(criu.tail, paths.rw / "criu" / "boot.out", 6)
    init = await trio.to_thread.run_sync(
        criu.tail, paths.upper / protocol.INIT_LOG_PATH.lstrip("/"), 6
    )
    return " | ".join(stage1), " | ".join(init)
