"""Directory trees of a slot's upper layer: hashing a snapshot, copying one and measuring one
(synchronous OS effects; the runtime calls them through trio.to_thread). Files with holes cost
what they hold, not their apparent size (see `drumsd.linux.sparse`)."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from pathlib import Path

from drumsd.linux import sparse
from drumsd.linux.sparse import NEVER, CancelFlag, Usage

# How often a copy's `cp` is looked at for the cancel flag.
_POLL_S = 0.05


def tree_sha256(root: Path, cancel: CancelFlag = NEVER) -> str:
    """A hash of a directory tree (paths, modes, sizes, contents, link targets): the identity of an
    upper-layer snapshot. A file's holes are not read (`sparse.hash_file`)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        cancel.check(f"hashing {root}")
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            h.update(f"{rel}\0{st.st_mode:o}\0{st.st_uid}\0{st.st_size}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(p).encode())
            elif stat.S_ISREG(st.st_mode):
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
                try:
                    sparse.hash_file(fd, st.st_size, h, cancel)
                finally:
                    os.close(fd)
    return h.hexdigest()


def own_usage(root: Path, cancel: CancelFlag = NEVER) -> Usage:
    """Like `tree_usage`, but each file once and only when all its hard links are under
    `root`: the bytes removing `root` would free."""
    files: dict[tuple[int, int], tuple[int, int, Usage]] = {}  # inode -> links seen, nlink, usage
    for dirpath, _, filenames in os.walk(root):
        cancel.check(f"measuring {root}")
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            key = (st.st_dev, st.st_ino)
            seen, nlink, usage = files.get(key, (0, st.st_nlink, sparse.usage_of(st)))
            files[key] = (seen + 1, nlink, usage)
    total = Usage()
    for seen, nlink, usage in files.values():
        if seen >= nlink:
            total += usage
    return total


def tree_usage(root: Path, cancel: CancelFlag = NEVER) -> Usage:
    """Allocated and apparent bytes of the regular files under `root` (unreadable entries are
    skipped): a stat per entry, no file is read."""
    total = Usage()
    for dirpath, _, filenames in os.walk(root):
        cancel.check(f"measuring {root}")
        for name in filenames:
            try:
                total += sparse.usage_of(os.lstat(os.path.join(dirpath, name)))
            except OSError:
                continue
    return total


def copy_tree(src: Path, dst: Path, cancel: CancelFlag = NEVER) -> None:
    """Copy `src`'s contents into `dst`. cp -a keeps whiteouts (0/0 char devices), xattrs
    (overlay's opaque/origin) and ownership; coreutils 9's cp copies a file's data extents only
    and leaves its holes (SEEK_DATA), so an 8 TiB sparse file copies in milliseconds (the unit
    tests hold it to that). The cancel flag kills the cp: `dst` is then half written."""
    proc = subprocess.Popen(
        ["cp", "-a", "--sparse=auto", f"{src}/.", f"{dst}/"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while True:
            try:
                _, err = proc.communicate(timeout=_POLL_S)
                break
            except subprocess.TimeoutExpired:
                if cancel.is_set():
                    raise sparse.Cancelled(f"cancelled: copying {src} to {dst}") from None
    finally:
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise OSError(f"cp -a {src} {dst} failed: {err.strip()}")
