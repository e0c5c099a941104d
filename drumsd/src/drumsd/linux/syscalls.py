"""Thin ctypes wrappers for the Linux calls Python 3.11 lacks (mount, pivot_root, unshare, prctl).

Each wrapper raises OSError with the errno and the arguments, so a failed mount names its target.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MS_SLAVE = 0x80000

MNT_DETACH = 0x2

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

PR_SET_PDEATHSIG = 1
PR_SET_MEMORY_MERGE = 67

_SYS_PIVOT_ROOT = 155  # x86_64


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    ret = _libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
    _check(ret, f"mount {source!r} on {target!r} ({fstype}, flags={flags:#x}, {data!r})")


def umount2(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target!r}")


def pivot_root(new_root: str, put_old: str) -> None:
    ret = _libc.syscall(_SYS_PIVOT_ROOT, new_root.encode(), put_old.encode())
    _check(ret, f"pivot_root {new_root!r} {put_old!r}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(flags), f"unshare {flags:#x}")


def sethostname(name: str) -> None:
    raw = name.encode()
    _check(_libc.sethostname(raw, len(raw)), f"sethostname {name!r}")


def prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl {option} {arg}")


def link_up(name: str = "lo") -> None:
    """Bring a link up with SIOCSIFFLAGS (no `ip` binary needed inside a fresh netns)."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", name.encode(), 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, req))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", name.encode(), flags | iff_up))


_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = 0o2000000
_AT_RECURSIVE = 0x8000
_AT_EMPTY_PATH = 0x1000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
_MOVE_MOUNT_T_EMPTY_PATH = 0x40


def rebind_cwd() -> None:
    """Stack a recursive bind of the current directory onto itself and move into it, without
    resolving any path from /. In a user namespace the inherited root mount is locked (so
    pivot_root refuses it) and its ancestors may not be searchable by the slot's ids; a clone
    made here is ours, and fchdir reaches it without a path walk."""
    here = os.open(".", os.O_PATH | os.O_CLOEXEC)
    try:
        clone = _libc.syscall(
            _SYS_OPEN_TREE, -100, b".", _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE
        )
        _check(0 if clone >= 0 else -1, "open_tree . (clone)")
        try:
            ret = _libc.syscall(
                _SYS_MOVE_MOUNT,
                clone,
                b"",
                here,
                b"",
                _MOVE_MOUNT_F_EMPTY_PATH | _MOVE_MOUNT_T_EMPTY_PATH,
            )
            _check(0 if ret == 0 else -1, "move_mount clone onto .")
            os.fchdir(clone)
        finally:
            os.close(clone)
    finally:
        os.close(here)


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), f"setns fd {fd} type {nstype:#x}")


def socket_in_netns(pid: int) -> socket.socket:
    """A TCP socket of the network namespace of `pid` (a slot's init). The calling thread enters
    that namespace only for the socket() call and returns to its own: a socket belongs to the
    namespace it was made in, so it can be connected from here. Needs CAP_SYS_ADMIN."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(target, CLONE_NEWNET)
            try:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                setns(own, CLONE_NEWNET)
        finally:
            os.close(target)
    finally:
        os.close(own)
