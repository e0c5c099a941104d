"""The kernel's process events connector (netlink NETLINK_CONNECTOR, CN_IDX_PROC): fork, exec,
comm and exit events of every process on the host, in global pids.

Parsing is pure (`parse_datagram` on captured bytes); `ProcEventsSocket` holds the OS effects:
open, bind, subscribe (with a kernel-side filter when the kernel has one, 6.6+), receive, close.
Layouts follow include/uapi/linux/{netlink,connector,cn_proc}.h on x86_64/arm64 (little endian is
not assumed: native byte order, as the kernel writes it).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import socket
import struct
import subprocess
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1

NLMSG_NOOP = 1
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLMSG_OVERRUN = 4

PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2

# enum proc_cn_event
PROC_EVENT_NONE = 0x00000000
PROC_EVENT_FORK = 0x00000001
PROC_EVENT_EXEC = 0x00000002
PROC_EVENT_UID = 0x00000004
PROC_EVENT_GID = 0x00000040
PROC_EVENT_SID = 0x00000080
PROC_EVENT_PTRACE = 0x00000100
PROC_EVENT_COMM = 0x00000200
PROC_EVENT_NONZERO_EXIT = 0x20000000
PROC_EVENT_COREDUMP = 0x40000000
PROC_EVENT_EXIT = 0x80000000

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
_EVENT_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns (aligned at 8: no padding here)
_TWO = struct.Struct("=ii")
_FORK = struct.Struct("=iiii")
_EXIT = struct.Struct("=iiIIii")  # pid, tgid, exit_code, exit_signal, parent_pid, parent_tgid
_COMM = struct.Struct("=ii16s")
_NLMSG_ALIGN = 4

# Signals that mean the program itself failed (the kernel or abort() killed it for a fault).
# SIGKILL and SIGTERM are not crashes: the daemon's own kills, resets and destroys send them.
# An OOM kill is a SIGKILL too; the no_oom_kill gate judges it from the cgroup's counter.
CRASH_SIGNALS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGABRT,
        signal.SIGSYS,
        signal.SIGTRAP,
    }
)

# What the crash watch subscribes to when the kernel can filter: forks (a child inherits its
# parent's slot: the one event that places every process exactly) and nonzero exits. Execs, comm
# changes and exit-0s of every host process no longer wake the daemon: with them a fork/exec
# storm in one slot cost it 0.11 core (issue 39, D10), each exec a /proc read in a thread.
SUBSCRIBED_EVENTS = PROC_EVENT_FORK | PROC_EVENT_NONZERO_EXIT


# What a quiescence wait subscribes to: every fork, exec and exit (exit 0 included: a short-lived
# process that starts and ends between two samples of the tree must still count as movement).
QUIESCE_EVENTS = PROC_EVENT_FORK | PROC_EVENT_EXEC | PROC_EVENT_EXIT


class ProcEventsError(RuntimeError):
    """The process events connector cannot be used; the message says why and what to do."""


@dataclass(frozen=True)
class Ack:
    """The kernel's answer to a (un)subscribe: err 0 means it took effect."""

    err: int
    ack: int


@dataclass(frozen=True)
class Fork:
    parent_pid: int
    parent_tgid: int
    child_pid: int
    child_tgid: int

    @property
    def is_thread(self) -> bool:
        """A new thread of an existing process (clone with CLONE_THREAD), not a new process."""
        return self.child_pid != self.child_tgid


@dataclass(frozen=True)
class Exec:
    pid: int
    tgid: int


@dataclass(frozen=True)
class Comm:
    pid: int
    tgid: int
    comm: str


@dataclass(frozen=True)
class Exit:
    """A task (thread) ended. `exit_code` is the wait status the task left: a signal number in
    the low 7 bits (0x80 set when it dumped core) when a signal killed it, else status << 8.
    `exit_signal` is what the parent is told (SIGCHLD; -1 for a thread that is not the leader)."""

    pid: int
    tgid: int
    exit_code: int
    exit_signal: int
    parent_pid: int
    parent_tgid: int
    timestamp_ns: int = 0  # CLOCK_MONOTONIC (ktime_get_ns) when the kernel sent it

    @property
    def is_leader(self) -> bool:
        return self.pid == self.tgid

    @property
    def signal(self) -> int:
        """The signal that killed the task, 0 when it exited on its own."""
        return self.exit_code & 0x7F

    @property
    def core_dumped(self) -> bool:
        return self.signal != 0 and bool(self.exit_code & 0x80)

    @property
    def status(self) -> int | None:
        """The exit status when the task exited on its own, else None."""
        return None if self.signal else (self.exit_code >> 8) & 0xFF

    @property
    def is_crash(self) -> bool:
        return self.signal in CRASH_SIGNALS


@dataclass(frozen=True)
class Other:
    """An event drumsd does not use (uid, gid, sid, ptrace, coredump) or does not know."""

    what: int


