"""Mount plans: lists of small records, printable and testable without root, applied in one place.

Two plans per slot: the host side (a tmpfs holding the upper layer, an overlay root on it) and
stage 1 inside the slot's fresh mount namespace (proc, a minimal /dev, /tmp, pivot_root).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from drumsd.linux import syscalls as sc

OpKind = Literal[
    "mkdir", "mount", "mknod", "symlink", "pivot_root", "umount", "make_rprivate", "rebind_cwd"
]

# (name, major, minor): the minimal set a desktop needs; nothing that reaches hardware.
DEVICES: tuple[tuple[str, int, int], ...] = (
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
)
DEV_LINKS: tuple[tuple[str, str], ...] = (
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)


@dataclass(frozen=True)
class MountOp:
    """One step of a plan. Fields unused by a kind stay None/0."""

    kind: OpKind
    target: str
    source: str | None = None
    fstype: str | None = None
    flags: int = 0
    data: str | None = None
    mode: int = 0o755
    dev: tuple[int, int] | None = None

    def __str__(self) -> str:
        if self.kind == "mount":
            opts = f" -o {self.data}" if self.data else ""
            return f"mount -t {self.fstype or 'none'} {self.source or 'none'} {self.target}{opts}"
        if self.kind == "mknod":
            assert self.dev is not None
            return f"mknod -m {self.mode:o} {self.target} c {self.dev[0]} {self.dev[1]}"
        if self.kind == "symlink":
            return f"ln -s {self.source} {self.target}"
        if self.kind == "pivot_root":
            return f"pivot_root {self.target} (old root detached)"
        if self.kind == "umount":
            return f"umount -l {self.target}"
        if self.kind == "make_rprivate":
            return f"mount --make-rprivate {self.target}"
        if self.kind == "rebind_cwd":
            return "mount --rbind . . && cd into the new mount (open_tree + move_mount + fchdir)"
        return f"mkdir -m {self.mode:o} -p {self.target}"


@dataclass(frozen=True)
class SlotPaths:
    """Host-side layout of one slot under `state_dir/slots/<slot_id>`."""

    dir: Path

    @classmethod
    def of(cls, state_dir: Path, slot_id: str) -> SlotPaths:
        return cls(state_dir / "slots" / slot_id)

    @property
    def rw(self) -> Path:  # the per-slot tmpfs
        return self.dir / "rw"

    @property
    def upper(self) -> Path:
        return self.rw / "upper"

    @property
    def work(self) -> Path:
        return self.rw / "work"

    @property
    def root(self) -> Path:  # the overlay, host side
        return self.dir / "root"


def overlay_options(lowers: Sequence[Path], upper: Path, work: Path) -> str:
    # index=on,nfs_export=on make inotify watches (Chromium) dumpable by CRIU.
    lower = ":".join(str(p) for p in lowers)
    return f"lowerdir={lower},upperdir={upper},workdir={work},index=on,nfs_export=on"


def plan_rw(paths: SlotPaths, tmpfs_mib: int) -> list[MountOp]:
    """The slot's tmpfs, empty: the caller copies the upper snapshot in before the overlay."""
    return [
        MountOp("mkdir", str(paths.rw)),
        MountOp("mkdir", str(paths.root)),
        MountOp(
            "mount",
            str(paths.rw),
            source="drums-rw",
            fstype="tmpfs",
            # not nodev: overlay opens the image's /dev nodes through its upper mount.
            flags=sc.MS_NOSUID,
            data=f"size={tmpfs_mib}m,mode=755",
        ),
        MountOp("mkdir", str(paths.upper)),
        MountOp("mkdir", str(paths.work)),
    ]


def plan_overlay(paths: SlotPaths, lowers: Sequence[Path]) -> list[MountOp]:
    return [
        MountOp(
            "mount",
            str(paths.root),
            source="drums-root",
            fstype="overlay",
            data=overlay_options(lowers, paths.upper, paths.work),
        )
    ]


def plan_teardown(paths: SlotPaths) -> list[MountOp]:
    return [MountOp("umount", str(paths.root)), MountOp("umount", str(paths.rw))]


def plan_stage1(root: str, tmpfs_mib: int, userns: bool = True) -> list[MountOp]:
    """Inside the slot's new mount namespace, before pivot_root into `root`. Nothing of the host
    stays visible: CRIU refuses a tree that holds host mounts or fds.

    In a user namespace (`userns`), mknod is impossible, so the image's own /dev nodes (made by
    debootstrap, on the host-mounted overlay) serve; the inherited root mount is locked, so it is
    bound onto itself first or pivot_root fails with EINVAL. Without one, /dev is a tmpfs with the
    six nodes made here."""
    dev = f"{root}/dev"
    ops: list[MountOp] = [MountOp("make_rprivate", "/")]
    if userns:
        # The caller chdir'ed into the root as host root (its ancestors may not be searchable
        # by the slot's unprivileged ids) and passes root=".".
        ops.append(MountOp("rebind_cwd", root))
    ops += [
        MountOp("mkdir", f"{root}/proc"),
        MountOp(
            "mount",
            f"{root}/proc",
            source="proc",
            fstype="proc",
            flags=sc.MS_NOSUID | sc.MS_NODEV | sc.MS_NOEXEC,
        ),
        MountOp("mkdir", dev),
    ]
    if not userns:
        ops.append(
            MountOp(
                "mount",
                dev,
                source="drums-dev",
                fstype="tmpfs",
                flags=sc.MS_NOSUID | sc.MS_NOEXEC,
                data="size=64k,mode=755",
            )
        )
        ops += [MountOp("mknod", f"{dev}/{n}", mode=0o666, dev=(ma, mi)) for n, ma, mi in DEVICES]
    ops += [
        MountOp("mkdir", f"{dev}/pts"),
        MountOp(
            "mount",
            f"{dev}/pts",
            source="devpts",
            fstype="devpts",
            flags=sc.MS_NOSUID | sc.MS_NOEXEC,
            data="newinstance,ptmxmode=0666,mode=620,gid=5",
        ),
        MountOp("mkdir", f"{dev}/shm", mode=0o1777),
        MountOp(
            "mount",
            f"{dev}/shm",
            source="shm",
            fstype="tmpfs",
            flags=sc.MS_NOSUID | sc.MS_NODEV,
            data=f"size={tmpfs_mib}m,mode=1777",
        ),
    ]
    if not userns:
        ops += [MountOp("symlink", f"{dev}/{name}", source=to) for name, to in DEV_LINKS]
    ops += [
        MountOp("mkdir", f"{root}/tmp", mode=0o1777),
        MountOp(
            "mount",
            f"{root}/tmp",
            source="tmp",
            fstype="tmpfs",
            flags=sc.MS_NOSUID | sc.MS_NODEV,
            data=f"size={tmpfs_mib}m,mode=1777",
        ),
        MountOp("pivot_root", root),
    ]
    return ops


def render(plan: Iterable[MountOp]) -> str:
    return "\n".join(str(op) for op in plan)


def apply(plan: Iterable[MountOp]) -> None:
    """Run a plan. Raises OSError naming the step that failed."""
    for op in plan:
        if op.kind == "mkdir":
            os.makedirs(op.target, mode=op.mode, exist_ok=True)
            if op.mode & 0o7000:
                os.chmod(op.target, op.mode)
        elif op.kind == "mount":
            sc.mount(op.source, op.target, op.fstype, op.flags, op.data)
        elif op.kind == "make_rprivate":
            sc.mount(None, op.target, None, sc.MS_REC | sc.MS_PRIVATE, None)
        elif op.kind == "rebind_cwd":
            sc.rebind_cwd()
        elif op.kind == "mknod":
            assert op.dev is not None
            os.mknod(op.target, stat.S_IFCHR | op.mode, os.makedev(*op.dev))
            os.chmod(op.target, op.mode)
        elif op.kind == "symlink":
            assert op.source is not None
            os.symlink(op.source, op.target)
        elif op.kind == "pivot_root":
            # pivot_root(".", ".") stacks the old root under the new one; detaching it leaves
            # the slot with no path back to the host, and needs no directory in the image.
            os.chdir(op.target)
            sc.pivot_root(".", ".")
            sc.umount2(".", sc.MNT_DETACH)
            os.chdir("/")
        elif op.kind == "umount":
            try:
                sc.umount2(op.target, sc.MNT_DETACH)
            except OSError as exc:
                if exc.errno not in (22, 2):  # EINVAL: not a mount point; ENOENT: gone
                    raise


def _unescape(field: str) -> str:
    return (
        field.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def parse_mountinfo(text: str) -> list[tuple[str, str]]:
    """mountinfo -> [(mount point, fs type)] in mount order."""
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if sep:
            out.append((_unescape(left.split()[4]), right.split()[0]))
    return out


def mounts_under(prefix: Path, mountinfo: str | None = None) -> list[str]:
    """Host mount points at or below `prefix`, deepest (latest) first: the order to unmount."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    p = str(prefix).rstrip("/")
    hits = [m for m, _ in parse_mountinfo(text) if m == p or m.startswith(p + "/")]
    return list(reversed(hits))


def fs_type_of(path: Path, mountinfo: str | None = None) -> str:
    """The fs type of the mount holding `path` (longest matching mount point wins)."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    target = str(path.resolve())
    best, kind = "", "unknown"
    for m, fstype in parse_mountinfo(text):
        if (target == m or target.startswith(m.rstrip("/") + "/")) and len(m) >= len(best):
            best, kind = m, fstype
    return kind
