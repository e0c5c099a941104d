"""The slot's process lock: no_new_privs, a reduced capability bounding set and a seccomp filter.

desktop-init applies `lock_child` in every process it starts as the desktop user (before the
setuid, so it can still drop capabilities), and `lock_self` to itself once the session runs;
everything else in the slot descends from those and inherits the lock across fork and exec.
CRIU restores all three exactly, so a restored slot is locked too.

The filter is a deny list (EPERM) of what a desktop never needs: mounts, namespaces, ptrace,
kernel interfaces (modules, kexec, bpf, perf, keyrings, io_uring, userfaultfd), file handles,
device nodes, terminal injection. clone3 gets ENOSYS (its flags sit in memory a filter cannot
read), so glibc falls back to clone, whose flags the filter checks. Callers of another
architecture (or x32) are killed. setuid-family calls, capset and prctl stay allowed: CRIU
installs the filter before it restores credentials.

Runs inside the image's python3: stdlib and ctypes only. Building the program is pure
(`filter_program`); `install` is the one OS effect.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Iterable

# --- classic BPF opcodes (linux/filter.h)
LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
RET_K = 0x06  # BPF_RET | BPF_K

# --- seccomp (linux/seccomp.h)
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000
RET_ALLOW = 0x7FFF0000
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
OFF_NR = 0  # struct seccomp_data: int nr; u32 arch; u64 ip; u64 args[6]
OFF_ARCH = 4


def off_arg_low(i: int) -> int:
    """Offset of the low 32 bits of syscall argument i (little endian)."""
    return 16 + 8 * i


# x86_64 syscall numbers denied outright.
DENIED: dict[str, int] = {
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "chroot": 161,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
    "open_tree_attr": 467,
    "unshare": 272,
    "setns": 308,
    "ptrace": 101,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "pidfd_getfd": 438,
    "init_module": 175,
    "finit_module": 313,
    "delete_module": 176,
    "kexec_load": 246,
    "kexec_file_load": 320,
    "bpf": 321,
    "perf_event_open": 298,
    "keyctl": 250,
    "add_key": 248,
    "request_key": 249,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "userfaultfd": 323,
    "open_by_handle_at": 304,
    "name_to_handle_at": 303,
    "acct": 163,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "syslog": 103,
    "quotactl": 179,
    "quotactl_fd": 443,
    "lookup_dcookie": 212,
    "iopl": 172,
    "ioperm": 173,
}
NR_CLONE = 56
NR_CLONE3 = 435
NR_MKNOD = 133
NR_MKNODAT = 259
NR_IOCTL = 16
NR_PERSONALITY = 135

# clone's namespace flags (CLONE_NEWTIME is 0x80, inside clone's exit-signal byte: clone3 only).
CLONE_NEW_MASK = (
    0x00020000  # NEWNS
    | 0x02000000  # NEWCGROUP
    | 0x04000000  # NEWUTS
    | 0x08000000  # NEWIPC
    | 0x10000000  # NEWUSER
    | 0x20000000  # NEWPID
    | 0x40000000  # NEWNET
)
S_IFMT = 0o170000
S_IFCHR = 0o020000
S_IFBLK = 0o060000
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
ADDR_NO_RANDOMIZE = 0x0040000
PERSONALITY_QUERY = 0xFFFFFFFF

Insn = tuple[int, int, int, int]  # (code, jt, jf, k)


def _ld(offset: int) -> Insn:
    return (LD_W_ABS, 0, 0, offset)


def _ret(value: int) -> Insn:
    return (RET_K, 0, 0, value)


def _block(nr: int, body: list[Insn]) -> list[Insn]:
    """`body` runs only for syscall `nr` (A holds nr) and must end in a return."""
    return [(JEQ_K, 0, len(body), nr), *body]


def filter_program(denied: Iterable[int] | None = None) -> list[Insn]:
    """The filter as (code, jt, jf, k) instructions; every jump is short and forward."""
    eperm = _ret(RET_ERRNO | errno.EPERM)
    prog: list[Insn] = [
        _ld(OFF_ARCH),
        (JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _ret(RET_KILL_PROCESS),
        _ld(OFF_NR),
        (JGE_K, 0, 1, X32_SYSCALL_BIT),
        _ret(RET_KILL_PROCESS),
    ]
    for nr in sorted(set(DENIED.values() if denied is None else denied)):
        prog += _block(nr, [eperm])
    prog += _block(NR_CLONE3, [_ret(RET_ERRNO | errno.ENOSYS)])
    prog += _block(
        NR_CLONE,
        [_ld(off_arg_low(0)), (JSET_K, 0, 1, CLONE_NEW_MASK), eperm, _ret(RET_ALLOW)],
    )
    for nr, arg in ((NR_MKNOD, 1), (NR_MKNODAT, 2)):
        prog += _block(
            nr,
            [
                _ld(off_arg_low(arg)),
                (AND_K, 0, 0, S_IFMT),
                (JEQ_K, 2, 0, S_IFCHR),
                (JEQ_K, 1, 0, S_IFBLK),
                _ret(RET_ALLOW),
                eperm,
            ],
        )
    prog += _block(
        NR_IOCTL,
        [
            _ld(off_arg_low(1)),
            (JEQ_K, 2, 0, TIOCSTI),
            (JEQ_K, 1, 0, TIOCLINUX),
            _ret(RET_ALLOW),
            eperm,
        ],
    )
    # personality(): querying is fine, turning ASLR off is not.
    prog += _block(
        NR_PERSONALITY,
        [
            _ld(off_arg_low(0)),
            (JEQ_K, 2, 0, PERSONALITY_QUERY),
            (JSET_K, 0, 1, ADDR_NO_RANDOMIZE),
            eperm,
            _ret(RET_ALLOW),
        ],
    )
    prog.append(_ret(RET_ALLOW))
    return prog


def pack_program(prog: list[Insn]) -> bytes:
    """struct sock_filter[]: u16 code, u8 jt, u8 jf, u32 k."""
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


# --- OS effects

PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
CAP_SETPCAP = 8
# What desktop-init keeps in its permitted and effective sets: restart the agent as the user
# (setuid/setgid; setpcap for the child's PR_CAPBSET_DROP calls) and stop the session (kill
# processes of another uid). Its bounding set is empty like everyone's: it never execs, so the
# bounding set only limits what its children could gain.
INIT_KEEPS = (CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SETPCAP)
# What the guest agent keeps: it runs as the slot's root (not the desktop user, who must not
# reach it: /proc/<pid>/mem, pidfd_getfd and signals are checked by uid) and starts its action
# worker and commands as the desktop user (setuid/setgid) and kills them on timeout (kill).
AGENT_KEEPS = (CAP_KILL, CAP_SETGID, CAP_SETUID)
PR_SET_DUMPABLE = 4
PR_GET_DUMPABLE = 3


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


def _prctl(option: int, arg: int = 0) -> int:
    rc = _libc.prctl(option, arg, 0, 0, 0)
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl({option}, {arg}): {os.strerror(err)}")
    return rc


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 40


class Lock:
    """The packed filter, built once (the parent builds it; forked children only install it)."""

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(pack_program(filter_program()))
        self._prog = _SockFprog(len(self._buf.raw) // 8, ctypes.addressof(self._buf))

    def drop_bounding(self, keep: Iterable[int] = ()) -> None:
        keep = set(keep)
        for cap in range(last_cap() + 1):
            if cap not in keep and _prctl(PR_CAPBSET_READ, cap) == 1:
                _prctl(PR_CAPBSET_DROP, cap)

    def install_filter(self) -> None:
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        rc = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(self._prog), 0, 0)
        if rc < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"installing the seccomp filter failed: {os.strerror(err)}")

    def lock_child(self, uid: int, gid: int) -> None:
        """In a forked child still running as root: empty bounding set, become uid/gid, lock.

        For subprocess's preexec_fn (desktop-init is single threaded, so that is safe)."""
        self.drop_bounding()
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        self.install_filter()

    def lock_self(self, keep: Iterable[int] = INIT_KEEPS) -> None:
        """Empty this root process's bounding set, reduce its permitted and effective sets to
        `keep` (nothing inheritable) and lock it.

        Also how the agent is locked (AGENT_KEEPS, in a fork of desktop-init that does not exec:
        a root execve under an empty bounding set keeps only the inheritable set, and CRIU cannot
        restore an inheritable set once it has emptied the bounding set)."""
        keep = tuple(keep)
        self.drop_bounding()
        mask = 0
        for cap in keep:
            mask |= 1 << cap
        header = _CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (_CapData * 2)()
        data[0].effective = data[0].permitted = mask & 0xFFFFFFFF
        data[1].effective = data[1].permitted = mask >> 32
        if _libc.capset(ctypes.byref(header), data) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"capset failed: {os.strerror(err)}")
        self.install_filter()


def dumpable() -> int:
    return _prctl(PR_GET_DUMPABLE)


def set_not_dumpable() -> bool:
    """PR_SET_DUMPABLE 0 unless already so; True if it had to be set (exec and a CRIU restore
    of the flag may leave it 1). Not dumpable: no /proc/<pid>/mem, environ or fd access by uid."""
    if _prctl(PR_GET_DUMPABLE) == 0:
        return False
    _prctl(PR_SET_DUMPABLE, 0)
    return True
