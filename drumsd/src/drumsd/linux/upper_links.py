"""A delta save's upper copy that links what the restore copied and nothing changed since (issue
35), the OS half: the record written at the restore, right after its copy of the checkpoint's
upper and before the slot runs (`record_restored`), and the post-dump copy that hard-links the
files still as recorded to the parent checkpoint's and copies the rest with `cp -a` as before
(`copy_linking`). Rules: `drumsd.core.upper_since`.

The copy runs in CRIU's post-dump action while the tree is frozen, as a script in a fresh
interpreter (`python -I -S upper_links.py SRC DST RECORD PARENT_UPPER CP_FLAG STATS`), so this
module imports nothing heavy at load (pathlib, json and re cost ~15 ms there)."""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # not typing's: importing it costs ~12 ms in the post-dump action

if __name__ == "__main__":  # the post-dump action: drumsd from where this file is
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from drumsd.core.upper_since import (  # noqa: E402
    decode_record,
    encode_record,
    recordable,
    skip_existing_flag,
    unchanged_since_restore,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

RECORD_NAME = "upper-restored.rec"  # in the instance dir, beside owner.json: not in the slot
STATS_NAME = "upper-links.txt"  # in the checkpoint dir until the dump reads it into meta.json


def record_restored(upper: Path, source: Path, out: Path) -> int:
    """Record each regular file of `upper` (just copied from `source`, before anything of the
    slot ran) with its inode number and ctime into `out`; the number recorded. The walk does
    not follow symlinks: a recorded path goes through real directories only."""
    root = os.fsencode(upper)
    cut = len(root) + 1
    stamps: list[tuple[bytes, int, int]] = []
    for e in _non_dirs(root):
        if e.is_file(follow_symlinks=False):
            st = e.stat(follow_symlinks=False)
            if recordable(st):
                stamps.append((e.path[cut:], st.st_ino, st.st_ctime_ns))
    tmp = os.fsencode(out) + b".tmp"
    with open(tmp, "wb") as f:
        f.write(encode_record(os.fsencode(os.path.realpath(source)), stamps))
    os.replace(tmp, out)
    return len(stamps)


def link_unchanged_since_restore(
    src: bytes, dst: bytes, record: bytes, parent: bytes
) -> tuple[int, int, int]:
    """Hard-link into `dst` (the checkpoint's upper, empty) the parent's file for every file of
    `src` (the slot's upper, frozen) still as `record` has it, with the directories they are in
    (their attributes come from the `cp -a` that follows); (files linked, their bytes, files
    recorded). Nothing is linked when the record is of a copy from another upper than
    `parent`. The walk of `src` does not follow symlinks, so a path resolves as it does in the
    tree the dump holds."""
    with open(record, "rb") as f:
        source, stamps = decode_record(f.read())
    if not stamps or os.path.realpath(source) != os.path.realpath(parent):
        return 0, 0, len(stamps)
    cut = len(src) + 1
    files = size = 0
    made: set[bytes] = set()
    for e in _non_dirs(src):
        rel = e.path[cut:]
        recorded = stamps.get(rel)
        if recorded is None or not e.is_file(follow_symlinks=False):
            continue
        st = e.stat(follow_symlinks=False)
        try:
            pst = os.lstat(parent + b"/" + rel)
        except OSError:
            continue
        if not unchanged_since_restore(recorded, st, pst):
            continue
        where = os.path.dirname(rel)
        if where and where not in made:
            os.makedirs(dst + b"/" + where, exist_ok=True)
            made.add(where)
        try:
            os.link(parent + b"/" + rel, dst + b"/" + rel)
        except OSError:  # another filesystem, the inode's link limit: cp copies it
            continue
        files += 1
        size += st.st_size
    return files, size, len(stamps)


def _non_dirs(root: bytes) -> Iterator[os.DirEntry[bytes]]:
    """Every entry under `root` that is not a directory, without following symlinks (so a path
    resolves as it does in the tree the dump holds)."""
    dirs = [root]
    while dirs:
        with os.scandir(dirs.pop()) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    dirs.append(e.path)
                else:
                    yield e


def copy_linking(
    src: bytes, dst: bytes, record: bytes, parent: bytes, cp_flag: str, stats: bytes
) -> None:
    """The post-dump copy: the unchanged files linked, their count written to `stats`, then
    `cp -a` with `cp_flag` (which leaves what exists) for the rest; this process becomes that
    cp. When linking fails, whatever it made goes and the upper is copied whole, as before."""
    t0 = time.monotonic()
    os.makedirs(dst, exist_ok=True)
    try:
        files, size, recorded = link_unchanged_since_restore(src, dst, record, parent)
    except (OSError, ValueError) as exc:
        import shutil

        print(f"upper links: {exc}; copying the upper whole", file=sys.stderr)
        shutil.rmtree(dst)
        os.makedirs(dst)
        files, size, recorded, cp_flag = 0, 0, 0, ""
    took = time.monotonic() - t0
    with open(stats, "w") as f:
        f.write(f"{files} {size} {recorded} {took:.4f}\n")
    argv = ["cp", "-a", *([cp_flag] if cp_flag else []), src + b"/.", dst + b"/"]
    os.execvp("cp", argv)  # type: ignore[arg-type]  # bytes and str args both go to execvp


def read_stats(dest: Path) -> dict[str, float] | None:
    """What the post-dump copy linked (meta.json's `upper_links`), its file removed; None when
    the copy did not link (no record, another cp)."""
    p = dest / STATS_NAME
    try:
        files, size, recorded, took = p.read_text().split()
    except (OSError, ValueError):
        return None
    p.unlink(missing_ok=True)
    return {
        "files": int(files),
        "bytes": int(size),
        "recorded": int(recorded),
        "took_s": float(took),
    }


_CP_FLAG: list[str | None] = []


def cp_skip_flag() -> str | None:
    """This host's `cp` flag that leaves existing files (`upper_since.skip_existing_flag`),
    asked once."""
    if not _CP_FLAG:
        import subprocess

        try:
            out = subprocess.run(
                ["cp", "--version"], capture_output=True, text=True, timeout=10
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        _CP_FLAG.append(skip_existing_flag(out.splitlines()[0] if out else ""))
    return _CP_FLAG[0]


def post_dump_argv(
    slot_upper: Path, dest_upper: Path, record: Path, parent_upper: Path, stats: Path
) -> list[str] | None:
    """The command CRIU's post-dump action runs instead of `cp -a` for a save stored against
    `parent_upper` when the slot has a record of its restore; None: copy as before."""
    flag = cp_skip_flag()
    if flag is None or not record.is_file() or not parent_upper.is_dir():
        return None
    return [
        sys.executable,
        "-I",
        "-S",
        os.path.abspath(__file__),
        str(slot_upper),
        str(dest_upper),
        str(record),
        str(parent_upper),
        flag,
        str(stats),
    ]


def main(argv: list[str]) -> None:
    src, dst, record, parent, flag, stats = (os.fsencode(a) for a in argv)
    copy_linking(src, dst, record, parent, os.fsdecode(flag), stats)


if __name__ == "__main__":
    main(sys.argv[1:])
