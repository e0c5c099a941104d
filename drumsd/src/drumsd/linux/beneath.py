"""Open a path beneath a root directory fd with openat2, never escaping it (issue 14).

The checker reads a slot's files from the host side, beneath the slot's root as the daemon sees
it (/proc/<init>/root), so no process in the slot can answer in the guest's place. Symlinks are
followed as the slot would (RESOLVE_IN_ROOT: an absolute link means the slot's "/"), magic links
(/proc/<pid>/fd/*, /proc/<pid>/root) never, and only regular files are read.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import stat
import struct
from collections.abc import Iterator
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


# ---- confined walks of a slot's upper layer (issue 39, D4) ------------------------------------
#
# The upper layer is a host directory whose contents the desktop user made. A walk of it by root
# must not follow a symlink anywhere (a ~/Documents swapped for a link to / listed the host),
# must not stall on a FIFO, and must stay beneath the directory it started from, even when a
# component is swapped for a link while the walk runs.

CONFINED = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV


def open_beneath(root: Path | str, path: str, flags: int = os.O_RDONLY) -> int:
    """An fd of `path` beneath `root`, no symlink followed on the way (the last component
    included: ELOOP), never crossing a mount. Raises FileNotFoundError, NotADirectoryError
    (O_DIRECTORY on a file), OSError(ELOOP) for a link."""
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return openat2(root_fd, path.strip("/") or ".", flags | os.O_NOFOLLOW, CONFINED)
    finally:
        os.close(root_fd)


def lstat_beneath(root: Path | str, path: str) -> os.stat_result | None:
    """lstat of `path` beneath `root` without following a link on the way; None if absent or
    reached only through a link."""
    parent, _, name = path.strip("/").rpartition("/")
    try:
        fd = open_beneath(root, parent, os.O_PATH | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        return os.stat(name, dir_fd=fd, follow_symlinks=False) if name else os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)


MAX_DEPTH = 256


def walk_beneath(root: Path | str, path: str) -> Iterator[tuple[str, list[str], list[str], int]]:
    """Walk directory `path` beneath `root`, top down: (its path relative to `root`, its
    subdirectories, its other entries (symlinks among them), an fd of it). Each directory is
    opened beneath its parent's fd with O_DIRECTORY and no link followed, so an entry swapped
    for a link, a FIFO or a device while the walk runs is skipped, never opened (os.fwalk opens
    with a plain open(2)). Directories deeper than MAX_DEPTH are not entered."""
    top = path.strip("/")
    fd = open_beneath(root, top, os.O_RDONLY | os.O_DIRECTORY)  # raises here, not at next()
    return _walk_fd(top, fd, 0)


def _walk_fd(rel: str, fd: int, depth: int) -> Iterator[tuple[str, list[str], list[str], int]]:
    try:
        dirs: list[str] = []
        others: list[str] = []
        with os.scandir(fd) as entries:
            for entry in entries:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue  # gone while listing
                (dirs if is_dir else others).append(entry.name)
        dirs.sort()
        others.sort()
        yield rel, dirs, others, fd
        if depth >= MAX_DEPTH:
            return
        for name in dirs:
            try:
                child = openat2(fd, name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, CONFINED)
            except OSError:
                continue  # swapped for something else, or gone
            yield from _walk_fd(f"{rel}/{name}".strip("/"), child, depth + 1)
    finally:
        os.close(fd)


def sha256_at(dir_fd: int, name: str, chunk: int = 1 << 20) -> str | None:
    """sha256 of regular file `name` in directory `dir_fd` (not followed if a link, not read
    if not a regular file: None)."""
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        while data := os.read(fd, chunk):
            digest.update(data)
        return digest.hexdigest()
    finally:
        os.close(fd)
