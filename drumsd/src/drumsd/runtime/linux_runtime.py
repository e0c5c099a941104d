"""The Linux slot runtime: CRIU restores of a desktop into their own namespaces, cgroups and
copy-on-write overlay roots (the `SlotRuntime` the control plane calls).

Vocabulary: an *instance* is one restored (or booted) process tree with its own directory
`state_dir/slots/<iid>` (a tmpfs holding the upper layer, the overlay root, CRIU's work dir) and its
own cgroups named `<iid>`. A *slot* is the control plane's name for whichever instance currently
serves it: a reset swaps the instance (the old one is torn down in the background). Every instance
dir holds `owner.json` naming its slot, so a restarted daemon can sweep what no live slot owns.

Use it inside `open_linux_runtime(config)`: the runtime owns a nursery for supervision (pidfds),
background kills, warm uppers and spare refills.
"""

# Small /proc reads and readiness polls of /proc stay inline on purpose (microseconds, and no
# event exists for "a file appeared in another mount namespace").
# ruff: noqa: ASYNC109, ASYNC110, ASYNC230, ASYNC240

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from drumsd.core.seams import (
    CheckpointRef,
    CommandResult,
    RuntimeError_,
    SlotFacts,
    SlotHandle,
    SlotLimits,
    StepOutcome,
)
from drumsd.guest import protocol
from drumsd.linux import beneath, cgroups, criu, host_share, idmap, mounts, procfs, trees
from drumsd.linux.exec_helper import ensure_exec_helper, helper_argv, overlay_as_argv
from drumsd.linux.launcher import Launcher
from drumsd.linux.trees import tree_sha256
from drumsd.runtime import agent_client

AGENT_SOCK = protocol.SOCKET_PATH.lstrip("/")
READY_FILE = protocol.READY_PATH.lstrip("/")
DESKTOP_UID = 1000
TEMPLATE_LIMITS = SlotLimits(vcpus=2.0, memory_mib=4096, pids_max=4096, tmpfs_mib=1024)
KSM_DIR = Path("/sys/kernel/mm/ksm")
REAP_TIMEOUT_S = 10.0  # a SIGKILLed tree's init exits within this (bounded pidfd wait)
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
            ksm=cfg.ksm.enabled,
            ksm_pages_to_scan=cfg.ksm.pages_to_scan,
            ksm_sleep_millisecs=cfg.ksm.sleep_millisecs,
            spares_per_checkpoint=cfg.spares.per_checkpoint if cfg.spares.enabled else 0,
            spares_per_host=cfg.spares.per_host,
            spare_max_age_s=cfg.spares.max_age_s,
            quiesce_window_s=cfg.quiesce.window_s,
            quiesce_timeout_s=cfg.quiesce.timeout_s,
            quiesce_poll_ms=cfg.quiesce.poll_ms,
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


