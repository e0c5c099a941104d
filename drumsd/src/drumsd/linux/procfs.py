"""Reading /proc: process identity (pid + starttime), tree activity for quiescence, namespaces."""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

NAMESPACES = ("pid", "mnt", "net", "ipc", "uts", "user", "cgroup")


@dataclass(frozen=True)
class ProcStat:
    pid: int
    comm: str
    state: str
    ppid: int
    ticks: int  # utime + stime
    starttime: int
    child_ticks: int = 0  # cutime + cstime: the CPU of the children it waited for (and theirs)


def parse_stat(text: str) -> ProcStat:
    """Parse /proc/<pid>/stat; comm may hold spaces and parentheses, so split at the last ')'."""
    head, _, rest = text.rpartition(")")
    pid_s, _, comm = head.partition(" (")
    f = rest.split()
    # f[0] is field 3 (state); utime/stime are fields 14/15, cutime/cstime 16/17, starttime 22.
    ticks, child_ticks = int(f[11]) + int(f[12]), int(f[13]) + int(f[14])
    return ProcStat(int(pid_s), comm, f[0], int(f[1]), ticks, int(f[19]), child_ticks)


def read_stat(pid: int) -> ProcStat | None:
    try:
        return parse_stat(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None


def starttime(pid: int) -> int | None:
    st = read_stat(pid)
    return st.starttime if st else None


def is_same_process(pid: int, start: int) -> bool:
    st = read_stat(pid)
    return st is not None and st.starttime == start and st.state not in ("Z", "X")


def reap(pid: int, timeout_s: float, pidfd: int = -1) -> bool:
    """Wait up to `timeout_s` for `pid` to exit (pidfd readiness, never an unbounded waitpid) and
    reap it if it is our child. True when it is gone. With `pidfd` (the caller's, of that very
    process) the number is not looked up again: once another reaper took the process, pids
    recycle fast (pid_max 32768 here), and a lookup by number waited on, and reaped, whatever
    process had it next."""
    if pidfd >= 0:
        return _reap_pidfd(pidfd, timeout_s)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return _reap_pidfd(fd, timeout_s)
    finally:
        os.close(fd)


def _reap_pidfd(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    exited = bool(poller.poll(max(0, int(timeout_s * 1000))))
    if exited:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitid(os.P_PIDFD, fd, os.WEXITED | os.WNOHANG)
    return exited


def activity(pids: Iterable[int]) -> tuple[tuple[int, str, int], ...]:
    """A signature of what the tree is doing: unchanged over a window means quiescent."""
    sig = []
    for pid in sorted(pids):
        st = read_stat(pid)
        if st is not None:
            sig.append((pid, st.state, st.ticks))
    return tuple(sig)


# States that make a dump inconsistent or impossible: D (uninterruptible, mid-I/O) and Z (exited,
# not reaped: CRIU cannot dump a zombie that still has threads).
UNSETTLED_STATES = {"D": "in uninterruptible sleep (D)", "Z": "a zombie (Z)"}


def tree_shape(pids: Iterable[int]) -> dict[tuple[int, int], tuple[str, str]]:
    """What a capture needs to hold still: which processes exist (pid + starttime, so a reused
    pid is a new process) and which of them are D or Z. CPU use is not part of it: CRIU freezes
    the tree, so an app that polls can be dumped; one that keeps forking cannot be dumped as a
    stable set of processes."""
    shape: dict[tuple[int, int], tuple[str, str]] = {}
    for pid in pids:
        st = read_stat(pid)
        if st is not None:
            shape[(pid, st.starttime)] = (st.comm, st.state if st.state in UNSETTLED_STATES else "")
    return shape


def moving(
    before: dict[tuple[int, int], tuple[str, str]], after: dict[tuple[int, int], tuple[str, str]]
) -> list[str]:
    """What changed between two tree shapes, for the not_quiescent message (pure)."""
    out = [f"{after[k][0]}({k[0]}) started" for k in sorted(after.keys() - before.keys())]
    out += [f"{before[k][0]}({k[0]}) exited" for k in sorted(before.keys() - after.keys())]
    out += [
        f"{comm}({key[0]}) is {UNSETTLED_STATES[state]}"
        for key, (comm, state) in sorted(after.items())
        if state
    ]
    return out


@dataclass(frozen=True)
class NsProcess:
    """A process as its pid namespace sees it: comm, and its threads (tid there -> starttime, so
    a tid reused by a new thread is a different thread)."""

    comm: str
    threads: dict[int, int]


def _ns_id(status: str) -> tuple[int, str] | None:
    """The last NSpid value (the id inside the innermost pid namespace) and Name of a status."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    nspid = fields.get("NSpid", "").split()
    return (int(nspid[-1]), fields.get("Name", "?").strip()) if nspid else None


def _read(path: str) -> bytes:
    # unbuffered, one read: /proc files are generated per read and fit in a page
    with open(path, "rb", buffering=0) as f:
        return f.read(8192)


def _ns_threads(pid: int) -> dict[int, int]:
    """Each thread of `pid` by its tid in the innermost pid namespace -> starttime. Two small
    reads per thread (status for NSpid, stat for the start time), parsed without building
    dicts: a Chromium desktop has ~100 threads and this runs twice around every dump."""
    threads: dict[int, int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return threads
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            status = _read(f"{base}/status")
            stat = _read(f"{base}/stat")
        except OSError:
            continue  # the thread ended between listing and reading: churn
        at = status.find(b"\nNSpid:")
        if at < 0:
            continue
        line = status[at + 7 : status.find(b"\n", at + 7)]
        fields = stat.rpartition(b")")[2].split()
        try:
            threads[int(line.split()[-1])] = int(fields[19])
        except (ValueError, IndexError):
            continue
    return threads


def in_pid_namespace(pids: Iterable[int], pidns: int) -> dict[int, NsProcess]:
    """The processes among `pids` that live in the pid namespace whose nsfs inode is `pidns`, by
    their pid inside it (the last NSpid value, as CRIU records them), with their threads."""
    out: dict[int, NsProcess] = {}
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}/ns/pid").st_ino != pidns:
                continue
            ident = _ns_id(Path(f"/proc/{pid}/status").read_text())
        except OSError:
            continue
        if ident is not None:
            out[ident[0]] = NsProcess(ident[1], _ns_threads(pid))
    return out


def namespaces(pid: int | str) -> dict[str, int]:
    out: dict[str, int] = {}
    for ns in NAMESPACES:
        try:
            out[ns] = os.stat(f"/proc/{pid}/ns/{ns}").st_ino
        except OSError:
            pass
    return out


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            text = Path(f"/proc/{pid}/task/{tid}/children").read_text()
            out += [int(x) for x in text.split()]
    except OSError:
        pass
    return out


def ns_pids(pid: int) -> list[int]:
    """NSpid of /proc/<pid>/status: the pid in each nested pid namespace, outermost first."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return [int(x) for x in line.split()[1:]]
    except OSError:
        pass
    return []


def find_ns_init(root: int) -> int | None:
    """The first descendant of `root` that is pid 1 of a nested pid namespace."""
    todo = [root]
    while todo:
        pid = todo.pop(0)
        nspids = ns_pids(pid)
        if len(nspids) > 1 and nspids[-1] == 1:
            return pid
        todo += children(pid)
    return None
