"""Open a path beneath a root directory fd with openat2, never escaping it (issue 14).

The checker reads a slot's files from the host side, beneath the slot's root as the daemon sees
it (/proc/<init>/root), so no process in the slot can answer in the guest's place. Symlinks are
followed as the slot would (RESOLVE_IN_ROOT: an absolute link means the slot's "/"), magic links
(/proc/<pid>/fd/*, /proc/<pid>/root) never, and only regular files are read.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import struct
from pathlib import Path

_SYS_OPENAT2 = 437
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory: not read (it could block or never end)."""


class TooLarge(OSError):
    """The file is larger than the caller's cap."""

    def __init__(self, path: str, size: int, limit: int) -> None:
        super().__init__(errno.EFBIG, f"{path} is {size} bytes, over the limit of {limit}")
        self.size = size
        self.limit = limit


def openat2(dir_fd: int, path: str, flags: int, resolve: int, mode: int = 0) -> int:
    how = struct.pack("=QQQ", flags | os.O_CLOEXEC, mode, resolve)
    fd = _libc.syscall(
        _SYS_OPENAT2, ctypes.c_int(dir_fd), os.fsencode(path), how, ctypes.c_size_t(len(how))
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{os.strerror(err)}: {path}", path)
    return fd


def read_regular(
    root: Path | str, path: str, max_bytes: int, *, resolve: int = RESOLVE_IN_ROOT
) -> bytes:
    """The bytes of regular file `path` resolved beneath `root` (at most `max_bytes`).

    Raises FileNotFoundError, NotRegularFile, TooLarge, or OSError (EXDEV: it leads out of root).
    O_NONBLOCK: opening a FIFO must not block; it is refused after fstat."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = openat2(
            root_fd,
            path.lstrip("/") or ".",
            os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY,
            resolve | RESOLVE_NO_MAGICLINKS,
        )
    finally:
        os.close(root_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{path} is not a regular file", path)
        if st.st_size > max_bytes:
            raise TooLarge(path, st.st_size, max_bytes)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TooLarge(path, len(data), max_bytes)
    return data