def _read_owner_record(d: Path) -> dict[str, Any]:
    try:
        record = json.loads((d / "owner.json").read_text())
        return record if isinstance(record, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_owner(
    paths: mounts.SlotPaths,
    owner: str | None,
    uid_index: int | None = None,
    init: tuple[int, int] | None = None,
) -> None:
    """owner.json: who the instance serves, hardened its uid range, and its init (pid,
    starttime) so a sweep can kill it even if its cgroups moved (kept across claims)."""
    record = _read_owner_record(paths.dir)
    if owner is not None:
        record["owner"] = owner
    if uid_index is not None:
        record["uid_index"] = uid_index
    if init is not None:
        record["init"] = list(init)
    tmp = paths.dir / "owner.json.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, paths.dir / "owner.json")


def _read_owner(d: Path) -> str | None:
    owner = _read_owner_record(d).get("owner")
    return str(owner) if owner is not None else None


class LinuxRuntime:
    """The `SlotRuntime` on Linux. Construct with a `LinuxRuntimeConfig`, then run it inside
    `open_linux_runtime` (or start `run()` in a nursery you own)."""

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
        # Control-plane sizing (drumsd.core.spare_pool): spares wanted per checkpoint (capped by
        # spares_per_checkpoint) and whether admission control lets refills start right now.
        self._spare_targets: dict[str, int] = {}
        self.refill_allowed: Callable[[], bool] = lambda: True
        self._image_cache: dict[str, Path] = {}
        self._image_lock = trio.Lock()
        self._ksm_joined = False
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

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the background work until cancelled; on exit, live slots keep running (a restarted
        daemon adopts them) but spares and warm uppers are removed."""
        (self.state_dir / "slots").mkdir(parents=True, exist_ok=True)
        for d in (self.state_dir / "slots").iterdir():
            index = _read_owner_record(d).get("uid_index")
            if isinstance(index, int):
                self._ranges.add(index)  # held by a slot of a previous daemon until swept
        if self.hardened:
            for index in self._uid_claims.recover(self._ranges):
                _log("uid_range_conflict", index=index, claims=self._uid_claims.root)
        self._helper = await trio.to_thread.run_sync(ensure_exec_helper, self.state_dir / "bin")
        try:
            self.driver.set_group_weight(self.config.group_cpu_shares)
        except (cgroups.CgroupError, OSError) as exc:
            _log("group_cpu_weight_unset", error=exc)
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
                        os.close(inst.pidfd)
                self._launcher.close()
                self._ksm_restore()
                for fd in self._userns_fds.values():
                    os.close(fd)
                self._userns_fds.clear()
                self.driver.remove_group_if_empty()
                if not self._slots:  # nothing left to adopt: the image cache goes too
                    await trio.to_thread.run_sync(self._drop_image_cache)

    def _drop_image_cache(self) -> None:
        cache = self.state_dir / "images"
        if cache.is_dir() and mounts.fs_type_of(cache) == "tmpfs":
            mounts.apply([mounts.MountOp("umount", str(cache))])
        shutil.rmtree(cache, ignore_errors=True)
        self._image_cache.clear()

    def _require_running(self) -> trio.Nursery:
        if self._nursery is None or self._launcher is None:
            raise RuntimeError_(
                "runtime_error", "the Linux runtime is not running; use open_linux_runtime()"
            )
        return self._nursery

    def _ksm_on(self) -> None:
        wanted = {
            "run": "1",
            "pages_to_scan": str(self.config.ksm_pages_to_scan),
            "sleep_millisecs": str(self.config.ksm_sleep_millisecs),
        }
        try:
            failed = self._ksm_share.join(wanted)
        except OSError as exc:
            _log("ksm_unavailable", claims=self._ksm_share.root, error=exc.strerror)
            return
        for name in failed:
            _log("ksm_unavailable", file=KSM_DIR / name)
        self._ksm_joined = True

    def _ksm_restore(self) -> None:
        # The host's values come back only when the last daemon using KSM leaves.
        if self._ksm_joined:
            with contextlib.suppress(OSError):
                self._ksm_share.leave()
            self._ksm_joined = False

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
        """The instance's tmpfs with a copy of the upper snapshot and the overlay root. Hardened:
        the image and the tmpfs are seen through idmapped binds of the slot's uid range (files
        on disk keep in-slot ids) and the overlay is mounted acting as the range's root."""
        paths = mounts.SlotPaths.of(self.state_dir, iid)
        paths.dir.mkdir(parents=True, exist_ok=False)
        _write_owner(paths, owner, uid_index)
        try:
            mounts.apply(mounts.plan_rw(paths, tmpfs_mib))
            if upper_src is not None and upper_src.is_dir():
                trees.copy_tree(upper_src, paths.upper)
            (paths.rw / "criu").mkdir()
            if uid_index is None:
                mounts.apply(mounts.plan_overlay(paths, lower))
                return paths
            ns = self._userns_of(uid_index)
            mapped: list[Path] = []
            for i, layer in enumerate(lower):
                target = paths.dir / f"lower{i}"
                target.mkdir()
                idmap.idmapped_bind(layer, target, ns, readonly=True)
                mapped.append(target)
            rwi = paths.dir / "rw-idmap"
            rwi.mkdir()
            idmap.idmapped_bind(paths.rw, rwi, ns, readonly=False)
            opts = mounts.overlay_options(mapped, rwi / "upper", rwi / "work")
            proc = subprocess.run(
                overlay_as_argv(self._helper, idmap.uid_base(uid_index), paths.root, opts),
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                raise OSError(f"overlay for {iid} failed: {proc.stderr.strip()}")
        except BaseException:
            self._teardown_fs(paths)
            raise
        return paths

    def _teardown_fs(self, paths: mounts.SlotPaths) -> None:
        index = _read_owner_record(paths.dir).get("uid_index")
        for m in mounts.mounts_under(paths.dir):
            mounts.apply([mounts.MountOp("umount", m)])
        shutil.rmtree(paths.dir, ignore_errors=True)
        self._busy.discard(paths.dir.name)  # last: a concurrent sweep must not see it half-gone
        if isinstance(index, int):
            self._free_range(index)

    def _id_map(self, uid_index: int | None) -> tuple[tuple[int, int, int], ...]:
        return idmap.IDENTITY if uid_index is None else idmap.range_map(uid_index)

    async def _images_for(self, checkpoint: CheckpointRef, uid_index: int | None) -> Path:
        """The checkpoint's images with the userns map of the target range (a dir of hard links
        and a rewritten userns image, made once per range next to the images)."""
        images = await self._images_of(checkpoint)
        extents = self._id_map(uid_index)
        userns_imgs = sorted(images.glob("userns-*.img"))
        if not userns_imgs:
            return images
        current = idmap.decode_userns_image(userns_imgs[0].read_bytes()).uid_map
        if tuple(current) == tuple(extents):
            return images
        tag = "identity" if uid_index is None else str(uid_index)
        variant = images.parent / f".{images.name}-map-{tag}"
        if not variant.exists():
            async with self._image_lock:
                if not variant.exists():
                    await trio.to_thread.run_sync(idmap.images_for_map, images, variant, extents)
        return variant

    async def _images_of(self, checkpoint: CheckpointRef) -> Path:
        """CRIU images on tmpfs: used in place when already there, else copied once into the
        runtime's own tmpfs (a restore that reads disk is 3x slower)."""
        images = checkpoint.dir / "images"
        if not (images / "inventory.img").exists():
            raise RuntimeError_(
                "restore_failed",
                f"checkpoint {checkpoint.id}: no CRIU images at {images}; re-create the "
                "checkpoint (make_template or capture)",
            )
        if mounts.fs_type_of(images) == "tmpfs":
            return images
        st = (images / "inventory.img").stat()
        key = f"{checkpoint.id}-{st.st_ino}-{st.st_mtime_ns}"
        async with self._image_lock:
            if key in self._image_cache:
                return self._image_cache[key]
            cache = self.state_dir / "images"
            cache.mkdir(parents=True, exist_ok=True)
            if mounts.fs_type_of(cache) != "tmpfs":
                mounts.apply(
                    [
                        mounts.MountOp(
                            "mount",
                            str(cache),
                            source="drums-images",
                            fstype="tmpfs",
                            data=f"size={self.config.images_tmpfs_mib}m,mode=700",
                        )
                    ]
                )
            dest = cache / key
            if not dest.exists():
                tmp = cache / f"{key}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                await trio.to_thread.run_sync(shutil.copytree, images, tmp)
                os.replace(tmp, dest)
            self._image_cache[key] = dest
            return dest

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
                await trio.to_thread.run_sync(_write_owner, paths, owner)
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
        if done.returncode != 0 or not pidfile.exists():
            errors = criu.log_errors(
                (work / "restore.log").read_text(errors="replace")
                if (work / "restore.log").exists()
                else ""
            )
            out = criu.tail(work / "criu.out", 3)
            inst.error = (
                f"criu restore timed out after {self.config.restore_timeout_s} s"
                if done.timed_out
                else f"criu exit {done.returncode}: {errors or out}"
            )
            return False
        inst.pid = int(pidfile.read_text().strip())
        inst.pidfd = os.pidfd_open(inst.pid)
        inst.starttime = procfs.starttime(inst.pid) or 0
        _write_owner(inst.paths, None, init=(inst.pid, inst.starttime))
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
        inst.phases["restore_cpu"] = round(done.cpu_s + ticks / os.sysconf("SC_CLK_TCK"), 4)
        self._watch(inst)
        return True

    def _watch(self, inst: _Instance) -> None:
        self._require_running().start_soon(self._supervise, inst)
        inst.watched = True

    async def _supervise(self, inst: _Instance) -> None:
        """Own the pidfd: wait until the init exits, reap it if it is our child (restore-sibling
        makes it one), close the pidfd."""
        fd = inst.pidfd
        try:
            await trio.lowlevel.wait_readable(fd)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(inst.pid, os.WNOHANG)  # noqa: ASYNC222 (WNOHANG: never blocks)
        finally:
            inst.exited.set()
            trio.lowlevel.notify_closing(fd)
            os.close(fd)
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
        if inst.cgroups:
            with contextlib.suppress(cgroups.CgroupError, OSError):
                self.driver.kill(inst.cgroups)
        if inst.pid:
            with contextlib.suppress(ProcessLookupError, OSError):
                if inst.pidfd >= 0:
                    signal.pidfd_send_signal(inst.pidfd, signal.SIGKILL)
            # Bounded: pidfd readiness, then a WNOHANG reap (never an unbounded waitpid).
            procfs.reap(inst.pid, REAP_TIMEOUT_S)
        if inst.cgroups:
            self.driver.kill(inst.cgroups)
            self.driver.remove(inst.cgroups)
        self._teardown_fs(inst.paths)
        if not inst.watched and inst.pidfd >= 0:  # a watched pidfd is closed by its watcher
            os.close(inst.pidfd)
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

    def _check_lower(self, checkpoint: CheckpointRef) -> None:
        if not checkpoint.lower.is_dir():
            raise RuntimeError_(
                "restore_failed",
                f"checkpoint {checkpoint.id}: lower layer "
                f"{checkpoint.lower} is missing; rebuild the image",
            )

    # ------------------------------------------------------------------ SlotRuntime

    async def restore(
        self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        self._check_lower(checkpoint)
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
        self._check_lower(checkpoint)
        old = self._slots.pop(handle.slot_id, None)
        if old is not None:
            await self._dispose(old, background=self.config.async_kill)
        try:
            inst = await self._claim_spare(handle.slot_id, checkpoint, limits)
            spare = inst is not None
            if inst is None:
                prepared = self._warm.pop(handle.slot_id, None)
                inst = await self._restore_instance(
                    f"slot:{handle.slot_id}", checkpoint, limits, prepared=prepared
                )
        except BaseException:
            with self._cleanup_scope():
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

    def _after_restore(self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        if self.config.warm_upper and slot_id not in self._warm and self._nursery is not None:
            self._nursery.start_soon(self._make_warm, slot_id, checkpoint, limits)

    async def _make_warm(self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        iid = self._busy_iid(f"warm-{slot_id}")
        index = self._alloc_range()
        try:
            with trio.CancelScope(shield=True):
                paths = await trio.to_thread.run_sync(
                    self._prepare_fs,
                    iid,
                    f"warm:{slot_id}",
                    checkpoint.dir / "upper",
                    (checkpoint.lower,),
                    limits.tmpfs_mib,
                    index,
                )
        except OSError as exc:
            if index is not None:
                self._free_range(index)
            _log("warm_upper_failed", slot=slot_id, error=exc)
            return
        if slot_id in self._slots and slot_id not in self._warm:
            self._warm[slot_id] = _Prepared(iid, paths, checkpoint.id, index)
        else:
            await trio.to_thread.run_sync(self._teardown_fs, paths)

    async def _drop_warm(self, slot_id: str) -> None:
        prep = self._warm.pop(slot_id, None)
        if prep is not None:
            await self._off_loop(self._teardown_fs, prep.paths)

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

    async def _agent_raw(
        self, inst: _Instance, request: dict[str, Any], timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        async with inst.gate.call():
            return await agent_client.call(Path(inst.sock), request, timeout=timeout)

    async def _agent(
        self, handle: SlotHandle, request: dict[str, Any], timeout: float
    ) -> tuple[dict[str, Any], bytes]:
        inst = self._inst(handle)
        try:
            return await self._agent_raw(inst, request, timeout)
        except agent_client.AgentError as exc:
            if exc.code in (agent_client.UNREACHABLE, "failed") and not procfs.is_same_process(
                inst.pid, inst.starttime
            ):
                raise RuntimeError_(
                    "runtime_error",
                    f"slot {handle.slot_id} died ({exc.message}); reset it",
                    slot=handle.slot_id,
                ) from exc
            raise RuntimeError_(_agent_code(exc.code), exc.message, slot=handle.slot_id) from exc

    async def step(self, handle: SlotHandle, action: Mapping[str, Any]) -> StepOutcome:
        try:
            parsed = protocol.parse_action(dict(action))
        except protocol.ProtocolError as exc:
            raise RuntimeError_("invalid_request", exc.message) from exc
        timeout = protocol.step_timeout(parsed, None) + 5.0
        t0 = time.monotonic()
        header, _ = await self._agent(handle, {"op": "step", "action": dict(action)}, timeout)
        result = header.get("result") or {}
        output = None
        if "rc" in result:
            output = CommandResult(
                int(result["rc"]), str(result.get("stdout", "")), str(result.get("stderr", ""))
            )
        return StepOutcome(parsed.type, time.monotonic() - t0, output)

    async def windows(self, handle: SlotHandle) -> list[dict[str, Any]]:
        """Top-level windows as the guest agent reads them from the X server (id, name,
        instance, class, geometry, active): no window tool needed in the image."""
        header, _ = await self._agent(handle, {"op": "windows"}, 10.0)
        return list(header.get("windows") or [])

    async def screenshot(self, handle: SlotHandle) -> bytes:
        _, png = await self._agent(handle, {"op": "screenshot"}, 15.0)
        return png

    async def exec_user(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        request: dict[str, Any] = {"op": "exec", "timeout_s": timeout_s}
        request["shell" if isinstance(command, str) else "argv"] = (
            command if isinstance(command, str) else list(command)
        )
        header, _ = await self._agent(handle, request, timeout_s + 5.0)
        return CommandResult(
            int(header.get("rc", -1)), str(header.get("stdout", "")), str(header.get("stderr", ""))
        )

    def _nsenter(self, inst: _Instance, argv: Sequence[str], uid: int | None = None) -> list[str]:
        ids = ["-S", str(uid), "-G", str(uid)] if uid is not None else []
        # -U: act as the slot's root (hardened: an unprivileged host uid), never as host root.
        ns = ["nsenter", "-t", str(inst.pid), "-U", "-m", "-u", "-i", "-n", "-p", "-r", "-w", *ids]
        return helper_argv(
            self._helper,
            self.driver.procs_files(inst.cgroups),
            False,
            [shutil.which("nsenter") or "/usr/bin/nsenter", *ns[1:], "--", *argv],
        )

    async def _run_in_slot(
        self,
        inst: _Instance,
        argv: Sequence[str],
        timeout_s: float,
        stdin: bytes = b"",
        uid: int | None = None,
    ) -> CommandResult:
        try:
            with trio.fail_after(timeout_s):
                proc = await trio.run_process(
                    self._nsenter(inst, argv, uid),
                    stdin=stdin,
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
        except trio.TooSlowError as exc:
            raise RuntimeError_(
                "timeout",
                f"command {list(argv)!r} in slot instance {inst.iid} ran over {timeout_s} s",
            ) from exc
        return CommandResult(
            proc.returncode,
            proc.stdout.decode(errors="replace"),
            proc.stderr.decode(errors="replace"),
        )

    async def exec_trusted(
        self, handle: SlotHandle, command: str, timeout_s: float
    ) -> CommandResult:
        return await self._run_in_slot(self._inst(handle), ["/bin/sh", "-c", command], timeout_s)

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes:
        # From the host side, beneath the slot's root: no process in the slot (the desktop user
        # included) can answer in the guest agent's place (issue 14).
        inst = self._inst(handle)
        where = path if path.startswith("/") else f"/home/user/{path}"
        try:
            return await trio.to_thread.run_sync(
                beneath.read_regular, f"/proc/{inst.pid}/root", where, max_bytes
            )
        except FileNotFoundError as exc:
            raise RuntimeError_(
                "not_found", f"{path} does not exist in slot {handle.slot_id}"
            ) from exc
        except beneath.TooLarge as exc:
            raise RuntimeError_(
                "invalid_request",
                f"{path} in slot {handle.slot_id} is {exc.size} bytes, over max_bytes={max_bytes}",
            ) from exc
        except OSError as exc:
            raise RuntimeError_(
                "failed", f"cannot read {path} in slot {handle.slot_id}: {exc.strerror or exc}"
            ) from exc

    async def write_file(
        self, handle: SlotHandle, path: str, data: bytes, *, user: bool = True
    ) -> None:
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        res = await self._run_in_slot(
            self._inst(handle),
            ["/bin/sh", "-c", script, "sh", path],
            60.0,
            stdin=data,
            uid=DESKTOP_UID if user else None,
        )
        if res.returncode != 0:
            raise RuntimeError_(
                "action_failed",
                f"writing {path} in slot {handle.slot_id} failed: {res.stderr.strip()}",
            )

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        inst = self._slots.get(handle.slot_id)
        pid = handle.init_pid
        identity = procfs.is_same_process(pid, handle.init_starttime)
        alive = identity and (inst is None or not inst.exited.is_set())
        dirs = dict(handle.cgroups)

        def read() -> SlotFacts:
            limits: dict[str, Any] = {}
            oom = 0
            pids: list[int] = []
            memory_mib: float | None = None
            with contextlib.suppress(OSError):
                limits = dict(self.driver.limits_in_force(dirs))
                oom = self.driver.oom_kills(dirs)
                pids = self.driver.pids(dirs)
            with contextlib.suppress(OSError, ValueError):
                memory_mib = self.driver.memory_bytes(dirs) / 2**20
            try:
                mountinfo = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                netdev = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]
            except OSError:
                mountinfo, netdev = [], []
            links = [ln.split(":")[0].strip() for ln in netdev]
            try:
                uid_map = Path(f"/proc/{pid}/uid_map").read_text().split()
            except OSError:
                uid_map = []
            return SlotFacts(
                alive=alive,
                init_identity_ok=identity,
                limits_in_force=limits,
                mounts=mountinfo,
                net_links=links,
                namespaces=procfs.namespaces(pid),
                oom_kills=oom,
                pids=pids,
                extra={
                    "host_namespaces": procfs.namespaces("self"),
                    "cgroup_version": self.driver.version,
                    "cgroups": dirs,
                    "profile": self.config.profile,
                    "uid_map": uid_map,
                    "memory_mib": memory_mib,
                },
            )

        return await trio.to_thread.run_sync(read)

    async def wait_exit(self, handle: SlotHandle) -> None:
        inst = self._slots.get(handle.slot_id)
        if inst is None or inst.pid != handle.init_pid:
            while procfs.is_same_process(handle.init_pid, handle.init_starttime):
                await trio.sleep(0.1)
            return
        await inst.exited.wait()

    async def quiescent(
        self, handle: SlotHandle, window_s: float, timeout_s: float, poll_ms: int
    ) -> bool:
        inst = self._inst(handle)
        return await self._quiescent(inst, window_s, timeout_s, poll_ms)

    async def _quiescent(
        self, inst: _Instance, window_s: float, timeout_s: float, poll_ms: int
    ) -> bool:
        deadline = trio.current_time() + timeout_s
        since = trio.current_time()
        last = procfs.activity(self.driver.pids(inst.cgroups))
        while trio.current_time() < deadline:
            await trio.sleep(poll_ms / 1000)
            now = procfs.activity(self.driver.pids(inst.cgroups))
            if now != last:
                last, since = now, trio.current_time()
            elif trio.current_time() - since >= window_s:
                return True
        return False

    # ------------------------------------------------------------------ dump

    async def _dump(
        self,
        inst: _Instance,
        checkpoint_id: str,
        dest: Path,
        image_sha256: str,
        leave_running: bool,
        parent: str | None,
    ) -> CheckpointRef:
        assert self._launcher is not None
        if (dest / "images").exists():
            raise RuntimeError_(
                "invalid_request",
                f"{dest} already holds a checkpoint; pick a new checkpoint id or delete it",
            )
        images, upper = dest / "images", dest / "upper"
        images.mkdir(parents=True)
        script = dest / "post-dump.sh"
        script.write_text(criu.action_script(inst.paths.upper, upper))
        script.chmod(0o700)
        argv = criu.dump_argv(
            self.config.criu, inst.pid, images, script, leave_running=leave_running
        )
        t0 = time.monotonic()
        async with inst.gate.dump():
            done = await self._launcher.run(
                argv, dest / "criu.out", timeout_s=self.config.dump_timeout_s
            )
        dump_s = time.monotonic() - t0
        if done.returncode != 0 or not upper.is_dir():
            errors = criu.log_errors(
                (images / "dump.log").read_text(errors="replace")
                if (images / "dump.log").exists()
                else ""
            )
            shutil.rmtree(dest, ignore_errors=True)
            raise RuntimeError_(
                "runtime_error",
                f"criu dump of instance {inst.iid} failed "
                f"(exit {done.returncode}): {errors}; is an agent connection or "
                "a host fd open in the tree?",
            )
        script.unlink()
        upper_sha = await trio.to_thread.run_sync(tree_sha256, upper)
        meta = {
            "id": checkpoint_id,
            "lower": [str(p) for p in inst.lower],
            "image_sha256": image_sha256,
            "upper_sha256": upper_sha,
            "parent": parent,
            "profile": self.config.profile,
            "dump_s": round(dump_s, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "criu": str(self.config.criu),
        }
        (dest / "meta.json").write_text(json.dumps(meta, indent=1))
        _log(
            "dumped",
            iid=inst.iid,
            checkpoint=checkpoint_id,
            dump_s=f"{dump_s:.3f}",
            leave_running=leave_running,
        )
        return CheckpointRef(
            checkpoint_id, dest, inst.lower[0], image_sha256, upper_sha, self.config.profile
        )

    async def capture(self, handle: SlotHandle, checkpoint_id: str, dest: Path) -> CheckpointRef:
        inst = self._inst(handle)
        return await self._dump(
            inst, checkpoint_id, dest, inst.image_sha256, True, inst.checkpoint_id
        )

    async def branch(
        self,
        handle: SlotHandle,
        source: CheckpointRef,
        child_ids: Sequence[str],
        limits: SlotLimits,
    ) -> list[SlotHandle]:
        self._inst(handle)
        results: dict[str, SlotHandle] = {}

        async def one(cid: str) -> None:
            results[cid] = await self.restore(cid, source, limits)

        try:
            async with trio.open_nursery() as nursery:
                for cid in child_ids:
                    nursery.start_soon(one, cid)
        except BaseException:
            with self._cleanup_scope():
                for done_id in results:
                    await self.destroy(done_id)
            raise
        return [results[c] for c in child_ids]

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
        image_root = image_root.resolve()
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
            meta = json.loads((dest / "meta.json").read_text())
            meta["boot_s"] = round(boot_s, 3)
            (dest / "meta.json").write_text(json.dumps(meta, indent=1))
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
            pkg_root = Path(__file__).resolve().parents[2]
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
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(pkg_root)}
            t0 = time.monotonic()
            log = open(paths.rw / "criu" / "boot.out", "ab")
            proc = await trio.lowlevel.open_process(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
            log.close()
            inst.boot_proc = proc
            deadline = trio.current_time() + 10
            while not (init := procfs.find_ns_init(proc.pid)):
                if proc.returncode is not None or trio.current_time() > deadline:
                    raise RuntimeError_(
                        "runtime_error",
                        "stage1 did not start: "
                        + " | ".join(criu.tail(paths.rw / "criu/boot.out", 5)),
                    )
                await trio.sleep(0.005)
            inst.pid = init
            inst.pidfd = os.pidfd_open(inst.pid)
            inst.starttime = procfs.starttime(inst.pid) or 0
            _write_owner(paths, None, init=(inst.pid, inst.starttime))
            self._watch(inst)
            try:
                await self._wait_agent(inst, self.config.boot_timeout_s)
            except RuntimeError_ as exc:
                # The instance dir goes with the teardown: keep the evidence in the error.
                stage1_log = " | ".join(criu.tail(paths.rw / "criu" / "boot.out", 6))
                init_log = " | ".join(criu.tail(paths.upper / "var/log/desktop-init.log", 6))
                raise RuntimeError_(
                    exc.code,
                    f"{exc.message}; stage1: {stage1_log or '-'}; desktop-init: {init_log or '-'}",
                    image=str(image_root),
                ) from exc
            ready = Path(f"/proc/{inst.pid}/root/{READY_FILE}")
            deadline = trio.current_time() + self.config.boot_timeout_s
            while not ready.exists() and trio.current_time() < deadline:
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
                ready_file=ready.exists(),
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

    # ------------------------------------------------------------------ restart

    async def adopt(self, handle: SlotHandle) -> bool:
        self._require_running()
        if not procfs.is_same_process(handle.init_pid, handle.init_starttime):
            return False
        iid = str(handle.extra.get("iid") or Path(handle.root).parent.name)
        inst = _Instance(
            iid,
            mounts.SlotPaths(Path(handle.root).parent),
            dict(handle.cgroups),
            handle.checkpoint_id,
            tuple(Path(p) for p in handle.extra.get("lower", [])),
            pid=handle.init_pid,
            starttime=handle.init_starttime,
            pidfd=os.pidfd_open(handle.init_pid),
            restore_s=handle.restore_s,
            restore_started_at=float(handle.extra.get("restore_started_at") or 0.0),
            image_sha256=str(handle.extra.get("image_sha256", "")),
            uid_index=handle.extra.get("uid_index"),
        )
        if inst.uid_index is not None:
            self._ranges.add(inst.uid_index)
        self._slots[handle.slot_id] = inst
        self._watch(inst)
        _log("adopted", slot=handle.slot_id, iid=iid, pid=inst.pid)
        return True

    def _owned_in_memory(self) -> set[str]:
        iids = {i.iid for i in self._slots.values()} | set(self._busy)
        iids |= {p.iid for p in self._warm.values()}
        iids |= {i.iid for pool in self._spares.values() for i in pool}
        return iids

    def _cleanup_iid(self, iid: str) -> None:
        dirs = self.driver.dirs_of(iid)
        pids = self.driver.pids(dirs) if Path(dirs["pids"]).exists() else []
        init = _read_owner_record(mounts.SlotPaths.of(self.state_dir, iid).dir).get("init")
        if isinstance(init, list) and len(init) == 2 and procfs.is_same_process(*init):
            # Its cgroups may live elsewhere (a daemon run in another cgroup): kill the init,
            # which takes the whole pid namespace with it.
            with contextlib.suppress(ProcessLookupError):
                os.kill(init[0], signal.SIGKILL)
            pids.append(init[0])
        with contextlib.suppress(cgroups.CgroupError, OSError):
            self.driver.kill(dirs)
        # A slot init restored by this process (restore-sibling) is our child: reap it.
        for pid in pids:
            procfs.reap(pid, REAP_TIMEOUT_S)
        with contextlib.suppress(cgroups.CgroupError, OSError):
            self.driver.remove(dirs)
        self._teardown_fs(mounts.SlotPaths.of(self.state_dir, iid))

    def _sweep_owned_by(self, owners: set[str]) -> list[str]:
        cleaned = []
        base = self.state_dir / "slots"
        if base.is_dir():
            for d in base.iterdir():
                if d.name not in self._owned_in_memory() and _read_owner(d) in owners:
                    self._cleanup_iid(d.name)
                    cleaned.append(d.name)
        return cleaned

    async def sweep(self, live_slot_ids: Sequence[str]) -> list[str]:
        live = set(live_slot_ids)

        def go() -> list[str]:
            keep = self._owned_in_memory()
            cleaned: list[str] = []
            base = self.state_dir / "slots"
            names = set(self.driver.slot_names())
            if base.is_dir():
                names |= {d.name for d in base.iterdir()}
            for iid in sorted(names - keep):
                owner = _read_owner(base / iid) or ""
                kind, _, sid = owner.partition(":")
                if kind == "slot" and sid in live:
                    continue
                self._cleanup_iid(iid)
                cleaned.append(iid)
            return cleaned

        cleaned = await trio.to_thread.run_sync(go)
        if cleaned:
            _log("swept", instances=",".join(cleaned))
        return cleaned

    # ------------------------------------------------------------------ warm spares

    def enable_spares(self, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        """Keep `spares_per_checkpoint` frozen restores of `checkpoint` ready for claims."""
        if self.config.spares_per_checkpoint <= 0:
            return
        self._spare_refs[checkpoint.id] = (checkpoint, limits)
        self._spare_wakeup.set()

    def set_spare_target(self, checkpoint_id: str, n: int) -> None:
        """How many spares `checkpoint_id` should keep (at most spares_per_checkpoint); extra
        spares are disposed of on the next pass of the refiller."""
        if self._spare_targets.get(checkpoint_id) != n:
            self._spare_targets[checkpoint_id] = n
            self._spare_wakeup.set()

    def _spare_target(self, checkpoint_id: str) -> int:
        wanted = self._spare_targets.get(checkpoint_id, self.config.spares_per_checkpoint)
        return max(0, min(wanted, self.config.spares_per_checkpoint))

    async def drop_spares(self, checkpoint_id: str) -> None:
        """A checkpoint deleted or replaced: its spares go."""
        self._spare_refs.pop(checkpoint_id, None)
        self._spare_targets.pop(checkpoint_id, None)
        for inst in self._spares.pop(checkpoint_id, []):
            await self._dispose(inst, background=False)

    async def forget_checkpoint(self, checkpoint_id: str) -> None:
        """A checkpoint was deleted or replaced: drop its spares and its image copies on the
        runtime's tmpfs (they would otherwise hold its memory image in RAM)."""
        await self.drop_spares(checkpoint_id)
        for key in [k for k in self._image_cache if k.rsplit("-", 2)[0] == checkpoint_id]:
            path = self._image_cache.pop(key)
            for d in [path, *path.parent.glob(f".{path.name}-map-*")]:
                await trio.to_thread.run_sync(shutil.rmtree, d, True)

    def ksm_stats(self) -> dict[str, int | bool]:
        """For /v1/health and metrics: whether KSM is on and the memory it saves right now."""
        out: dict[str, int | bool] = {"enabled": self.config.ksm}
        page = os.sysconf("SC_PAGE_SIZE")
        for name in ("pages_shared", "pages_sharing", "pages_unshared", "full_scans"):
            with contextlib.suppress(OSError, ValueError):
                out[name] = int((KSM_DIR / name).read_text())
        out["saved_bytes"] = int(out.get("pages_sharing", 0)) * page
        return out

    def spare_counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._spares.items()}

    async def _claim_spare(
        self, slot_id: str, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> _Instance | None:
        ref = self._spare_refs.get(checkpoint.id)
        if ref is None or ref[0].dir != checkpoint.dir or ref[1] != limits:
            return None
        pool = self._spares.get(checkpoint.id) or []
        while pool:
            inst = pool.pop(0)
            self._spare_wakeup.set()
            if (
                inst.exited.is_set()
                or not procfs.is_same_process(inst.pid, inst.starttime)
                or _kill_pending(inst.pid)
            ):
                await self._dispose(inst, background=True)
                continue
            t0 = time.monotonic()
            await trio.to_thread.run_sync(_write_owner, inst.paths, f"slot:{slot_id}")
            self.driver.thaw(inst.cgroups)
            inst.frozen = False
            try:
                await self._wait_agent(inst, self.config.agent_ready_timeout_s)
            except RuntimeError_:
                await self._dispose(inst, background=True)
                continue
            if not procfs.is_same_process(inst.pid, inst.starttime):
                # Killed while parked: the agent can still answer while the pid namespace
                # is being torn down after its init died.
                await self._dispose(inst, background=True)
                continue
            inst.restore_s = time.monotonic() - t0
            self.stats["spare_hits"] += 1
            return inst
        self.stats["spare_misses"] += 1
        return None

    async def _serve_spares(self) -> None:
        """Refill pools one restore at a time (never more than one restore slot taken from live
        work), recycle spares older than spare_max_age_s."""
        while True:
            self._spare_wakeup = trio.Event()
            while True:
                need = self._next_spare_need()
                if need is None:
                    break
                ref, limits = need
                try:
                    inst = await self._restore_instance(f"spare:{ref.id}", ref, limits, freeze=True)
                except RuntimeError_ as exc:
                    _log("spare_refill_failed", checkpoint=ref.id, error=exc.message)
                    await trio.sleep(1.0)
                    continue
                if ref.id in self._spare_refs:
                    self._spares.setdefault(ref.id, []).append(inst)
                else:
                    await self._dispose(inst, background=True)
            # Wake at least every few seconds even when idle: old spares must be recycled and
            # a refill refused by admission retried without anyone claiming.
            with trio.move_on_after(min(SPARE_PASS_S, max(1.0, self.config.spare_max_age_s / 4))):
                await self._spare_wakeup.wait()
            await self._recycle_old_spares()

    def _next_spare_need(self) -> tuple[CheckpointRef, SlotLimits] | None:
        total = sum(len(v) for v in self._spares.values())
        if total >= self.config.spares_per_host or not self.refill_allowed():
            return None
        for cid, (ref, limits) in self._spare_refs.items():
            if len(self._spares.get(cid, [])) < self._spare_target(cid):
                return ref, limits
        return None

    async def _recycle_old_spares(self) -> None:
        now = time.monotonic()
        for cid, pool in list(self._spares.items()):
            old = [i for i in pool if now - i.born > self.config.spare_max_age_s]
            # Above target (the claim rate fell): the oldest extras go, they are not renewed.
            extra = len(pool) - len(old) - self._spare_target(cid)
            if extra > 0:
                old += [i for i in pool if all(i is not o for o in old)][:extra]
            for inst in old:
                pool.remove(inst)
                await self._dispose(inst, background=True)
            if old:
                self._spare_wakeup.set()


def _kill_pending(pid: int) -> bool:
    """A SIGKILL waits on a frozen task (it lands on thaw): such a spare is already dead."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (
            1 << (signal.SIGKILL - 1)
        ):
            return True
    return False


def _agent_code(code: str) -> str:
    mapped = {"invalid_action": "invalid_request", "timeout": "timeout", "not_found": "not_found"}
    return mapped.get(code, "action_failed")


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


__all__ = [
    "LinuxRuntime",
    "LinuxRuntimeConfig",
    "open_linux_runtime",
    "tree_sha256",
]
