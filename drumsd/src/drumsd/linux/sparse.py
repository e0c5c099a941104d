"""Files with holes: their data extents (SEEK_DATA/SEEK_HOLE), a digest and a copy that touch only
the data, and what a file holds (allocated) against what it says (apparent size).

A slot's files are the agent's: `truncate -s 8T ~/f` costs nothing to make, so nothing the daemon
does with a slot's files (copy, hash, size) may cost what a file says rather than what it holds.
The work runs in worker threads; a `CancelFlag` set by the caller's deadline stops it between
chunks (`Cancelled`).
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

CHUNK = 1 << 20  # what one read or copy moves before the cancel flag is looked at again
# A sparse file's digest reads it in aligned blocks of this size and leaves out the blocks that
# are all zeros (holes read as zeros): the digest depends on the bytes, not on where the
# filesystem put its holes, so a copy on another filesystem hashes the same.
BLOCK = 1 << 16
_ZEROS = bytes(BLOCK)
# Marks a sparse file's digest input, so it cannot collide with a dense file's plain bytes.
_SPARSE_TAG = b"\0drums-sparse-v1\0"


class Cancelled(Exception):
    """The caller's deadline passed: the work stopped between two chunks, its output unfinished."""


class CancelFlag:
    """Set by the trio side when the operation's deadline passes (or its caller goes away);
    looked at by a worker thread between chunks."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self, what: str = "") -> None:
        if self._event.is_set():
            raise Cancelled(f"cancelled: {what}" if what else "cancelled")


NEVER = CancelFlag()  # for callers without a deadline (never set)


class _Hasher(Protocol):
    def update(self, data: bytes, /) -> Any: ...


@dataclass(frozen=True)
class Usage:
    """What files hold (allocated blocks) and what they say (st_size)."""

    real_bytes: int = 0
    apparent_bytes: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.real_bytes + other.real_bytes, self.apparent_bytes + other.apparent_bytes)

    @property
    def real_mib(self) -> float:
        return self.real_bytes / (1 << 20)

    @property
    def apparent_mib(self) -> float:
        return self.apparent_bytes / (1 << 20)


def usage_of(st: os.stat_result) -> Usage:
    """A regular file's allocated bytes (st_blocks is in 512-byte units whatever the filesystem's
    block size) and its apparent size; other entries hold nothing counted here."""
    if not stat.S_ISREG(st.st_mode):
        return Usage()
    return Usage(st.st_blocks * 512, st.st_size)


def data_extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """[start, end) ranges of `fd` below `size` that hold data; the rest reads as zeros. A
    filesystem without hole support reports the whole file as one extent (the kernel's default
    SEEK_DATA/SEEK_HOLE)."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data at or after pos: the rest is a hole
                return
            if exc.errno == errno.EINVAL:  # no SEEK_DATA here: all of it is data
                yield pos, size
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        yield start, end
        pos = end


def is_dense(fd: int, size: int) -> bool:
    """No hole below `size` (an empty file is dense)."""
    if size == 0:
        return True
    for start, end in data_extents(fd, size):
        return start == 0 and end >= size
    return False


def hash_file(fd: int, size: int, h: _Hasher, cancel: CancelFlag = NEVER) -> None:
    """Feed `fd`'s first `size` bytes into `h`. A file without holes is fed as its plain bytes (the
    digest every checkpoint made so far holds); a file with holes as a tag, its size, and the
    offset and bytes of each aligned BLOCK that is not all zeros: one read per block of data,
    none for a hole, so an 8 TiB hole costs nothing."""
    if is_dense(fd, size):
        pos = 0
        while pos < size:
            cancel.check("hashing a file")
            chunk = os.pread(fd, min(CHUNK, size - pos), pos)
            if not chunk:
                break  # shrunk while read (a live upper): hash what was there
            h.update(chunk)
            pos += len(chunk)
        return
    h.update(_SPARSE_TAG + size.to_bytes(8, "little"))
    last = -1
    for start, end in data_extents(fd, size):
        first = max(start // BLOCK, last + 1)
        for block in range(first, (end - 1) // BLOCK + 1):
            cancel.check("hashing a sparse file")
            data = os.pread(fd, BLOCK, block * BLOCK)[: size - block * BLOCK]
            if data != _ZEROS[: len(data)]:
                h.update(block.to_bytes(8, "little") + len(data).to_bytes(4, "little") + data)
            last = block


def copy_file(src_fd: int, dst_fd: int, size: int, cancel: CancelFlag = NEVER) -> None:
    """Copy `src_fd`'s first `size` bytes into the empty `dst_fd`: only the data extents are read
    and written; the holes are left by setting the size at the end."""
    for start, end in data_extents(src_fd, size):
        pos = start
        while pos < end:
            cancel.check("copying a file")
            n = _copy_range(src_fd, dst_fd, min(CHUNK, end - pos), pos)
            if n == 0:
                break  # shrunk while copied
            pos += n
    os.ftruncate(dst_fd, size)


def _copy_range(src_fd: int, dst_fd: int, count: int, offset: int) -> int:
    try:
        return os.copy_file_range(src_fd, dst_fd, count, offset, offset)
    except OSError as exc:  # across filesystems on an older kernel, or not offered
        if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise
    data = os.pread(src_fd, count, offset)
    return os.pwrite(dst_fd, data, offset) if data else 0


def copy_path(src: str, dst: str, cancel: CancelFlag = NEVER) -> str:
    """A `shutil.copytree(copy_function=...)` for files that may have holes: contents (holes
    kept) and mode, not owner or xattrs."""
    with open(src, "rb") as s:
        st = os.fstat(s.fileno())
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, stat.S_IMODE(st.st_mode))
        try:
            copy_file(s.fileno(), fd, st.st_size, cancel)
        finally:
            os.close(fd)
    return dst
