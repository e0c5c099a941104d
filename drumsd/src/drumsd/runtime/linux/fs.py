"""Instance filesystems: an instance's dir, tmpfs, upper copy and overlay root made (through
`drumsd.linux.slot_fs`) and torn down, with the uid range it is mapped to. An iid is *busy* from
its making until its teardown, so a concurrent sweep never takes a dir being built."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import trio

from drumsd.linux import mounts, slot_fs
from drumsd.runtime.linux.base import new_iid
from drumsd.runtime.linux.uids import UidRanges


class InstanceFs:
    def __init__(self, state_dir: Path, uids: UidRanges) -> None:
        self.state_dir = state_dir
        self.uids = uids
        self.helper: Path | None = None  # the exec helper, once the runtime runs
        # The sysinfo() library stage 1 preloads in templates (config procview_dir), once built.
        self.sysinfo_lib: Path | None = None
        self._busy: set[str] = set()  # iids made and not torn down yet

    def busy(self) -> set[str]:
        return set(self._busy)

    def new_iid(self, prefix: str) -> str:
        """A new instance id, protected from sweep until it is registered or torn down."""
        iid = new_iid(prefix)
        self._busy.add(iid)
        return iid

    async def make(
        self,
        iid: str,
        owner: str,
        upper_src: Path | None,
        lower: Sequence[Path],
        tmpfs_mib: int,
    ) -> tuple[mounts.SlotPaths, int | None]:
        """A uid range and the fs mapped to it (in a thread, shielded: a cancel arriving while
        it works must not lose the mounts). Nothing is left behind when it fails."""
        index = self.uids.allocate()
        with trio.CancelScope(shield=True):
            try:
                paths = await trio.to_thread.run_sync(
                    self.prepare, iid, owner, upper_src, lower, tmpfs_mib, index
                )
            except BaseException:
                self.uids.free(index)
                raise
        return paths, index

    def prepare(
        self,
        iid: str,
        owner: str,
        upper_src: Path | None,
        lower: Sequence[Path],
        tmpfs_mib: int,
        uid_index: int | None = None,
    ) -> mounts.SlotPaths:
        """Blocking: see `slot_fs.build_fs`; nothing is left behind when it fails."""
        paths = slot_fs.make_instance_dir(self.state_dir, iid, owner, uid_index)
        try:
            slot_fs.build_fs(
                paths, upper_src, lower, tmpfs_mib, uid_index, self.uids.userns_of, self.helper
            )
        except BaseException:
            self.teardown(paths)
            raise
        return paths

    def teardown(self, paths: mounts.SlotPaths) -> None:
        """Blocking: mounts and dir gone, the uid range freed."""
        index = slot_fs.teardown_fs(paths)
        self._busy.discard(paths.dir.name)  # last: a concurrent sweep must not see it half-gone
        self.uids.free(index)
