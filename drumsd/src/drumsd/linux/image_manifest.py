"""An image tree's manifest: one line per entry (path, mode, owner, size, content hash, link
target, no mtimes); its sha256 is the image's sha256 (the checkpoints' `image_sha256`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path


def manifest_line(rel: str, st: os.stat_result, content_sha: str, link: str) -> str:
    """One manifest entry; mtimes are left out so the hash says what the tree is, not when."""
    return "\t".join(
        [
            rel,
            f"{st.st_mode:o}",
            str(st.st_uid),
            str(st.st_gid),
            str(st.st_size if stat.S_ISREG(st.st_mode) else 0),
            content_sha,
            link,
        ]
    )


def iter_tree(root: Path) -> Iterator[tuple[str, Path]]:
    """Every entry under root (not root itself), depth-first in byte order of names."""
    stack = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        names = sorted(os.listdir(directory), key=os.fsencode, reverse=True)
        for name in names:
            rel = f"{prefix}/{name}" if prefix else name
            path = directory / name
            yield rel, path
        for name in names:
            path = directory / name
            if path.is_dir() and not path.is_symlink():
                stack.append((path, f"{prefix}/{name}" if prefix else name))


def write_manifest(root: Path, out: Path) -> str:
    """Write the manifest of `root` to `out` and return its sha256 (the image's sha256)."""
    by_inode: dict[tuple[int, int], str] = {}
    lines = []
    for rel, path in sorted(iter_tree(root), key=lambda e: os.fsencode(e[0])):
        st = path.lstat()
        content, link = "", ""
        if stat.S_ISREG(st.st_mode):
            ident = (st.st_dev, st.st_ino)
            if ident not in by_inode:
                by_inode[ident] = _sha256_path(path)
            content = by_inode[ident]
        elif stat.S_ISLNK(st.st_mode):
            link = os.readlink(path)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            content = f"dev:{os.major(st.st_rdev)},{os.minor(st.st_rdev)}"
        lines.append(manifest_line(rel, st, content, link))
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
    out.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _sha256_path(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
