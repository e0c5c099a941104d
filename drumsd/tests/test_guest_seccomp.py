"""The slot's seccomp filter: the generated program (run through a small classic-BPF interpreter)
and, in a forked child, the installed lock."""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import subprocess
import sys

import pytest
from drumsd.guest import seccomp as S

EPERM = S.RET_ERRNO | errno.EPERM


def run_bpf(prog: list[S.Insn], nr: int, args: tuple[int, ...] = (), arch: int = 0) -> int:
    """Evaluate `prog` on a seccomp_data of (nr, arch, ip 0, args) like the kernel would."""
    arch = arch or S.AUDIT_ARCH_X86_64
    full = (list(args) + [0] * 6)[:6]
    data = struct.pack("<iIQ6Q", nr, arch, 0, *full)
    acc, pc = 0, 0
    for _ in range(10_000):
        code, jt, jf, k = prog[pc]
        pc += 1
        if code == S.LD_W_ABS:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == S.AND_K:
            acc &= k
        elif code == S.RET_K:
            return k
        elif code in (S.JEQ_K, S.JGE_K, S.JSET_K):
            hit = {S.JEQ_K: acc == k, S.JGE_K: acc >= k, S.JSET_K: bool(acc & k)}[code]
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unknown opcode {code:#x}")
    raise AssertionError("no return")


PROG = S.filter_program()


def test_program_fits_and_packs() -> None:
    assert len(PROG) < 4096
    assert all(0 <= jt < 256 and 0 <= jf < 256 for _, jt, jf, _ in PROG)
    assert len(S.pack_program(PROG)) == 8 * len(PROG)


@pytest.mark.parametrize("name", sorted(S.DENIED))
def test_denied_syscalls_get_eperm(name: str) -> None:
    assert run_bpf(PROG, S.DENIED[name]) == EPERM


@pytest.mark.parametrize("nr", [0, 1, 2, 39, 57, 59, 105, 157, 231, 257])
def test_ordinary_syscalls_are_allowed(nr: int) -> None:
    assert run_bpf(PROG, nr) == S.RET_ALLOW


def test_other_architectures_and_x32_are_killed() -> None:
    assert run_bpf(PROG, 0, arch=0x40000003) == S.RET_KILL_PROCESS  # i386
    assert run_bpf(PROG, S.X32_SYSCALL_BIT | 1) == S.RET_KILL_PROCESS


def test_clone_with_a_namespace_flag_is_denied_plain_clone_allowed() -> None:
    thread = 0x3D0F00  # glibc's pthread_create flags
    assert run_bpf(PROG, S.NR_CLONE, (thread,)) == S.RET_ALLOW
    assert run_bpf(PROG, S.NR_CLONE, (0x01200011,)) == S.RET_ALLOW  # fork()
    for flag in (0x00020000, 0x10000000, 0x20000000, 0x40000000):
        assert run_bpf(PROG, S.NR_CLONE, (0x11 | flag,)) == EPERM
    assert run_bpf(PROG, S.NR_CLONE3) == S.RET_ERRNO | errno.ENOSYS


def test_mknod_of_devices_is_denied_fifos_and_files_allowed() -> None:
    for nr, i in ((S.NR_MKNOD, 1), (S.NR_MKNODAT, 2)):
        for mode, want in (
            (S.S_IFCHR | 0o666, EPERM),
            (S.S_IFBLK | 0o600, EPERM),
            (0o010644, S.RET_ALLOW),  # fifo
            (0o100644, S.RET_ALLOW),  # regular file
        ):
            args = [0, 0, 0]
            args[i] = mode
            assert run_bpf(PROG, nr, tuple(args)) == want, (nr, oct(mode))


def test_terminal_injection_ioctls_denied_others_allowed() -> None:
    assert run_bpf(PROG, S.NR_IOCTL, (0, S.TIOCSTI)) == EPERM
    assert run_bpf(PROG, S.NR_IOCTL, (0, S.TIOCLINUX)) == EPERM
    assert run_bpf(PROG, S.NR_IOCTL, (0, 0x5401)) == S.RET_ALLOW  # TCGETS


def test_personality_cannot_disable_aslr() -> None:
    assert run_bpf(PROG, S.NR_PERSONALITY, (0xFFFFFFFF,)) == S.RET_ALLOW
    assert run_bpf(PROG, S.NR_PERSONALITY, (0,)) == S.RET_ALLOW
    assert run_bpf(PROG, S.NR_PERSONALITY, (S.ADDR_NO_RANDOMIZE,)) == EPERM


_CHILD = """
import ctypes, os, sys
from drumsd.guest import seccomp
seccomp.Lock().install_filter()
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.unshare(0x00020000)
print("unshare", rc, ctypes.get_errno())
print("clone3", libc.syscall(435, 0, 0), ctypes.get_errno())
pid = os.fork()
if pid == 0:
    os._exit(7)
print("fork", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
print("getppid", os.getppid() > 0)
status = open("/proc/self/status").read()
print("nnp", "NoNewPrivs:\\t1" in status, "filter", "Seccomp:\\t2" in status)
"""


def test_installed_filter_denies_and_allows_in_a_child() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=30, check=True
    ).stdout.split("\n")
    assert out[0] == f"unshare -1 {errno.EPERM}"
    assert out[1] == f"clone3 -1 {errno.ENOSYS}"
    assert out[2] == "fork 7"
    assert out[3] == "getppid True"
    assert out[4] == "nnp True filter True"


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping capabilities needs root")
def test_lock_self_keeps_only_init_caps() -> None:
    code = (
        "from drumsd.guest import seccomp; seccomp.Lock().lock_self(); "
        "print(open('/proc/self/status').read())"
    )
    status = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    keep = sum(1 << c for c in S.INIT_KEEPS)
    assert int(fields["CapBnd"], 16) == 0
    assert int(fields["CapEff"], 16) == keep
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"


@pytest.mark.skipif(os.geteuid() != 0, reason="changing uid needs root")
def test_lock_child_becomes_the_user_with_nothing() -> None:
    code = (
        "from drumsd.guest import seccomp; seccomp.Lock().lock_child(1000, 1000); "
        "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
        "print(os.getresuid(), libc.setns(0, 0), ctypes.get_errno()); "
        "print(open('/proc/self/status').read())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    assert out.startswith(f"(1000, 1000, 1000) -1 {errno.EPERM}")
    assert "CapBnd:\t0000000000000000" in out
    assert "CapEff:\t0000000000000000" in out


def test_ctypes_structs_match_the_kernel_abi() -> None:
    assert ctypes.sizeof(S._SockFprog) == 16
    assert ctypes.sizeof(S._CapData) == 12
