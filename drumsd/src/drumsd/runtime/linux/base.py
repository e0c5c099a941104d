"""The Linux runtime's shared state and the pieces every part uses: its config, the instance
record, filesystem set-up and teardown (through `drumsd.linux.slot_fs`), supervision of an init's
pidfd, disposal within a cleanup deadline, agent calls, and the handle given to the control plane.

Vocabulary: an *instance* is one restored (or booted) process tree with its own directory
`state_dir/slots/<iid>` (a tmpfs holding the upper layer, the overlay root, CRIU's work dir) and its
own cgroups named `<iid>`. A *slot* is the control plane's name for whichever instance currently
serves it: a reset swaps the instance (the old one is torn down in the background). Every instance
dir holds `owner.json` naming its slot, so a restarted daemon can sweep what no live slot owns.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from drumsd.core.seams import CheckpointRef, RuntimeError_, SlotHandle, SlotLimits
from drumsd.guest import protocol
from drumsd.linux import cgroups, host_share, idmap, mounts, procfs, slot_fs
from drumsd.linux.launcher import Launcher
from drumsd.linux.process_trees import close_fd, exit_text, kill_tree, reap_nohang
from drumsd.runtime import agent_client

AGENT_SOCK = protocol.SOCKET_PATH.lstrip("/")
READY_FILE = protocol.READY_PATH.lstrip("/")
DESKTOP_UID = 1000
TEMPLATE_LIMITS = SlotLimits(vcpus=2.0, memory_mib=4096, pids_max=4096, tmpfs_mib=1024)
KSM_DIR = Path("/sys/kernel/mm/ksm")
SPARE_PASS_S = 5.0  # the refiller's idle period: recycling and refused refills are retried


def _log(event: str, **fields: Any) -> None:
    """One structured line per event on stderr (slot/instance always named)."""
    parts = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"drums.runtime {event} {parts}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class LinuxRuntimeConfig:
    state_dir: Path
    criu: Path = Path("/usr/local/sbin/criu")
    max_concurrent_restores: int = 4
    max_attempts: int = 3
    warm_upper: bool = True
    async_kill: bool = True
    restore_cpu_boost: bool = True
    # CPU weight of all slots together against the daemon's siblings (v1 shares; 1024 = one
    # ordinary process). Restores are bursts of many short wakeups: with the default weight a
    # busy host delays each wakeup and a 0.06 CPU-s restore takes 0.6 s (measured here).
    group_cpu_shares: int = 16384
    # Memory limit of all slots together (MiB): None = host memory less group_memory_reserve_mib,
    # 0 = none. Each slot's own limit alone lets 50 slots x 2 GiB overcommit a 24 GiB host.
    group_memory_mib: int | None = None
    group_memory_reserve_mib: int = 4096
    ksm: bool = False
    ksm_pages_to_scan: int = 1000
    ksm_sleep_millisecs: int = 20
    spares_per_checkpoint: int = 0
    spares_per_host: int = 16
    spare_max_age_s: float = 1800.0
    images_tmpfs_mib: int = 8192
    agent_ready_timeout_s: float = 20.0
    restore_timeout_s: float = 30.0  # criu restore; a broken image can make it spin forever
    dump_timeout_s: float = 120.0
    boot_timeout_s: float = 90.0
    quiesce_window_s: float = 1.0
    quiesce_timeout_s: float = 30.0
    quiesce_poll_ms: int = 50
    quiesce_events: bool = True
    # Bound of every shielded teardown (kill, reap, cgroups, mounts): below the supervisor's
    # 120 s around destroy, so a wedged kill or umount cannot hold a request past its deadline.
    # The teardown thread is abandoned, not stopped: it still finishes the cleanup behind it.
    cleanup_timeout_s: float = 60.0
    # "hardened": a per-slot host uid range; "trusted": identity-mapped ids (trusted code only).
    profile: str = "hardened"

    @classmethod
    def from_config(cls, cfg: Any) -> LinuxRuntimeConfig:
        """From drumsd.core.config.Config (duck-typed to keep core free of this import)."""
        return cls(
            state_dir=cfg.state_dir,
            criu=cfg.criu,
            max_concurrent_restores=cfg.max_concurrent_restores,
            max_attempts=cfg.max_attempts,
            warm_upper=cfg.warm_upper,
            async_kill=cfg.async_kill,
            restore_cpu_boost=cfg.restore_cpu_boost,
            group_memory_mib=cfg.group_memory_mib,
            group_memory_reserve_mib=cfg.admission.min_available_mib,
            ksm=cfg.ksm.enabled,
            ksm_pages_to_scan=cfg.ksm.pages_to_scan,
            ksm_sleep_millisecs=cfg.ksm.sleep_millisecs,
            spares_per_checkpoint=cfg.spares.per_checkpoint if cfg.spares.enabled else 0,
            spares_per_host=cfg.spares.per_host,
            spare_max_age_s=cfg.spares.max_age_s,
            quiesce_window_s=cfg.quiesce.window_s,
            quiesce_timeout_s=cfg.quiesce.timeout_s,
            quiesce_poll_ms=cfg.quiesce.poll_ms,
            quiesce_events=cfg.quiesce.events,
            profile=cfg.profile,
        )


class _AgentGate:
    """Agent calls run concurrently; a dump waits until none is open and blocks new ones (CRIU
    cannot dump a unix socket whose peer is on the host)."""

    def __init__(self) -> None:
        self._cond = trio.Condition()
        self._calls = 0
        self._dumping = False

    @contextlib.asynccontextmanager
    async def call(self) -> AsyncIterator[None]:
        async with self._cond:
            while self._dumping:
                await self._cond.wait()
            self._calls += 1
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._cond:
                    self._calls -= 1
                    self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def dump(self) -> AsyncIterator[None]:
        async with self._cond:
            while self._dumping or self._calls:
                await self._cond.wait()
            self._dumping = True
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                async with self._cond:
                    self._dumping = False
                    self._cond.notify_all()


@dataclass
class _Instance:
    """One process tree and everything it holds on the host."""

    iid: str
    paths: mounts.SlotPaths
    cgroups: dict[str, str]
    checkpoint_id: str
    lower: tuple[Path, ...]
    pid: int = 0
    starttime: int = 0
    pidfd: int = -1
    exited: trio.Event = field(default_factory=trio.Event)
    gate: _AgentGate = field(default_factory=_AgentGate)
    restore_s: float = 0.0
    # Wall clock when criu began restoring this tree (kept when a spare is claimed: the tree ran
    # between its restore and its freeze). state_hash counts upper entries touched from then on
    # as the tree's own writes.
    restore_started_at: float = 0.0
    attempts: int = 1
    frozen: bool = False
    watched: bool = False
    exit_how: str = ""  # how the init ended, once `exited` is set (a quarantine says it)
    image_sha256: str = ""
    error: str = ""
    boot_proc: trio.Process | None = None
    phases: dict[str, float] = field(default_factory=dict)
    uid_index: int | None = None  # hardened: the slot's host uid range
    born: float = field(default_factory=time.monotonic)

    @property
    def sock(self) -> str:
        return f"/proc/{self.pid}/root/{AGENT_SOCK}"


@dataclass
class _Prepared:
    """A fs (tmpfs + upper copy + overlay) made ahead of a restore (warm_upper)."""

    iid: str
    paths: mounts.SlotPaths
    checkpoint_id: str
    uid_index: int | None = None


def _new_iid(prefix: str) -> str:
    return f"{prefix[:40]}-{secrets.token_hex(3)}"


def _agent_code(code: str) -> str:
    mapped = {"invalid_action": "invalid_request", "timeout": "timeout", "not_found": "not_found"}
    return mapped.get(code, "action_failed")


class RuntimeBase:
    """State shared by the runtime's parts (restores, slot I/O, dumps, cold boots, spares,
    adoption, KSM: one mixin each, combined in `LinuxRuntime`)."""

    def __init__(self, config: LinuxRuntimeConfig, driver: cgroups.CgroupDriver | None = None):
        self.config = config
        self.state_dir = config.state_dir
        # One cgroup group per state dir: sweep must never see another runtime's slots.
        group = "drums-" + hashlib.sha256(str(config.state_dir.resolve()).encode()).hexdigest()[:8]
        self.driver = driver or cgroups.detect_driver(group)
        self.restore_limiter = trio.CapacityLimiter(config.max_concurrent_restores)
        self._launcher: Launcher | None = None
        self._nursery: trio.Nursery | None = None
        self._helper: Path | None = None
        self._slots: dict[str, _Instance] = {}
        self._warm: dict[str, _Prepared] = {}
        self._spares: dict[str, list[_Instance]] = {}
        self._spare_refs: dict[str, tuple[CheckpointRef, SlotLimits]] = {}
        self._spare_wakeup = trio.Event()
        self._refill_running = False  # a spare refill restore is under way
        # Control-plane sizing (drumsd.core.spare_pool): spares wanted per checkpoint (capped by
        # spares_per_checkpoint) and whether admission control lets refills start right now.
        self._spare_targets: dict[str, int] = {}
        self.refill_allowed: Callable[[], bool] = lambda: True
        self._image_cache: dict[str, Path] = {}
        self._image_lock = trio.Lock()
        self._ksm_joined = False
        self._group_limit_mib: int | None = None  # the slots' group memory limit last set
        self._busy: set[str] = set()  # iids this runtime made and has not torn down yet
        self._ranges: set[int] = set()  # hardened uid ranges held by instances (or being made)
        # Host-wide claims, so daemons side by side never share a uid range or fight over KSM.
        self._uid_claims = host_share.UidRanges(config.state_dir.resolve())
        self._ksm_share = host_share.KsmShare(KSM_DIR)
        self._userns_fds: dict[int, int] = {}
        self.stats: dict[str, int] = {
            "spare_hits": 0,
            "spare_misses": 0,
            "restores": 0,
            "restore_retries": 0,
        }

    def _require_running(self) -> trio.Nursery:
        if self._nursery is None or self._launcher is None:
            raise RuntimeError_(
                "runtime_error", "the Linux runtime is not running; use open_linux_runtime()"
            )
        return self._nursery

    # ------------------------------------------------------------------ file systems

    def _busy_iid(self, prefix: str) -> str:
        """A new instance id, protected from sweep until it is registered or torn down."""
        iid = _new_iid(prefix)
        self._busy.add(iid)
        return iid

    @property
    def hardened(self) -> bool:
        return self.config.profile == "hardened"

    def _alloc_range(self) -> int | None:
        """The lowest free uid range (hardened), or None (trusted: identity map)."""
        if not self.hardened:
            return None
        index = self._uid_claims.claim_lowest(self._ranges)
        self._ranges.add(index)
        return index

    def _free_range(self, index: int) -> None:
        self._ranges.discard(index)
        self._uid_claims.release(index)

    def _userns_of(self, index: int) -> int:
        fd = self._userns_fds.get(index)
        if fd is None:
            fd = self._userns_fds[index] = idmap.userns_fd(idmap.range_map(index))
        return fd

    def _prepare_fs(
        self,
        iid: str,
        owner: str,
        upper_src: Path | None,
        lower: Sequence[Path],
        tmpfs_mib: int,
        uid_index: int | None = None,
    ) -> mounts.SlotPaths:
        """Blocking: the instance's dir, tmpfs, upper copy and overlay root (see
        `slot_fs.build_fs`); nothing is left behind when it fails."""
        paths = slot_fs.make_instance_dir(self.state_dir, iid, owner, uid_index)
        try:
            slot_fs.build_fs(
                paths, upper_src, lower, tmpfs_mib, uid_index, self._userns_of, self._helper
            )
        except BaseException:
            self._teardown_fs(paths)
            raise
        return paths

    def _teardown_fs(self, paths: mounts.SlotPaths) -> None:
        index = slot_fs.teardown_fs(paths)
        self._busy.discard(paths.dir.name)  # last: a concurrent sweep must not see it half-gone
        if index is not None:
            self._free_range(index)

    def _id_map(self, uid_index: int | None) -> tuple[tuple[int, int, int], ...]:
        return idmap.IDENTITY if uid_index is None else idmap.range_map(uid_index)

    # ------------------------------------------------------------------ supervision

    def _watch(self, inst: _Instance) -> None:
        self._require_running().start_soon(self._supervise, inst)
        inst.watched = True

    async def _supervise(self, inst: _Instance) -> None:
        """Own the pidfd: wait until the init exits, reap it if it is our child (restore-sibling
        makes it one) and keep how it ended (`exit_how`: no I/O, since a teardown waits for
        `exited`), close the pidfd."""
        fd = inst.pidfd
        try:
            await trio.lowlevel.wait_readable(fd)
            inst.exit_how = exit_text(reap_nohang(inst.pid))
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

    async def _wait_agent(self, inst: _Instance, timeout_s: float) -> None:
        deadline = trio.current_time() + timeout_s
        last: Exception | None = None
        while trio.current_time() < deadline:
            if inst.exited.is_set() or not procfs.is_same_process(inst.pid, inst.starttime):
                raise RuntimeError_(
                    "restore_failed",
                    f"slot init {inst.pid} exited before "
                    "its agent answered; see the desktop-init log in the slot",
                )
            try:
                await self._agent_raw(inst, {"op": "ping"}, 1.0)
                return
            except agent_client.AgentError as exc:
                last = exc
            await trio.sleep(0.003)
        raise RuntimeError_(
            "timeout",
            f"agent of instance {inst.iid} did not answer within "
            f"{timeout_s} s ({last}); the desktop may have failed to start",
        )

    async def _agent_raw(
        self, inst: _Instance, request: dict[str, Any], limit_s: float
    ) -> tuple[dict[str, Any], bytes]:
        async with inst.gate.call():
            return await agent_client.call(Path(inst.sock), request, timeout=limit_s)

    # ------------------------------------------------------------------ teardown

    def _kill_boot(self, inst: _Instance) -> None:
        """Before a cold boot's teardown (in trio's thread: the process handle needs it). A
        boot torn down before its exec helper joined the cgroups (a SIGTERM to drumsd right
        after the spawn) is in none of them: killed first, it never execs stage 1, else it
        boots a desktop that nothing owns (seen once, under load, in CI)."""
        boot = inst.boot_proc
        if boot is not None and boot.returncode is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                boot.kill()

    def _teardown(self, inst: _Instance) -> None:
        """Blocking: kill the tree, reap, remove cgroups and mounts. Nothing remains."""
        kill_tree(self.driver, inst.cgroups, inst.pid, inst.pidfd)
        self._teardown_fs(inst.paths)
        if not inst.watched and inst.pidfd >= 0:  # a watched pidfd is closed by its watcher
            close_fd(inst.pidfd)
            inst.pidfd = -1

    def _cleanup_scope(self) -> trio.CancelScope:
        """A shield with its own deadline for cleanup that must survive the caller's cancel."""
        return trio.move_on_after(self.config.cleanup_timeout_s, shield=True)

    @trio.lowlevel.enable_ki_protection
    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A blocking cleanup step in a thread the caller's deadline can abandon (the thread
        goes on and finishes the step). KI-protected: a Ctrl-C waits for the step instead of
        abandoning it to a process about to exit."""
        return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)

    async def _dispose(self, inst: _Instance, background: bool) -> None:
        async def go() -> None:
            with self._cleanup_scope() as scope:
                self._kill_boot(inst)
                await self._off_loop(self._teardown, inst)
                if inst.boot_proc is not None:
                    await inst.boot_proc.wait()
                if inst.watched:
                    with trio.move_on_after(5):
                        await inst.exited.wait()
            if scope.cancelled_caught:
                _log(
                    "teardown_overran",
                    iid=inst.iid,
                    pid=inst.pid,
                    timeout_s=self.config.cleanup_timeout_s,
                )

        if background and self._nursery is not None:
            self._nursery.start_soon(go)
        else:
            await go()

    # ------------------------------------------------------------------ handles

    def _handle(self, slot_id: str, inst: _Instance, spare: bool = False) -> SlotHandle:
        return SlotHandle(
            slot_id=slot_id,
            init_pid=inst.pid,
            init_starttime=inst.starttime,
            root=inst.paths.root,
            upper=inst.paths.upper,
            checkpoint_id=inst.checkpoint_id,
            cgroups=dict(inst.cgroups),
            namespaces=procfs.namespaces(inst.pid),
            restore_s=inst.restore_s,
            attempts=inst.attempts,
            extra={
                "iid": inst.iid,
                "lower": [str(p) for p in inst.lower],
                "spare": spare,
                "cgroup_version": self.driver.version,
                "profile": self.config.profile,
                "image_sha256": inst.image_sha256,
                "phases": dict(inst.phases),
                "restore_started_at": inst.restore_started_at or None,
                "uid_index": inst.uid_index,
                "uid_base": None if inst.uid_index is None else idmap.uid_base(inst.uid_index),
            },
        )

    def _inst(self, handle: SlotHandle) -> _Instance:
        inst = self._slots.get(handle.slot_id)
        if inst is None or inst.pid != handle.init_pid:
            raise RuntimeError_(
                "runtime_error",
                f"slot {handle.slot_id} (pid {handle.init_pid})"
                " is not served by this runtime; adopt() it or create it again",
            )
        return inst
