"""Names looked up again, so the kernel re-attaches a dentry to an inode an inotify watch pins.

An inotify watch holds its inode, not the inode's dentry; once memory pressure (or drop_caches)
evicts that dentry, the kernel can no longer encode the watched overlay inode as a file handle,
its fdinfo carries none, and CRIU 4.2.1 refuses the whole dump. A lookup of the inode's name
makes the dentry again. Nothing says which name that is, so the walk looks up every directory of
the slot's root (one filesystem, breadth-first: the watches of a desktop are on directories) and
every entry whose inode number is wanted, until all are found or the time is up.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path


def look_up_again(root: Path, inodes: set[int], budget_s: float) -> set[int]:
    """The `inodes` met (and so looked up) walking `root`'s filesystem within `budget_s`."""
    deadline = time.monotonic() + budget_s
    found: set[int] = set()
    try:
        device = root.stat().st_dev
    except OSError:
        return found
    queue = deque([str(root)])
    while queue and found != inodes and time.monotonic() < deadline:
        for entry in _entries(queue.popleft()):
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                if not is_dir and entry.inode() not in inodes:
                    continue
                st = entry.stat(follow_symlinks=False)  # the lookup that makes the dentry
            except OSError:
                continue
            if st.st_ino in inodes:
                found.add(st.st_ino)
            if is_dir and st.st_dev == device:
                queue.append(entry.path)
    return found


def _entries(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []
