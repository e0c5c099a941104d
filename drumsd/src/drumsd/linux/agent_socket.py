"""The guest agent's socket seen from the host, synchronous: where a slot's agent listens, and a
connectable path to it that a slot's users cannot redirect (openat2 beneath the slot's root with
no symlinks, the inode checked to be a socket owned by the slot's root). Metadata syscalls on
/proc that take microseconds: `drumsd.runtime.agent_client` calls them inline before connecting.
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from drumsd.guest import protocol

AGENT_SOCKET_IN_SLOT = protocol.SOCKET_PATH

_IN_SLOT = re.compile(r"^/proc/(\d+)/root/(.+)$")
_SYS_OPENAT2 = 437  # x86_64 and the generic table alike
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


def agent_socket(init_pid: int) -> Path:
    """Where the host reaches the agent of the slot whose init has host pid `init_pid`."""
    return Path(f"/proc/{init_pid}/root{AGENT_SOCKET_IN_SLOT}")


def slot_root_uid(init_pid: int) -> int:
    """The host uid of root inside the slot of `init_pid` (0 without a user namespace)."""
    with open(f"/proc/{init_pid}/uid_map") as f:
        for line in f:
            inside, outside, count = (int(x) for x in line.split())
            if inside == 0 < count:
                return outside
    raise OSError(f"root of the slot of pid {init_pid} is not mapped in its uid_map")


def open_in_root(root_fd: int, path: str) -> int:
    """openat2(O_PATH) of `path` beneath `root_fd`, treated as "/", following no symlink."""
    how = struct.pack(
        "=QQQ",
        os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW,
        0,
        _RESOLVE_IN_ROOT | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS,
    )
    fd = _libc.syscall(
        _SYS_OPENAT2, ctypes.c_int(root_fd), path.encode(), how, ctypes.c_size_t(len(how))
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{os.strerror(err)} resolving {path} in the slot's root")
    return fd


@contextmanager
def connectable_path(sock_path: Path) -> Iterator[str]:
    """A path to connect to for `sock_path`. For /proc/<pid>/root/<p>: /proc/self/fd/<n> of the
    socket inode found by resolving <p> inside that root without symlinks (raises OSError if it
    is not a socket owned by the slot's root). Other paths are returned as they are."""
    m = _IN_SLOT.match(str(sock_path))
    if m is None:
        yield str(sock_path)
        return
    pid, inner = int(m.group(1)), m.group(2)
    root_fd = os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = open_in_root(root_fd, inner)
    finally:
        os.close(root_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(f"{sock_path} is not a socket")
        owner = slot_root_uid(pid)
        if st.st_uid != owner:
            raise OSError(
                f"{sock_path} is owned by host uid {st.st_uid}, not by the slot's root "
                f"({owner}): not the agent's socket"
            )
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
