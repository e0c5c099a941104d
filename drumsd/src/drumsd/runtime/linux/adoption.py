"""Adoption and sweep after a restart: a live slot of a previous daemon taken over by identity
(pid + starttime), and every instance dir or cgroup that no live slot owns cleaned up."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from drumsd.core.seams import SlotHandle
from drumsd.linux import mounts, procfs, slot_fs
from drumsd.linux.process_trees import kill_leftover, pidfd_open
from drumsd.runtime.linux.base import Instance, log_event
from drumsd.runtime.linux.fs import InstanceFs
from drumsd.runtime.linux.instances import InstanceTable
from drumsd.runtime.linux.spare_pool import SparePool
from drumsd.runtime.linux.supervision import Supervision


class Adoption:
    def __init__(
        self, sup: Supervision, fs: InstanceFs, table: InstanceTable, pool: SparePool
    ) -> None:
        self.sup = sup
        self.driver = sup.driver
        self.fs = fs
        self.state_dir = fs.state_dir
        self.table = table
        self.pool = pool

    async def adopt(self, handle: SlotHandle) -> bool:
        self.sup.running()
        if not procfs.is_same_process(handle.init_pid, handle.init_starttime):
            return False
        iid = str(handle.extra.get("iid") or Path(handle.root).parent.name)
        inst = Instance(
            iid,
            mounts.SlotPaths(Path(handle.root).parent),
            dict(handle.cgroups),
            handle.checkpoint_id,
            tuple(Path(p) for p in handle.extra.get("lower", [])),
            pid=handle.init_pid,
            starttime=handle.init_starttime,
            pidfd=pidfd_open(handle.init_pid),
            restore_s=handle.restore_s,
            restore_started_at=float(handle.extra.get("restore_started_at") or 0.0),
            image_sha256=str(handle.extra.get("image_sha256", "")),
            uid_index=handle.extra.get("uid_index"),
        )
        if inst.uid_index is not None:
            self.fs.uids.hold([inst.uid_index])
        self.table.serve(handle.slot_id, inst)
        self.sup.watch(inst)
        log_event("adopted", slot=handle.slot_id, iid=iid, pid=inst.pid)
        return True

    def _owned_in_memory(self) -> set[str]:
        return self.table.iids() | self.fs.busy() | self.pool.iids()

    def _cleanup_iid(self, iid: str) -> None:
        """Blocking: kill and remove what is left of instance `iid` (see `kill_leftover`)."""
        paths = mounts.SlotPaths.of(self.state_dir, iid)
        init = slot_fs.read_owner_record(paths.dir).get("init")
        kill_leftover(self.driver, self.driver.dirs_of(iid), init)
        self.fs.teardown(paths)

    def sweep_owned_by(self, owners: set[str]) -> list[str]:
        cleaned = []
        base = self.state_dir / "slots"
        for name in slot_fs.instance_names(base):
            if name not in self._owned_in_memory() and slot_fs.read_owner(base / name) in owners:
                self._cleanup_iid(name)
                cleaned.append(name)
        return cleaned

    async def sweep(self, live_slot_ids: Sequence[str], *, own: bool = False) -> list[str]:
        """Kill and remove the instances no live slot claims; with `own`, this runtime's own
        too (a bench that was stopped: nothing of it may outlive it)."""
        live = set(live_slot_ids)

        def go() -> list[str]:
            keep = set() if own else self._owned_in_memory()
            cleaned: list[str] = []
            base = self.state_dir / "slots"
            names = set(self.driver.slot_names())
            names |= set(slot_fs.instance_names(base))
            for iid in sorted(names - keep):
                owner = slot_fs.read_owner(base / iid) or ""
                kind, _, sid = owner.partition(":")
                if kind == "slot" and sid in live:
                    continue
                self._cleanup_iid(iid)
                cleaned.append(iid)
            return cleaned

        cleaned = await trio.to_thread.run_sync(go)
        if cleaned:
            log_event("swept", instances=",".join(cleaned))
        return cleaned