Event = Ack | Fork | Exec | Comm | Exit | Other


@dataclass(frozen=True)
class Overrun:
    """The kernel dropped messages (NLMSG_OVERRUN, or ENOBUFS on receive): state built from
    events may be stale and must be refreshed from another source."""


def signal_name(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"SIG{signo}"


def subscribe_message(op: int, event_type: int | None, seq: int = 0) -> bytes:
    """The datagram that (un)subscribes: nlmsghdr + cn_msg + the op. With `event_type` the op is
    a `struct proc_input` (op, event mask), which kernels since 6.6 use as a filter; older
    kernels ignore a payload of that size, so the caller must see the Ack or fall back."""
    payload = struct.pack("=I", op) if event_type is None else struct.pack("=II", op, event_type)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, seq, 0, len(payload), 0) + payload
    hdr = _NLMSGHDR.pack(_NLMSGHDR.size + len(cn), NLMSG_DONE, 0, seq, 0)
    return hdr + cn


def parse_event(data: bytes) -> Event:
    """One `struct proc_event` (what, cpu, timestamp, union) -> an event record."""
    if len(data) < _EVENT_HEAD.size:
        raise ValueError(f"proc_event of {len(data)} bytes is shorter than its header")
    what, _cpu, ts = _EVENT_HEAD.unpack_from(data, 0)
    body = _EVENT_HEAD.size
    if what == PROC_EVENT_NONE:
        (err,) = struct.unpack_from("=I", data, body)
        return Ack(err=err, ack=0)
    if what == PROC_EVENT_FORK:
        return Fork(*_FORK.unpack_from(data, body))
    if what == PROC_EVENT_EXEC:
        return Exec(*_TWO.unpack_from(data, body))
    if what == PROC_EVENT_EXIT:
        pid, tgid, code, sig, ppid, ptgid = _EXIT.unpack_from(data, body)
        # exit_signal is an int in the kernel (-1 for threads) but a __u32 in the uapi struct.
        sig = sig - (1 << 32) if sig >= 1 << 31 else sig
        return Exit(pid, tgid, code, sig, ppid, ptgid, ts)
    if what == PROC_EVENT_COMM:
        pid, tgid, raw = _COMM.unpack_from(data, body)
        return Comm(pid, tgid, raw.split(b"\0", 1)[0].decode("utf-8", "replace"))
    return Other(what=what)


def parse_datagram(data: bytes) -> Iterator[Event | Overrun]:
    """All events of one netlink datagram (normally one message, but the format allows more).
    Messages of other connectors and truncated ones are skipped."""
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        nl_len, nl_type, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if nl_len < _NLMSGHDR.size or off + nl_len > len(data):
            return
        if nl_type == NLMSG_OVERRUN:
            yield Overrun()
        elif nl_type == NLMSG_DONE and nl_len >= _NLMSGHDR.size + _CN_MSG.size:
            cn_off = off + _NLMSGHDR.size
            idx, val, _cseq, ack, cn_len, _cflags = _CN_MSG.unpack_from(data, cn_off)
            start = cn_off + _CN_MSG.size
            if idx == CN_IDX_PROC and val == CN_VAL_PROC and start + cn_len <= off + nl_len:
                event = parse_event(data[start : start + cn_len])
                yield Ack(event.err, ack) if isinstance(event, Ack) else event
        off += (nl_len + _NLMSG_ALIGN - 1) & ~(_NLMSG_ALIGN - 1)


