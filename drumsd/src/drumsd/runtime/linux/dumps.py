"""Dumps and checkpoints: a CRIU dump of an instance into a checkpoint dir (images, the upper
layer copied by CRIU's post-dump action, meta.json), checked against the tree it dumped."""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from drumsd.core.host_limits import limit_hit, limit_message
from drumsd.core.seams import CheckpointRef, RuntimeError_, SaveParent
from drumsd.linux import (
    cgroups,
    checkpoint_files,
    criu,
    dentries,
    host_limits,
    procfs,
    procview,
    save_delta,
    shm_zero,
    upper_links,
)
from drumsd.linux.trees import tree_sha256
from drumsd.runtime.linux.base import Instance, LinuxRuntimeConfig, log_event
from drumsd.runtime.linux.supervision import Supervision
from drumsd.runtime.slot_locks import run_stoppable

# The walk that looks a slot's names up again before a dump is tried a second time (a desktop's
# directories are looked up in well under a second here; the bound is for a huge upper).
INOTIFY_LOOKUP_BUDGET_S = 10.0


@dataclass(frozen=True)
class _DumpRun:
    returncode: int
    before: dict[int, procfs.NsProcess]  # the slot's processes sampled before criu ran
    after: dict[int, procfs.NsProcess]  # and after
    dump_s: float
    sampled_s: float
    shm: shm_zero.Punched | None = None  # the zero pages made holes before criu ran
    tracked: bool = False  # only the pages written since the restore (write_track.py)


_Dumped = tuple[_DumpRun, list[criu.DumpedTask], Path]  # the run, its tasks, its script


