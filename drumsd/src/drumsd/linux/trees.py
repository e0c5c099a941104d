"""Directory trees of a slot's upper layer: hashing a snapshot and copying one (synchronous OS
effects; the runtime calls them through trio.to_thread)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path


def tree_sha256(root: Path) -> str:
    """A hash of a directory tree (paths, modes, sizes, contents, link targets): the identity of an
    upper-layer snapshot."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            h.update(f"{rel}\0{st.st_mode:o}\0{st.st_uid}\0{st.st_size}\0".encode())
            if p.is_symlink():
                h.update(os.readlink(p).encode())
            elif p.is_file():
                with open(p, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
    return h.hexdigest()


def copy_tree(src: Path, dst: Path) -> None:
    """Copy `src`'s contents into `dst`. cp -a keeps whiteouts (0/0 char devices), xattrs
    (overlay's opaque/origin) and ownership."""
    proc = subprocess.run(["cp", "-a", f"{src}/.", f"{dst}/"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(f"cp -a {src} {dst} failed: {proc.stderr.strip()}")
