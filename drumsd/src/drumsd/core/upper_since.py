"""Which files of a slot's upper layer are still what its restore copied from the checkpoint, so
a delta save hard-links them to that checkpoint's files instead of copying them while the tree is
frozen (issue 35), the pure half: the record kept at the restore, and the decision.

The decision rests on the inode change time: no system call lets a process set it (only the
host's clock moves it, which a slot cannot change), and every change of a file's bytes or
attributes (a write, a first write through a shared mapping, truncate, chmod, chown, utimes, an
xattr, a link or unlink, a rename) sets it to now. So a file at the same path with the inode
number and ctime the restore recorded (right after its copy, before the slot ran) is the very
file the copy made, unchanged: its bytes are the checkpoint's. A replaced file has another inode.

Kept import-light (no json, dataclasses or re): CRIU's post-dump action runs it in a fresh
interpreter while the slot's tree is frozen (`drumsd.linux.upper_links`)."""

from __future__ import annotations

import stat

TYPE_CHECKING = False  # not typing's: importing it costs ~12 ms in the post-dump action

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Protocol

    class StatResult(Protocol):
        """What is read of an `os.lstat` result."""

        @property
        def st_mode(self) -> int: ...
        @property
        def st_ino(self) -> int: ...
        @property
        def st_nlink(self) -> int: ...
        @property
        def st_uid(self) -> int: ...
        @property
        def st_gid(self) -> int: ...
        @property
        def st_size(self) -> int: ...
        @property
        def st_mtime_ns(self) -> int: ...
        @property
        def st_ctime_ns(self) -> int: ...


RECORD_MAGIC = b"drums-upper-record-1"

Stamp = tuple[int, int]  # (inode number, ctime in ns) of a slot's file just after its restore


def encode_record(source: bytes, stamps: Iterable[tuple[bytes, int, int]]) -> bytes:
    """The record of a restore's upper copy: the upper it was copied from, then each regular
    file's path (relative, bytes) with its inode number and ctime. NUL-separated: a path holds
    any byte but NUL."""
    parts = [RECORD_MAGIC, source]
    for rel, ino, ctime_ns in stamps:
        parts += [rel, b"%d" % ino, b"%d" % ctime_ns]
    return b"\0".join(parts) + b"\0"


def decode_record(data: bytes) -> tuple[bytes, dict[bytes, Stamp]]:
    """(source upper, path -> stamp); ValueError when `data` is not a whole record."""
    parts = data.split(b"\0")
    if len(parts) < 3 or parts[0] != RECORD_MAGIC or parts[-1] != b"" or (len(parts) - 3) % 3:
        raise ValueError("not a drums upper record (or a truncated one)")
    stamps: dict[bytes, Stamp] = {}
    for i in range(2, len(parts) - 1, 3):
        rel = parts[i]
        if not rel or rel.startswith(b"/") or b".." in rel.split(b"/"):
            raise ValueError(f"upper record: path {rel!r} is not relative")
        stamps[rel] = (int(parts[i + 1]), int(parts[i + 2]))
    return parts[1], stamps


def recordable(st: StatResult) -> bool:
    """A file of a restored upper worth recording: a regular file with one name. Files the copy
    linked together (nlink > 1) are copied at a save as today, so the copy joins them again."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1


def unchanged_since_restore(
    recorded: Stamp | None, slot: StatResult, parent: StatResult | None
) -> bool:
    """Whether the slot's file (`slot`, its lstat at the dump, tree frozen) may be stored as a
    hard link to the parent checkpoint's file at the same path (`parent`, its lstat; None when
    it has none): it is the inode the restore copied and recorded (`recorded`), nothing changed
    it since (same ctime), it has one name (a link the slot added moves ctime too), and the
    parent's file is what it was copied from (regular; size, mode, owner and mtime as the copy
    kept them). Anything else is copied."""
    if recorded is None or parent is None or not recordable(slot):
        return False
    if (slot.st_ino, slot.st_ctime_ns) != recorded or not stat.S_ISREG(parent.st_mode):
        return False
    return (slot.st_size, slot.st_mode, slot.st_uid, slot.st_gid, slot.st_mtime_ns) == (
        parent.st_size,
        parent.st_mode,
        parent.st_uid,
        parent.st_gid,
        parent.st_mtime_ns,
    )


def skip_existing_flag(cp_version: str) -> str | None:
    """The flag of this `cp` (the first line of `cp --version`) that copies a tree over the
    links already made and leaves them, exiting 0: GNU coreutils 9.3 on `--update=none`; before
    9.2 `-n` (9.2 to 9.4 made `-n` fail when it skips, 9.5 made it succeed again but
    deprecated). None (another cp, or 9.2): no links are made, the upper is copied whole."""
    if "(GNU coreutils)" not in cp_version:
        return None
    words = cp_version.split()
    try:
        major, minor = (int(x) for x in words[-1].split(".")[:2])
    except ValueError:
        return None
    if (major, minor) >= (9, 3):
        return "--update=none"
    if (major, minor) < (9, 2):
        return "-n"
    return None
