"""Zero pages of a slot's System V shared memory given back before a dump (issue 35).

Xvfb runs with -shmem (guest/framebuffer.py), so the screen is a SysV segment of 1920x1080x4
bytes, and a restored segment is all resident: CRIU writes back every page it dumped. On a
base desktop 958 of its 2,026 pages were all zero bytes (black); an office desktop with an app
over the whole screen had none. CRIU 4.2.1 dumps a shmem
object by its data (`lseek(SEEK_DATA)` in `shmem.c`, with no soft-dirty tracking here): a hole
costs nothing, a zero page costs a page in every dump and every restored slot. A zero page made
a hole (`MADV_REMOVE`) reads back as zeros, so the segment's content is unchanged, and only the
bytes a dump writes (and the restored slot holds) shrink.

The caller holds the slot's tree frozen: a page found zero is removed before anything in the
slot can draw on it. Segments are reached through a process that has them attached
(`/proc/<pid>/map_files`, as CRIU itself does), so no IPC namespace is entered."""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterable
from dataclasses import dataclass

PAGE = mmap.PAGESIZE
_ZERO = bytes(PAGE)


@dataclass(frozen=True)
class Punched:
    segments: int  # SysV segments looked at
    bytes_before: int  # their data (allocated) bytes
    bytes_removed: int  # zero pages made holes
    took_s: float = 0.0

    def as_meta(self) -> dict[str, object]:
        return {
            "segments": self.segments,
            "data_bytes": self.bytes_before,
            "removed_bytes": self.bytes_removed,
            "took_s": round(self.took_s, 4),
        }


def sysv_mappings(maps_text: str) -> dict[int, str]:
    """shmid -> the `start-end` range of a SysV shared-memory mapping in a /proc/<pid>/maps text
    (the kernel names them `/SYSV<key>` and gives the shmid as the inode). Only writable-shared
    or read-shared mappings of a whole segment from offset 0 count."""
    out: dict[int, str] = {}
    for line in maps_text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/SYSV"):
            continue
        span, perms, offset, inode = fields[0], fields[1], fields[2], fields[4]
        if perms[3:4] != "s" or int(offset, 16) != 0:
            continue
        out.setdefault(int(inode), span)
    return out


def zero_page_runs(data: bytes | mmap.mmap, start: int, end: int) -> list[tuple[int, int]]:
    """(offset, length) runs of pages in data[start:end] that are all zero bytes. `start` is
    page-aligned; a last partial page (a segment's size need not be a multiple of the page:
    1920x1080x4 plus the XWD header is not) counts when its bytes up to `end` are zero, and
    its run ends at `end` (a removal takes its whole page: CRIU dumps whole pages)."""
    runs: list[tuple[int, int]] = []
    at = start
    while at < end:
        n = min(PAGE, end - at)
        if data[at : at + n] == _ZERO[:n]:
            if runs and runs[-1][0] + runs[-1][1] == at:
                runs[-1] = (runs[-1][0], runs[-1][1] + n)
            else:
                runs.append((at, n))
        at += n
    return runs


def _data_ranges(fd: int, size: int) -> list[tuple[int, int]]:
    """The allocated (data) ranges of a shmem file, page-aligned."""
    out: list[tuple[int, int]] = []
    at = 0
    while at < size:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
        except OSError:  # ENXIO: no data past `at`
            break
        hole = os.lseek(fd, data, os.SEEK_HOLE)
        out.append((data, min(hole, size)))
        at = hole
    return out


def punch_segment(fd: int) -> tuple[int, int]:
    """The zero pages of one segment's file made holes: (data bytes before, bytes removed)."""
    size = os.fstat(fd).st_size
    if size < PAGE:
        return 0, 0
    before = removed = 0
    with mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as m:
        for start, end in _data_ranges(fd, size):
            before += end - start
            for off, length in zero_page_runs(m, start, end):
                m.madvise(mmap.MADV_REMOVE, off, length)
                removed += length
    return before, removed


def punch_zero_pages(pids: Iterable[int]) -> Punched:
    """Every SysV segment attached by one of `pids` (host pids of the slot's processes, frozen)
    with its zero pages made holes. A segment or process that cannot be read is left as it is:
    this only saves bytes, a dump never needs it."""
    seen: set[int] = set()
    segments = before = removed = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as f:
                mappings = sysv_mappings(f.read())
        except OSError:
            continue
        for shmid, span in mappings.items():
            if shmid in seen:
                continue
            seen.add(shmid)
            try:
                fd = os.open(f"/proc/{pid}/map_files/{span}", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                b, r = punch_segment(fd)
            except (OSError, ValueError):
                continue
            finally:
                with contextlib.suppress(OSError):
                    os.close(fd)
            segments, before, removed = segments + 1, before + b, removed + r
    return Punched(segments, before, removed)
