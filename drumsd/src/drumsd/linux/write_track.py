"""Write tracking of a restored slot without soft-dirty (issue 35): each process of the tree,
stopped as CRIU left it, makes a userfaultfd (one syscall run in it through ptrace), which the
daemon takes (pidfd_getfd) and keeps; its private mappings are registered for asynchronous
write-protect and their present pages protected. From then on the kernel clears a
page's protection at its first write without stopping anyone, and PAGEMAP_SCAN tells the
written pages apart: drums' CRIU (`criu-track-mem-uffd-wp.patch`) then dumps only those, the rest
as "in the parent checkpoint", which is what the tree was restored from.

Only present pages are protected: an empty one protected would keep a marker, and a read
through it can bring in a page the parent never held (a private file mapping's, copied).
Everything not armed (shared memory, mappings made later, a process forked later) counts as
written, and so does a page ksmd merges (its merge drops the protection), so a failure here
costs bytes, never correctness. x86-64 only (the registers below)."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import platform
import signal
import struct
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long
_libc.syscall.restype = ctypes.c_long

_PTRACE_GETREGS, _PTRACE_SETREGS, _PTRACE_SINGLESTEP, _PTRACE_DETACH = 12, 13, 9, 17
_PTRACE_SEIZE, _PTRACE_INTERRUPT = 0x4206, 0x4207
_PTRACE_O_SUSPEND_SECCOMP = 1 << 21  # the slot's seccomp filter refuses userfaultfd
_NR_CLOSE, _NR_USERFAULTFD, _NR_PIDFD_OPEN, _NR_PIDFD_GETFD = 3, 323, 434, 438
_UFFD_USER_MODE_ONLY = 1  # allowed to any user (vm.unprivileged_userfaultfd is 0 here)
_WALL = 0x40000000  # waitpid: a traced process, not a child

_UFFD_API = 0xAA
_UFFD_FEATURE_WP_UNPOPULATED = 1 << 13  # PAGEMAP_SCAN reports an anon vma as armed only so
_UFFD_FEATURE_WP_ASYNC = 1 << 15  # the kernel resolves a write itself
_UFFDIO_API = 0xC018AA3F
_UFFDIO_REGISTER = 0xC020AA00
_UFFDIO_REGISTER_MODE_WP = 2

_PAGEMAP_SCAN = 0xC0606610
_PM_SCAN_WP_MATCHING = 1 << 0
_PAGE_IS_WPALLOWED, _PAGE_IS_WRITTEN, _PAGE_IS_FILE = 1 << 0, 1 << 1, 1 << 2
_PAGE_IS_PRESENT, _PAGE_IS_SWAPPED, _PAGE_IS_PFNZERO = 1 << 3, 1 << 4, 1 << 5
_NOT_ANON = _PAGE_IS_PFNZERO | _PAGE_IS_FILE  # inverted: present pages of a process's own
_RETURNED = _PAGE_IS_WPALLOWED | _PAGE_IS_WRITTEN | _PAGE_IS_PRESENT | _PAGE_IS_SWAPPED
_TASK_SIZE = 0x7FFFFFFFF000
_VEC_LEN = 4096  # regions per PAGEMAP_SCAN call
_SPECIAL = frozenset(("[vdso]", "[vvar]", "[vvar_vclock]", "[vsyscall]"))


class _Regs(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_ulonglong)
        for name in (
            "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags "
            "rsp ss fs_base gs_base ds es fs gs"
        ).split()
    ]


class TrackError(OSError):
    """A process that could not be armed (its pages then count as written)."""


@dataclass
class Armed:
    """The userfaultfds of one tree's processes, held by the daemon: closing one disarms its
    process (its pages then all count as written)."""

    checkpoint_id: str  # what the tree was restored from: the parent a tracked dump refers to
    fds: dict[int, int] = field(default_factory=dict)  # host pid -> userfaultfd
    failed: dict[int, str] = field(default_factory=dict)  # host pid -> why not
    took_s: float = 0.0

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    def as_meta(self) -> dict[str, object]:
        return {
            "armed": len(self.fds),
            "failed": dict(sorted((str(p), why) for p, why in self.failed.items())),
            "took_s": round(self.took_s, 4),
        }


@functools.cache
def criu_tracks_writes(criu: Path) -> bool:
    """Whether `criu` is drums' build with `--track-mem-uffd-wp` (a stock CRIU refuses the
    option) on a host whose processes this module can arm (x86-64)."""
    if platform.machine() != "x86_64":
        return False
    try:
        done = subprocess.run(
            [str(criu), "--track-mem-uffd-wp", "--version"],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def arm_tree(checkpoint_id: str, pids: Iterable[int]) -> Armed:
    """Arm every process of a tree CRIU left stopped (`--leave-stopped`); the caller resumes
    them after (`resume`). A process that cannot be armed is listed in `failed`."""
    t0 = time.monotonic()
    armed = Armed(checkpoint_id)
    for pid in pids:
        try:
            armed.fds[pid] = arm(pid)
        except OSError as exc:
            armed.failed[pid] = str(exc)
    armed.took_s = time.monotonic() - t0
    return armed


def resume(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def arm(pid: int) -> int:
    """The userfaultfd of stopped process `pid`, its anonymous private mappings registered and
    their present pages write-protected. TrackError saying why not."""
    maps = _read_maps(pid)
    fd = _take_userfaultfd(pid, maps)
    try:
        _api(fd)
        for start, end in armed_ranges(maps):
            _register(fd, start, end)
        _protect_present(pid)
    except OSError as exc:
        os.close(fd)
        raise TrackError(exc.errno or errno.EIO, f"arming {pid}: {exc}") from None
    return fd


def armed_ranges(maps: str) -> list[tuple[int, int]]:
    """The ranges of /proc/<pid>/maps text to arm: private, accessible, not the kernel's
    special mappings; neighbours joined (one registration spans them). A file's mapping that
    cannot be written is armed only when it is a RELRO: directly followed by a writable private
    mapping of the same file (the loader made that part of the data segment read-only after
    relocating it, so its pages are the process's own).

    The kernel maps one page per read fault in a write-protect range instead of 16
    (fault-around), so a library's text and read-only data armed would fault in page by page
    after the restore (a GNOME desktop's fork of 16 took 7.4 s instead of 5.1). A RELRO has
    nothing left to fault in; left unarmed, its pages (LibreOffice's vtables: ~20 MiB) would
    be dumped again at every save. Telling one from the maps alone costs nothing; a guess
    wrong either way costs bytes or faults, never correctness."""
    rows = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        name = parts[5].strip() if len(parts) > 5 else ""
        rows.append((lo, hi, parts[1], (parts[3], parts[4]), name))
    out: list[tuple[int, int]] = []
    for (lo, hi, perms, file_id, name), nxt in zip(rows, [*rows[1:], None], strict=True):
        if perms[3] != "p" or name in _SPECIAL or perms[:3] == "---":
            continue
        if perms[1] != "w" and name and not name.startswith("["):
            after_lo, _, after_perms, after_file, _ = nxt or (None, None, "----", None, None)
            writable_data = after_perms[1] == "w" and after_perms[3] == "p"
            if not (after_lo == hi and writable_data and after_file == file_id):  # a RELRO
                continue  # a file's text or read-only data: nothing of its own to track
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _read_maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def _ptrace(request: int, pid: int, addr: int = 0, data: int = 0) -> None:
    if _libc.ptrace(request, pid, ctypes.c_void_p(addr), ctypes.c_void_p(data)) == -1:
        err = ctypes.get_errno()
        raise TrackError(err, f"ptrace({request:#x}) on {pid}: {os.strerror(err)}")


def _take_userfaultfd(pid: int, maps: str) -> int:
    """userfaultfd() run in `pid`, the fd copied into the daemon and closed in `pid`. A signal
    pending in it is held back while its syscalls run and sent again after."""
    held: list[int] = []
    _ptrace(_PTRACE_SEIZE, pid, 0, _PTRACE_O_SUSPEND_SECCOMP)
    try:
        _ptrace(_PTRACE_INTERRUPT, pid)
        _wait_stop(pid)
        saved = _Regs()
        _ptrace(_PTRACE_GETREGS, pid, 0, ctypes.addressof(saved))
        at = _syscall_instruction(pid, maps)
        try:
            flags = os.O_CLOEXEC | os.O_NONBLOCK | _UFFD_USER_MODE_ONLY
            theirs = _inject(pid, at, saved, held, _NR_USERFAULTFD, flags)
            if theirs < 0:
                raise TrackError(-theirs, f"userfaultfd() in {pid}: {os.strerror(-theirs)}")
            try:
                mine = _getfd(pid, theirs)
            finally:
                _inject(pid, at, saved, held, _NR_CLOSE, theirs)
        finally:
            _ptrace(_PTRACE_SETREGS, pid, 0, ctypes.addressof(saved))
    finally:
        with contextlib.suppress(OSError):
            _ptrace(_PTRACE_DETACH, pid)
        for sig in dict.fromkeys(held):  # pending again, delivered once the tree resumes
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
    return mine


def _wait_stop(pid: int) -> int:
    _, status = os.waitpid(pid, _WALL)
    if not os.WIFSTOPPED(status):
        raise TrackError(errno.ESRCH, f"{pid} ended while being armed (status {status:#x})")
    return status


def _inject(pid: int, at: int, saved: _Regs, held: list[int], nr: int, *args: int) -> int:
    """Syscall `nr` run in stopped `pid` by single-stepping its `syscall` instruction at `at`;
    its return value (negative errno). A signal that stops it first is added to `held` and
    not delivered."""
    regs = _Regs.from_buffer_copy(saved)
    regs.rax, regs.orig_rax, regs.rip = nr, (1 << 64) - 1, at  # orig_rax -1: no restart
    for name, value in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args, strict=False):
        setattr(regs, name, value)
    _ptrace(_PTRACE_SETREGS, pid, 0, ctypes.addressof(regs))
    for _ in range(16):  # a group-stopped task reports its stop again before it steps
        _ptrace(_PTRACE_SINGLESTEP, pid)
        status = _wait_stop(pid)
        if status >> 16:
            continue
        if os.WSTOPSIG(status) == signal.SIGTRAP:
            break
        held.append(os.WSTOPSIG(status))  # a pending signal's delivery stop: hold it back
    else:
        raise TrackError(errno.EAGAIN, f"{pid} did not step")
    out = _Regs()
    _ptrace(_PTRACE_GETREGS, pid, 0, ctypes.addressof(out))
    if out.rip != at + 2:
        raise TrackError(errno.EIO, f"{pid} stepped to {out.rip:#x}, not past {at:#x}")
    rax = int(out.rax)
    return rax - (1 << 64) if rax >= 1 << 63 else rax


def _syscall_instruction(pid: int, maps: str) -> int:
    """The address of a `syscall` instruction in `pid`'s vDSO (every x86-64 vDSO has its
    fallbacks), so nothing of the process's own memory is written. The kernel's one vDSO is
    searched once; a restored tree may have it anywhere, so the offset is checked each time."""
    for line in maps.splitlines():
        if line.rstrip().endswith("[vdso]"):
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            with open(f"/proc/{pid}/mem", "rb") as mem:
                known = _VDSO_SYSCALL.get(hi - lo)
                if known is not None:
                    mem.seek(lo + known)
                    if mem.read(2) == b"\x0f\x05":
                        return lo + known
                mem.seek(lo)
                at = mem.read(hi - lo).find(b"\x0f\x05")
            if at >= 0:
                _VDSO_SYSCALL[hi - lo] = at
                return lo + at
    raise TrackError(errno.ENOENT, f"{pid} has no vDSO with a syscall instruction")


_VDSO_SYSCALL: dict[int, int] = {}  # vDSO size -> offset of a syscall instruction in it


def _getfd(pid: int, theirs: int) -> int:
    pidfd = _libc.syscall(_NR_PIDFD_OPEN, pid, 0)
    if pidfd < 0:
        raise TrackError(ctypes.get_errno(), f"pidfd_open({pid})")
    try:
        mine = int(_libc.syscall(_NR_PIDFD_GETFD, pidfd, theirs, 0))
        if mine < 0:
            raise TrackError(ctypes.get_errno(), f"pidfd_getfd({pid}, {theirs})")
        return mine
    finally:
        os.close(pidfd)


def _api(fd: int) -> None:
    features = _UFFD_FEATURE_WP_ASYNC | _UFFD_FEATURE_WP_UNPOPULATED
    fcntl.ioctl(fd, _UFFDIO_API, bytearray(struct.pack("QQQ", _UFFD_API, features, 0)))


def _register(fd: int, start: int, end: int) -> None:
    mode = _UFFDIO_REGISTER_MODE_WP
    fcntl.ioctl(fd, _UFFDIO_REGISTER, bytearray(struct.pack("QQQQ", start, end - start, mode, 0)))


@dataclass(frozen=True)
class Pages:
    """A process's present private pages by what a tracked dump does with them."""

    unwritten: int  # armed and not written since: the parent's
    written: int  # armed and written since, or not armed: dumped


def page_counts(pid: int) -> Pages:
    """What a tracked dump of `pid` would refer to its parent and what it would write (the
    same categories drums' CRIU reads; file-backed and zero pages it skips are left out)."""
    unwritten = written = 0
    for start, end, cat in _scan(pid, 0, _NOT_ANON, _PAGE_IS_PRESENT):
        pages = (end - start) // 4096
        if cat & _PAGE_IS_WPALLOWED and not cat & _PAGE_IS_WRITTEN:
            unwritten += pages
        else:
            written += pages
    return Pages(unwritten, written)


def _protect_present(pid: int) -> None:
    """Write-protect every present page of the armed ranges (PAGEMAP_SCAN skips the rest).
    Only present pages: protecting an empty one would leave a marker a later read turns into
    a page the parent never held."""
    _scan(pid, _PM_SCAN_WP_MATCHING, 0, _PAGE_IS_PRESENT, mask=_PAGE_IS_PRESENT)


def _scan(
    pid: int, flags: int, inverted: int, anyof: int, mask: int = 0
) -> list[tuple[int, int, int]]:
    """PAGEMAP_SCAN of `pid`'s whole address space: (start, end, categories) regions, in
    address order. A call ends the walk unless it filled the vector (6.18 can report a
    `walk_end` short of regions it did return, so that alone does not say it stopped early)."""
    out: list[tuple[int, int, int]] = []
    vec = (ctypes.c_ulonglong * (3 * _VEC_LEN))()
    fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY)
    try:
        start = 0
        while start < _TASK_SIZE:
            args = bytearray(
                struct.pack(
                    "12Q",
                    96,  # sizeof(struct pm_scan_arg)
                    flags,
                    start,
                    _TASK_SIZE,
                    0,  # walk_end (out)
                    ctypes.addressof(vec),
                    _VEC_LEN,
                    0,  # max_pages
                    inverted,  # category_inverted
                    mask | inverted,  # category_mask
                    anyof,  # category_anyof_mask
                    _RETURNED,  # return_mask
                )
            )
            n = fcntl.ioctl(fd, _PAGEMAP_SCAN, args)
            for i in range(n):
                region = (vec[3 * i], vec[3 * i + 1], vec[3 * i + 2])
                if not out or region[0] >= out[-1][1]:
                    out.append(region)
            if n < _VEC_LEN:
                break
            start = max(struct.unpack_from("12Q", args)[4], out[-1][1])
    finally:
        os.close(fd)
    return out
