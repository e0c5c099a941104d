"""Zero pages of SysV shared memory made holes before a dump (linux/shm_zero.py): the maps
parser, the zero-page runs, and a real segment attached here punched with its bytes unchanged."""

from __future__ import annotations

import ctypes
import mmap
import os

import pytest
from drumsd.linux import cgroups, shm_zero
from drumsd.linux.shm_zero import (
    PAGE,
    punch_segment,
    punch_zero_pages,
    sysv_mappings,
    zero_page_runs,
)

pytestmark = pytest.mark.unit

MAPS = """\
55d0c0a00000-55d0c0a21000 r--p 00000000 00:1f 1234 /usr/bin/Xvfb
7f1c2a000000-7f1c2a7ea000 rw-s 00000000 00:01 32769 /SYSV00000000 (deleted)
7f1c2b000000-7f1c2b7ea000 r--s 00000000 00:01 32769 /SYSV00000000 (deleted)
7f1c2c000000-7f1c2c001000 rw-s 00001000 00:01 32770 /SYSV0000abcd (deleted)
7f1c2d000000-7f1c2d001000 rw-p 00000000 00:00 0
7f1c2e000000-7f1c2e010000 rw-s 00000000 00:01 99 /memfd:x (deleted)
"""


def test_sysv_mappings_are_whole_shared_segments_by_shmid() -> None:
    assert sysv_mappings(MAPS) == {32769: "7f1c2a000000-7f1c2a7ea000"}


def test_zero_page_runs_join_neighbours_and_end_at_a_partial_last_page() -> None:
    data = bytearray(7 * PAGE + 100)
    data[2 * PAGE + 5] = 1
    data[5 * PAGE] = 7
    assert zero_page_runs(bytes(data), 0, len(data)) == [
        (0, 2 * PAGE),
        (3 * PAGE, 2 * PAGE),
        (6 * PAGE, PAGE + 100),  # the last, partial page: zero up to the end
    ]
    assert zero_page_runs(bytes(data), 3 * PAGE, 4 * PAGE) == [(3 * PAGE, PAGE)]
    data[7 * PAGE + 99] = 1
    assert zero_page_runs(bytes(data), 6 * PAGE, len(data)) == [(6 * PAGE, PAGE)]


def _allocated(fd: int, size: int) -> int:
    return sum(end - start for start, end in shm_zero._data_ranges(fd, size))


def test_a_memfd_loses_its_zero_pages_and_keeps_its_bytes() -> None:
    fd = os.memfd_create("shm-zero-test")
    try:
        size = 64 * PAGE + 160  # and a partial last page, zero like 60 others
        content = bytearray(size)
        for page in (1, 2, 30, 63):
            content[page * PAGE + 17] = page
        os.write(fd, bytes(content))  # every page written: all allocated, 60 of them zero
        assert _allocated(fd, size) == size
        before, removed = punch_segment(fd)
        assert (before, removed) == (size, 60 * PAGE + 160)
        assert _allocated(fd, size) == 4 * PAGE
        assert os.pread(fd, size + 10, 0) == bytes(content)
    finally:
        os.close(fd)


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    libc.shmdt.argtypes = [ctypes.c_void_p]
    return libc


def test_a_sysv_segment_attached_by_a_process_is_punched_through_map_files() -> None:
    if not os.access("/proc/self/map_files", os.R_OK) or os.geteuid() != 0:
        pytest.skip("opening /proc/<pid>/map_files needs CAP_SYS_ADMIN (run as root)")
    libc = _libc()
    size = 32 * PAGE
    shmid = libc.shmget(0, size, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    assert shmid >= 0, os.strerror(ctypes.get_errno())
    try:
        addr = libc.shmat(shmid, None, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value)
        try:
            buf = (ctypes.c_char * size).from_address(addr)
            ctypes.memset(addr, 0, size)  # every page touched: resident
            buf[5 * PAGE] = b"\x09"
            got = punch_zero_pages([os.getpid()])
            assert got.segments >= 1 and got.bytes_removed >= 31 * PAGE
            assert buf[5 * PAGE] == b"\x09" and bytes(buf[: 5 * PAGE]) == bytes(5 * PAGE)
        finally:
            libc.shmdt(ctypes.c_void_p(addr))
    finally:
        libc.shmctl(shmid, 0, None)  # IPC_RMID


def test_a_process_gone_or_unreadable_is_left_alone() -> None:
    got = punch_zero_pages([2**22 + 12345])
    assert got == shm_zero.Punched(0, 0, 0)
    assert mmap.PAGESIZE == PAGE


class _Driver:
    def __init__(self, freezes: bool = True) -> None:
        self.calls: list[str] = []
        self.freezes = freezes

    def freeze(self, dirs: object, timeout_s: float = 2.0) -> None:
        self.calls.append("freeze")
        if not self.freezes:
            raise cgroups.CgroupError("did not freeze")

    def thaw(self, dirs: object) -> None:
        self.calls.append("thaw")

    def pids(self, dirs: object) -> list[int]:
        self.calls.append("pids")
        return [2**22 + 12345]


def test_the_dumper_punches_only_while_the_slot_is_frozen_and_thaws_it() -> None:
    from types import SimpleNamespace

    from drumsd.runtime.linux.dumps import Dumper

    inst = SimpleNamespace(iid="i-1", cgroups={"freezer": "/x"})
    driver = _Driver()
    dumper = Dumper.__new__(Dumper)
    dumper.driver = driver  # type: ignore[assignment]
    got = dumper.shm_holes(inst)  # type: ignore[arg-type]
    assert driver.calls == ["freeze", "pids", "thaw"]
    assert got is not None and got.segments == 0
    stuck = _Driver(freezes=False)
    dumper.driver = stuck  # type: ignore[assignment]
    assert dumper.shm_holes(inst) is None  # type: ignore[arg-type]
    assert "pids" not in stuck.calls and stuck.calls[-1] == "thaw"  # never left half frozen