class Dumper:
    def __init__(self, config: LinuxRuntimeConfig, sup: Supervision) -> None:
        self.config = config
        self.sup = sup
        self.driver = sup.driver

    async def dump(
        self,
        inst: Instance,
        checkpoint_id: str,
        dest: Path,
        image_sha256: str,
        leave_running: bool,
        parent: str | None,
        store_against: SaveParent | None = None,
        track: bool = True,
    ) -> CheckpointRef:
        """criu dump of `inst` into `dest`, checked against the tree sampled before and after
        it (refused, and the dump discarded, when it misses a process or thread), stored as
        what changed since `store_against` when given (`save_delta`; full when that checkpoint
        cannot serve or its chain is at its bound), then the upper hashed and meta.json
        written."""
        if await trio.to_thread.run_sync(checkpoint_files.holds_checkpoint, dest):
            raise RuntimeError_(
                "invalid_request",
                f"{dest} already holds a checkpoint; pick a new checkpoint id or delete it",
            )
        run, dumped, script = await self._dump_checked(
            inst,
            functools.partial(self._dump_once, inst, dest, leave_running, store_against, track),
        )
        await trio.to_thread.run_sync(checkpoint_files.finish_dump, script)
        links = await trio.to_thread.run_sync(upper_links.read_stats, dest)
        upper = dest / "upper"
        delta = None
        if store_against is None:
            upper_sha = await run_stoppable(tree_sha256, upper, what=f"hashing {upper}")
        else:  # the upper hashed while the pages are compared (2 threads: zstd, sha256, crc32
            # and mmap reads let go of the GIL); its files linked after (same bytes, same hash)
            against = store_against
            hashed: list[str] = []

            async def hash_upper() -> None:
                hashed.append(await run_stoppable(tree_sha256, upper, what=f"hashing {upper}"))

            store = save_delta.store_tracked if run.tracked else save_delta.store_delta
            failed: Exception | None = None
            async with trio.open_nursery() as nursery:
                nursery.start_soon(hash_upper)
                try:
                    delta = await trio.to_thread.run_sync(
                        functools.partial(
                            store, dest, against.dir, checkpoint_id, against.max_depth, upper=False
                        )
                    )
                except (OSError, ValueError) as exc:  # only a tracked dump's store raises
                    failed = exc
            if failed is not None:  # not restorable without its parent's images as they were
                await trio.to_thread.run_sync(checkpoint_files.discard_failed_dump, dest)
                if not leave_running:  # the tree went with its dump
                    raise RuntimeError_(
                        "runtime_error",
                        f"the save of instance {inst.iid} could not be stored against "
                        f"{against.dir.name}: {failed}; save again",
                    ) from failed
                log_event("tracked_store_failed", iid=inst.iid, error=str(failed))
                return await self.dump(  # never a lost save: dumped again, untracked
                    inst, checkpoint_id, dest, image_sha256, leave_running, parent, against, False
                )
            upper_sha = hashed[0]
            if delta is not None:
                delta = await trio.to_thread.run_sync(
                    save_delta.link_upper, delta, dest, against.dir
                )
                if links:  # linked in the post-dump copy already (link_upper leaves them)
                    linked = delta.upper_linked + int(links["bytes"])
                    delta = dataclasses.replace(delta, upper_linked=linked)
        meta = {
            "id": checkpoint_id,
            "lower": [str(p) for p in inst.lower],
            "image_sha256": image_sha256,
            "upper_sha256": upper_sha,
            "parent": parent,
            "profile": self.config.profile,
            "dump_s": round(run.dump_s, 3),
            "delta": delta.as_meta() if delta else None,  # None: stored full
            # files the post-dump copy linked as unchanged since the restore (None: it did not)
            "upper_links": links,
            "shm_holes": run.shm.as_meta() if run.shm else None,  # None: not done
            "tracked": run.tracked,  # CRIU wrote only the pages written since the restore
            "tree_sample_s": round(run.sampled_s, 4),  # the two samples it is checked against
            "processes": len(dumped),
            "threads": sum(len(t.threads) for t in dumped),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "criu": str(self.config.criu),
        }
        await trio.to_thread.run_sync(checkpoint_files.write_meta, dest, meta)
        log_event(
            "dumped",
            iid=inst.iid,
            checkpoint=checkpoint_id,
            dump_s=f"{run.dump_s:.3f}",
            leave_running=leave_running,
            stored=f"delta of {delta.parent} at depth {delta.depth}" if delta else "full",
        )
        return CheckpointRef(
            checkpoint_id, dest, inst.lower[0], image_sha256, upper_sha, self.config.profile
        )

    async def _dump_checked(
        self, inst: Instance, once: Callable[[], Awaitable[_Dumped]]
    ) -> _Dumped:
        """The dump (`once`), tried a second time when CRIU refused an inotify watch whose
        dentry the kernel had evicted, after the slot's names were looked up again
        (dentries.py)."""
        try:
            return await once()
        except RuntimeError_ as exc:
            inodes = set(exc.detail.get("inotify_inodes", ()))
            if not inodes:
                raise
            root = Path(f"/proc/{inst.pid}/root")
            found = await trio.to_thread.run_sync(
                dentries.look_up_again, root, inodes, INOTIFY_LOOKUP_BUDGET_S
            )
            log_event(
                "dump_retry",
                iid=inst.iid,
                reason="inotify watch without a file handle",
                inodes=sorted(inodes),
                looked_up=len(found),
            )
        return await once()

    async def _dump_once(
        self,
        inst: Instance,
        dest: Path,
        leave_running: bool,
        against: SaveParent | None,
        track: bool,
    ) -> _Dumped:
        """criu dump into `dest` and its check: (the run, the dumped tasks, the post-dump
        script); a typed error with `dest` discarded when it fails. A save stored against a
        parent links the upper's files unchanged since the restore (`upper_links`)."""
        links = None
        if against is not None:
            links = (inst.paths.dir / upper_links.RECORD_NAME, against.dir / "upper")
        script = await trio.to_thread.run_sync(
            checkpoint_files.prepare_dump, dest, inst.paths.upper, links
        )
        tracked = await trio.to_thread.run_sync(self.track_parent, inst, against) if track else None
        run = await self._run_criu(inst, dest, script, leave_running, tracked)
        if run.tracked and run.returncode != 0:  # never a lost save: once more, untracked
            errors = await trio.to_thread.run_sync(checkpoint_files.discard_failed_dump, dest)
            log_event("tracked_dump_failed", iid=inst.iid, errors=errors[-3:])
            script = await trio.to_thread.run_sync(
                checkpoint_files.prepare_dump, dest, inst.paths.upper, links
            )
            run = await self._run_criu(inst, dest, script, leave_running, None)
        return run, await self._check(inst, dest, run, leave_running), script

    @staticmethod
    def track_parent(inst: Instance, against: SaveParent | None) -> Path | None:
        """The parent images a dump of `inst` may refer its unwritten pages to: those of the
        checkpoint its armed tree was restored from, when the save is stored against it."""
        armed = inst.write_track
        if against is None or armed is None or not armed.fds:
            return None
        restored_from = armed.checkpoint_id
        if not save_delta.tracked_parent_ok(
            against.dir, against.max_depth, restored_from=restored_from
        ):
            return None
        return against.dir / "images"

    async def _run_criu(
        self, inst: Instance, dest: Path, script: Path, leave_running: bool, track: Path | None
    ) -> _DumpRun:
        """criu dump with no agent call open (the gate), between two samples of the tree;
        with `track`, only the pages written since the restore."""
        _, launcher = self.sup.running()
        argv = criu.dump_argv(
            self.config.criu,
            inst.pid,
            dest / "images",
            script,
            leave_running=leave_running,
            externals=await trio.to_thread.run_sync(self._procview_binds, inst),
            log_level=self.config.criu_log_level,
            track_parent=track,
        )
        t0 = time.monotonic()
        async with inst.gate.dump():
            shm = None
            if self.config.shm_holes:
                shm = await trio.to_thread.run_sync(self.shm_holes, inst)
            before = await trio.to_thread.run_sync(self._slot_processes, inst)
            sampled_s = time.monotonic() - t0
            done = await launcher.run(argv, dest / "criu.out", timeout_s=self._time_limit())
            t1 = time.monotonic()
            after = await trio.to_thread.run_sync(self._slot_processes, inst)
            sampled_s += time.monotonic() - t1
        took = time.monotonic() - t0
        return _DumpRun(done.returncode, before, after, took, sampled_s, shm, track is not None)

    def shm_holes(self, inst: Instance) -> shm_zero.Punched | None:
        """The slot frozen for a moment and the zero pages of its SysV shared memory made
        holes, which CRIU's dump does not write (`linux/shm_zero.py`); None (nothing done, the
        dump goes on) when the slot does not freeze."""
        t0 = time.monotonic()
        try:
            cgroups.freeze_whole(self.driver, inst.cgroups, 2.0)
        except cgroups.CgroupError as exc:
            log_event("shm_holes_skipped", iid=inst.iid, error=str(exc))
            return None
        try:
            punched = shm_zero.punch_zero_pages(self.driver.pids(inst.cgroups))
        finally:
            self.driver.thaw(inst.cgroups)
        punched = dataclasses.replace(punched, took_s=time.monotonic() - t0)
        log_event(
            "shm_holes",
            iid=inst.iid,
            segments=punched.segments,
            data_kib=punched.bytes_before // 1024,
            removed_kib=punched.bytes_removed // 1024,
            took_s=f"{punched.took_s:.4f}",
        )
        return punched

    @staticmethod
    def _procview_binds(inst: Instance) -> dict[str, str]:
        """The /proc view's binds in the slot, declared external (CRIU cannot dump FUSE)."""
        try:
            mountinfo = Path(f"/proc/{inst.pid}/mountinfo").read_text()
        except OSError:
            return {}  # gone: the dump itself reports it
        return procview.dump_externals(procview.held_in(mountinfo))

    async def _check(
        self, inst: Instance, dest: Path, run: _DumpRun, leave_running: bool
    ) -> list[criu.DumpedTask]:
        """The dumped tasks, or a typed error with the dump discarded."""
        if run.returncode != 0 or not await trio.to_thread.run_sync(
            checkpoint_files.dump_written, dest
        ):
            errors = await trio.to_thread.run_sync(checkpoint_files.discard_failed_dump, dest)
            hit = limit_hit(errors)
            if hit is not None:
                log_event("dump_limit", iid=inst.iid, limit=hit.name, error=hit.line)
                what = f"dumping instance {inst.iid}"
                raise RuntimeError_(
                    "runtime_error",
                    limit_message(hit, host_limits.current(hit.name), what),
                    limit=hit.name,
                )
            nested = criu.nested_namespace(errors)
            if nested is not None:
                kind, pid = nested
                comm = st.comm if (st := procfs.read_stat(pid)) else "?"
                raise RuntimeError_(
                    "conflict",
                    f"slot instance {inst.iid} cannot be captured: {comm}({pid}) runs in a "
                    f"{kind} namespace of its own, which CRIU cannot checkpoint (nested_pidns "
                    f"in docs/runtime.md); CRIU said: {errors}. End that process (or run the "
                    "app without namespaces of its own) and capture again",
                    process=f"{comm}({pid})",
                    namespace=kind,
                )
            inodes = criu.unhandled_inotify_inodes(errors)
            if inodes:
                raise RuntimeError_(
                    "runtime_error",
                    f"criu dump of instance {inst.iid} failed: an app's inotify watch on inode(s) "
                    f"{sorted(inodes)} had no file handle (its name had left the kernel's "
                    f"cache), which CRIU cannot dump, and looking the names up again did not "
                    f"help; CRIU said: {errors[-3:]}. Capture again, or end the app watching",
                    inotify_inodes=sorted(inodes),
                )
            raise RuntimeError_(
                "runtime_error",
                f"criu dump of instance {inst.iid} failed "
                f"(exit {run.returncode}): {errors}; is an agent connection or "
                "a host fd open in the tree?",
            )
        try:
            dumped = await trio.to_thread.run_sync(checkpoint_files.dumped_tasks, dest)
            image_names = await trio.to_thread.run_sync(checkpoint_files.image_names, dest)
        except (OSError, ValueError) as exc:
            await trio.to_thread.run_sync(checkpoint_files.discard_failed_dump, dest)
            raise RuntimeError_(
                "runtime_error",
                f"criu dump of instance {inst.iid} wrote no readable process tree: {exc}",
            ) from exc
        problem = self.mismatch(inst, run.before, run.after, leave_running, dumped, image_names)
        if problem is not None:
            await trio.to_thread.run_sync(checkpoint_files.discard_failed_dump, dest)
            raise problem
        return dumped

    def _time_limit(self) -> float:
        """criu's own limit (it runs shielded: its process must be waited for), no later than
        the caller's deadline (a capture's capture_timeout_s), so the slot lock is not held
        past it."""
        left = trio.current_effective_deadline() - trio.current_time()
        return max(1.0, min(self.config.dump_timeout_s, left))

    def _slot_processes(self, inst: Instance) -> dict[int, procfs.NsProcess]:
        """The slot's processes in its own pid namespace (pid there -> comm and threads); {}
        when gone."""
        pidns = procfs.namespaces(inst.pid).get("pid")
        if pidns is None:
            return {}
        return procfs.in_pid_namespace(self.driver.pids(inst.cgroups), pidns)

    @staticmethod
    def mismatch(
        inst: Instance,
        before: dict[int, procfs.NsProcess],
        after: dict[int, procfs.NsProcess],
        leave_running: bool,
        dumped: list[criu.DumpedTask],
        image_names: list[str],
    ) -> RuntimeError_ | None:
        """The dump checked against the tree: same processes and threads (those that ran
        throughout it), each thread with its registers. None when it holds them all."""
        # The template's dump ends its tree (nothing to see after it): only a dump that leaves
        # the tree running can tell a process or thread it missed from churn around the freeze.
        # Threads churn far more than processes (thread pools), so a template's dump checks
        # processes against the sample before it and threads only against its own images.
        comms = {pid: p.comm for pid, p in before.items()}
        later = {pid: p.comm for pid, p in after.items()} if leave_running else comms
        missing = criu.missing_from_dump(comms, later, dumped)
        if leave_running:
            missing += criu.missing_threads(
                {pid: p.threads for pid, p in before.items()},
                {pid: p.threads for pid, p in after.items()},
                dumped,
            )
        if missing:
            return RuntimeError_(
                "runtime_error",
                f"criu dump of instance {inst.iid} does not hold every process and thread of "
                f"the slot: {', '.join(missing[:8])} ran before and after it but are not in the "
                "dump (outside its process tree, e.g. joined from the host), and would be lost "
                "on every restore",
                missing=missing,
            )
        coreless = criu.threads_without_core(dumped, image_names)
        if coreless:
            return RuntimeError_(
                "runtime_error",
                f"criu dump of instance {inst.iid} lists threads {coreless[:8]} in pstree.img "
                "without their core-<tid>.img: the dump is incomplete and cannot be restored",
                missing=[f"core-{tid}.img" for tid in coreless],
            )
        return None

    @staticmethod
    async def checkpoint_problems(path: Path, meta: dict[str, Any]) -> list[str]:
        return await trio.to_thread.run_sync(checkpoint_files.dump_problems, path, meta)