class ProcEventsSocket:
    """A subscribed connector socket (non-blocking). Before Linux 6.6 subscribing needs root
    (CAP_NET_ADMIN in the initial user namespace); since 6.6 any user may listen (measured here
    on 6.18 as uid 65534). Always the host's network namespace: the connector exists only there
    (from another one the subscribe fails with ECONNREFUSED)."""

    RCVBUF = 8 * 1024 * 1024

    def __init__(self, sock: socket.socket, filtered: bool) -> None:
        self.sock = sock
        self.filtered = filtered

    @classmethod
    def open(cls, ack_timeout_s: float = 1.0, events: int = SUBSCRIBED_EVENTS) -> ProcEventsSocket:
        """Open, bind and subscribe (to `events` where the kernel filters; to all where it does
        not); raise ProcEventsError saying why when it cannot."""
        try:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError as exc:
            raise ProcEventsError(
                f"cannot open a netlink connector socket: {exc.strerror}; the kernel needs "
                "CONFIG_CONNECTOR and CONFIG_PROC_EVENTS (or set crash_watch = false)"
            ) from exc
        try:
            try:
                # Root may go past net.core.rmem_max; a burst of forks must not overflow it.
                sock.setsockopt(socket.SOL_SOCKET, 33, cls.RCVBUF)  # SO_RCVBUFFORCE
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, cls.RCVBUF)
            sock.bind((0, CN_IDX_PROC))
            # The filtered form first. A kernel that filters also filters out its own Ack (the
            # Ack is event 0, in no mask), and one before 6.6 ignores the form silently, so the
            # proof that it took is an event of a child we start (its nonzero exit: every mask
            # drumsd uses lets that through).
            sock.send(subscribe_message(PROC_CN_MCAST_LISTEN, events))
            filtered = _sees_own_exit(sock, ack_timeout_s)
            if not filtered:
                sock.send(subscribe_message(PROC_CN_MCAST_LISTEN, None))
                err = _await_ack(sock, ack_timeout_s)
                if err is None:
                    raise ProcEventsError(
                        "the kernel did not acknowledge PROC_CN_MCAST_LISTEN; is "
                        "CONFIG_PROC_EVENTS set? (or set crash_watch = false)"
                    )
                if err:
                    raise ProcEventsError(
                        f"the kernel refused PROC_CN_MCAST_LISTEN: {os.strerror(err)}; drumsd "
                        "must run as root in the host's user and network namespaces to watch "
                        "crashes (or set crash_watch = false)"
                    )
        except OSError as exc:
            sock.close()
            where = (
                "the connector exists only in the host's network namespace; "
                if exc.errno == errno.ECONNREFUSED
                else ""
            )
            raise ProcEventsError(
                f"cannot subscribe to process events: {exc.strerror}; {where}run drumsd as root "
                "in the host's network namespace (or set crash_watch = false)"
            ) from exc
        except BaseException:
            sock.close()
            raise
        sock.setblocking(False)
        return cls(sock, filtered)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_ready(self, max_datagrams: int = 4096) -> list[Event | Overrun]:
        """Everything the socket holds now (up to `max_datagrams`), without blocking."""
        out: list[Event | Overrun] = []
        for _ in range(max_datagrams):
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    out.append(Overrun())
                    continue
                raise
            out.extend(parse_datagram(data))
        return out

    def close(self) -> None:
        try:
            self.sock.setblocking(True)
            self.sock.send(subscribe_message(PROC_CN_MCAST_IGNORE, None))
        except OSError:
            pass  # the socket goes away anyway, and with it the subscription
        self.sock.close()


def _receive_until(
    sock: socket.socket, timeout_s: float, done: Callable[[Event | Overrun], bool]
) -> bool:
    """Receive (blocking, with a deadline) until `done` accepts an event; False on timeout.
    Events before that are dropped: nothing is tracked while subscribing."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        if not poller.poll(left * 1000):
            return False
        try:
            data = sock.recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                continue
            raise
        if any(done(event) for event in parse_datagram(data)):
            return True
    return False


def _await_ack(sock: socket.socket, timeout_s: float) -> int | None:
    """The err of the kernel's Ack to a subscribe, or None when none came in time."""
    acks: list[int] = []

    def is_ack(event: Event | Overrun) -> bool:
        if isinstance(event, Ack):
            acks.append(event.err)
        return bool(acks)

    _receive_until(sock, timeout_s, is_ack)
    return acks[0] if acks else None


def _sees_own_exit(sock: socket.socket, timeout_s: float) -> bool:
    """Start /bin/false and wait for its Exit event: proof that the subscription is live."""
    child = subprocess.Popen(["false"], stdin=subprocess.DEVNULL, close_fds=True)
    try:
        return _receive_until(
            sock, timeout_s, lambda e: isinstance(e, Exit) and e.tgid == child.pid
        )
    finally:
        child.wait()


def tree_moves(
    events: Iterable[Event | Overrun], pids: Iterable[int], names: Mapping[int, str] | None = None
) -> list[str]:
    """What the process tree of `pids` (host tgids) did, by kernel process events, in order: a
    process of the tree forked a new process (that child joins the tree, named as its parent
    until it execs), exec'd, or a process of the tree ended. `names` (tgid -> comm, from a sample
    of the tree) names the processes it knows, so the message says what kept moving. Threads
    starting or ending are not movement (thread pools churn, and CRIU freezes them); an overrun
    is, since events were lost."""
    tree = set(pids)
    known = dict(names or {})

    def who(tgid: int) -> str:
        return f"{known[tgid]}({tgid})" if tgid in known else str(tgid)

    moved: list[str] = []
    for ev in events:
        if isinstance(ev, Overrun):
            moved.append("process events overran (some were lost)")
        elif isinstance(ev, Fork) and not ev.is_thread and ev.parent_tgid in tree:
            tree.add(ev.child_tgid)
            if ev.parent_tgid in known:
                known[ev.child_tgid] = known[ev.parent_tgid]
            moved.append(f"{who(ev.parent_tgid)} forked {ev.child_tgid}")
        elif isinstance(ev, Exec) and ev.tgid in tree:
            moved.append(f"{who(ev.tgid)} exec'd")
            known.pop(ev.tgid, None)
        elif isinstance(ev, Exit) and ev.is_leader and ev.tgid in tree:
            moved.append(f"{who(ev.tgid)} exited")
    return moved
