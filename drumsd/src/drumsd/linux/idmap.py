"""User namespaces and idmapped mounts for the hardened profile, and CRIU's userns image.

A hardened slot N runs in a user namespace mapping in-slot ids 0..65535 to host ids
`100000 + N*65536`. Its image and its upper layer are seen through idmapped bind mounts of that
range, so files on disk keep in-slot ids and one checkpoint restores into any range: only the
36-byte `userns-*.img` differs, rewritten per range (`rewrite_userns_image`).
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from drumsd.linux.syscalls import _libc

UID_BASE = 100_000
UID_COUNT = 65_536
IDENTITY = ((0, 0, 4_294_967_295),)

_SYS_OPEN_TREE = 428
_SYS_MOVE_MOUNT = 429
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = 0o2000000
_MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_IDMAP = 0x00100000


def uid_base(index: int) -> int:
    return UID_BASE + index * UID_COUNT


def range_map(index: int) -> tuple[tuple[int, int, int], ...]:
    """(first in slot, first on host, count) extents of slot range `index`."""
    return ((0, uid_base(index), UID_COUNT),)


def map_text(extents: Sequence[tuple[int, int, int]]) -> str:
    return "".join(f"{a} {b} {c}\n" for a, b, c in extents)


# ---------------------------------------------------------------- CRIU userns image (pure)


@dataclass(frozen=True)
class UsernsImage:
    magic: bytes  # CRIU's two 32-bit magics
    uid_map: tuple[tuple[int, int, int], ...]
    gid_map: tuple[tuple[int, int, int], ...]


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _decode_extent(buf: bytes) -> tuple[int, int, int]:
    fields = {1: 0, 2: 0, 3: 0}
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        value, i = _read_varint(buf, i)
        fields[key >> 3] = value
    return fields[1], fields[2], fields[3]


def decode_userns_image(data: bytes) -> UsernsImage:
    """CRIU image: 8 bytes of magic, a u32 size, one UsernsEntry (repeated uid_map = 1,
    gid_map = 2, each an extent {first = 1, lower_first = 2, count = 3})."""
    size = int.from_bytes(data[8:12], "little")
    body = data[12 : 12 + size]
    uid: list[tuple[int, int, int]] = []
    gid: list[tuple[int, int, int]] = []
    i = 0
    while i < len(body):
        key, i = _read_varint(body, i)
        length, i = _read_varint(body, i)
        extent = _decode_extent(body[i : i + length])
        i += length
        (uid if key >> 3 == 1 else gid).append(extent)
    return UsernsImage(data[:8], tuple(uid), tuple(gid))


def encode_userns_image(img: UsernsImage) -> bytes:
    def extent(e: tuple[int, int, int]) -> bytes:
        return b"".join(bytes([tag]) + _varint(v) for tag, v in zip((8, 16, 24), e, strict=True))

    body = b""
    for tag, extents in ((0x0A, img.uid_map), (0x12, img.gid_map)):
        for e in extents:
            enc = extent(e)
            body += bytes([tag]) + _varint(len(enc)) + enc
    return img.magic + len(body).to_bytes(4, "little") + body


def rewrite_userns_image(data: bytes, extents: Sequence[tuple[int, int, int]]) -> bytes:
    img = decode_userns_image(data)
    return encode_userns_image(UsernsImage(img.magic, tuple(extents), tuple(extents)))


def images_for_map(src: Path, dst: Path, extents: Sequence[tuple[int, int, int]]) -> None:
    """A copy of a checkpoint's image dir for another id map: hard links (same tmpfs; criu
    opens images after entering the slot's mount namespace, so symlinks fail) and a rewritten
    userns image."""
    tmp = dst.with_name(dst.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True)
    for f in src.iterdir():
        if f.name.startswith("userns-"):
            (tmp / f.name).write_bytes(rewrite_userns_image(f.read_bytes(), extents))
        elif f.is_file():
            os.link(f, tmp / f.name)
    os.replace(tmp, dst)


# ---------------------------------------------------------------- OS effects


def userns_fd(extents: Sequence[tuple[int, int, int]], timeout_s: float = 5.0) -> int:
    """An fd of a fresh user namespace with `extents` as uid and gid map (for idmapped mounts).
    A short-lived `unshare --user sleep` holds it while the maps are written (no fork here: the
    daemon is threaded)."""
    proc = subprocess.Popen(["unshare", "--user", "sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        mine = os.stat("/proc/self/ns/user").st_ino
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if os.stat(f"/proc/{proc.pid}/ns/user").st_ino != mine:
                    break
            except FileNotFoundError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise OSError(f"unshare --user did not start (exit {proc.poll()})")
            time.sleep(0.0005)
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{proc.pid}/{name}").write_text(map_text(extents))
        return os.open(f"/proc/{proc.pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        proc.kill()
        proc.wait()


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def idmapped_bind(src: Path, dst: Path, ns_fd: int, *, readonly: bool) -> None:
    """Bind `src` at `dst` seen through the id map of user namespace `ns_fd` (util-linux 2.38's
    `mount -o X-mount.idmap` silently ignores the option, so the syscalls are called here)."""
    fd = _check(
        _libc.syscall(
            _SYS_OPEN_TREE, _AT_FDCWD, str(src).encode(), _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC
        ),
        f"open_tree {src}",
    )
    try:
        attr = _MountAttr(MOUNT_ATTR_IDMAP | (MOUNT_ATTR_RDONLY if readonly else 0), 0, 0, ns_fd)
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
            ),
            f"mount_setattr idmap {src}",
        )
        _check(
            _libc.syscall(
                _SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, str(dst).encode(), _MOVE_MOUNT_F_EMPTY_PATH
            ),
            f"move_mount {src} -> {dst}",
        )
    finally:
        os.close(fd)
