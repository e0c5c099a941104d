"""The process events connector: parsing of captured and crafted datagrams (no privileges), and
the live socket (root or not, kernel 6.6+ lets any user listen; never from another netns)."""

from __future__ import annotations

import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from drumsd.linux import proc_events as pe
from harness import poll

# Datagrams captured on this VM (kernel 6.18, x86_64) for `sh -c 'kill -SEGV $$'` (pid 3584,
# parent 3582): its fork, its exec, and its exit by SIGSEGV.
CAPTURED_FORK = bytes.fromhex(
    "4c00000003000000f3aa0000000000000100000001000000f3aa00000000000028000000010000000100"
    "00000c8c7cf7b8010000fe0d0000fe0d0000000e0000000e00000000000000000000"
)
CAPTURED_EXEC = bytes.fromhex(
    "4c00000003000000f4aa0000000000000100000001000000f4aa00000000000028000000020000000100"
    "00008a217ff7b8010000000e0000000e000000000000000000000000000000000000"
)
CAPTURED_EXIT_SEGV = bytes.fromhex(
    "4c00000003000000f6aa0000000000000100000001000000f6aa00000000000028000000000000800100"
    "0000ff2188f7b8010000000e0000000e00000b00000011000000fe0d0000fe0d0000"
)


def craft(what: int, body: bytes, *, idx: int = 1, val: int = 1, ack: int = 0) -> bytes:
    """A datagram laid out by hand from the uapi headers (not through the module's structs)."""
    event = struct.pack("<IIQ", what, 0, 123_456_789) + body.ljust(24, b"\0")
    cn = struct.pack("<IIIIHH", idx, val, 7, ack, len(event), 0) + event
    return struct.pack("<IHHII", 16 + len(cn), 3, 0, 7, 0) + cn


def one(data: bytes) -> pe.Event | pe.Overrun:
    events = list(pe.parse_datagram(data))
    assert len(events) == 1, events
    return events[0]


def test_captured_fork_exec_exit() -> None:
    assert one(CAPTURED_FORK) == pe.Fork(3582, 3582, 3584, 3584)
    assert one(CAPTURED_EXEC) == pe.Exec(3584, 3584)
    ev = one(CAPTURED_EXIT_SEGV)
    assert isinstance(ev, pe.Exit)
    assert (ev.pid, ev.tgid, ev.parent_pid, ev.exit_code, ev.exit_signal) == (
        3584,
        3584,
        3582,
        11,
        17,
    )
    assert ev.signal == signal.SIGSEGV and ev.is_crash and ev.is_leader
    assert not ev.core_dumped and ev.status is None
    assert ev.timestamp_ns == 0x1B8F78821FF


@pytest.mark.parametrize(
    ("exit_code", "signo", "core", "status", "crash"),
    [
        (0, 0, False, 0, False),
        (3 << 8, 0, False, 3, False),
        (signal.SIGSEGV | 0x80, signal.SIGSEGV, True, None, True),
        (signal.SIGABRT, signal.SIGABRT, False, None, True),
        (signal.SIGBUS, signal.SIGBUS, False, None, True),
        (signal.SIGFPE | 0x80, signal.SIGFPE, True, None, True),
        (signal.SIGILL, signal.SIGILL, False, None, True),
        (signal.SIGSYS, signal.SIGSYS, False, None, True),
        (signal.SIGTRAP, signal.SIGTRAP, False, None, True),
        (signal.SIGKILL, signal.SIGKILL, False, None, False),
        (signal.SIGTERM, signal.SIGTERM, False, None, False),
        (signal.SIGINT, signal.SIGINT, False, None, False),
    ],
)
def test_exit_code_decoding(exit_code: int, signo: int, core: bool, status, crash: bool) -> None:
    ev = one(craft(pe.PROC_EVENT_EXIT, struct.pack("<iiIIii", 50, 50, exit_code, 17, 1, 1)))
    assert isinstance(ev, pe.Exit)
    assert (ev.signal, ev.core_dumped, ev.status, ev.is_crash) == (signo, core, status, crash)


def test_thread_exit_has_exit_signal_minus_one() -> None:
    body = struct.pack("<iiIIii", 51, 50, signal.SIGSEGV, 0xFFFFFFFF, 0, 0)
    ev = one(craft(pe.PROC_EVENT_EXIT, body))
    assert isinstance(ev, pe.Exit)
    assert ev.exit_signal == -1 and not ev.is_leader and ev.is_crash


def test_fork_of_a_thread_and_comm_and_ack() -> None:
    ev = one(craft(pe.PROC_EVENT_FORK, struct.pack("<iiii", 10, 10, 11, 10)))
    assert isinstance(ev, pe.Fork) and ev.is_thread
    ev = one(craft(pe.PROC_EVENT_COMM, struct.pack("<ii16s", 10, 10, b"soffice.bin")))
    assert ev == pe.Comm(10, 10, "soffice.bin")
    full = one(craft(pe.PROC_EVENT_COMM, struct.pack("<ii16s", 10, 10, b"x" * 16)))
    assert isinstance(full, pe.Comm) and full.comm == "x" * 16
    assert one(craft(pe.PROC_EVENT_NONE, struct.pack("<I", 1), ack=5)) == pe.Ack(err=1, ack=5)
    assert one(craft(pe.PROC_EVENT_UID, b"")) == pe.Other(pe.PROC_EVENT_UID)


def test_other_connectors_truncation_and_overrun() -> None:
    assert list(pe.parse_datagram(craft(pe.PROC_EVENT_EXEC, b"", idx=9))) == []
    assert list(pe.parse_datagram(CAPTURED_EXEC[:40])) == []  # cut inside the message
    assert list(pe.parse_datagram(b"")) == []
    overrun = struct.pack("<IHHII", 16, pe.NLMSG_OVERRUN, 0, 0, 0)
    assert list(pe.parse_datagram(overrun)) == [pe.Overrun()]


def test_several_messages_in_one_datagram() -> None:
    data = CAPTURED_FORK + CAPTURED_EXEC + CAPTURED_EXIT_SEGV
    kinds = [type(e) for e in pe.parse_datagram(data)]
    assert kinds == [pe.Fork, pe.Exec, pe.Exit]


def test_subscribe_message_layout() -> None:
    msg = pe.subscribe_message(pe.PROC_CN_MCAST_LISTEN, None)
    nl_len, nl_type = struct.unpack_from("<IH", msg)
    assert (nl_len, nl_type, len(msg)) == (16 + 20 + 4, pe.NLMSG_DONE, 40)
    idx, val, _seq, _ack, cn_len = struct.unpack_from("<IIIIH", msg, 16)
    assert (idx, val, cn_len) == (pe.CN_IDX_PROC, pe.CN_VAL_PROC, 4)
    assert struct.unpack_from("<I", msg, 36) == (pe.PROC_CN_MCAST_LISTEN,)
    filt = pe.subscribe_message(pe.PROC_CN_MCAST_LISTEN, pe.SUBSCRIBED_EVENTS)
    assert len(filt) == 44 and struct.unpack_from("<II", filt, 36) == (1, pe.SUBSCRIBED_EVENTS)


def test_signal_names() -> None:
    assert pe.signal_name(11) == "SIGSEGV"
    assert pe.signal_name(200) == "SIG200"


# -- live --------------------------------------------------------------------------------------


def _kernel_at_least(major: int, minor: int) -> bool:
    release = os.uname().release.split("-")[0].split(".")
    return (int(release[0]), int(release[1])) >= (major, minor)


def _collect(sock: pe.ProcEventsSocket, want, timeout_s: float = 5.0) -> list:
    """Events until `want(events)` holds; fails at the deadline."""
    seen: list = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen.extend(sock.read_ready())
        if want(seen):
            return seen
        time.sleep(0.005)
    raise AssertionError(f"no matching event in {timeout_s} s; saw {len(seen)} events")


def test_live_socket_sees_fork_exec_and_crash_exit() -> None:
    sock = pe.ProcEventsSocket.open(events=pe.QUIESCE_EVENTS)
    try:
        if _kernel_at_least(6, 6):
            assert sock.filtered, "kernel 6.6+ filters; drumsd should use it"
        child = subprocess.Popen(["sh", "-c", "kill -SEGV $$"])
        assert child.wait() == -signal.SIGSEGV

        def exited(events: list) -> bool:
            return any(isinstance(e, pe.Exit) and e.tgid == child.pid for e in events)

        events = _collect(sock, exited)
        mine = [
            e for e in events if getattr(e, "tgid", getattr(e, "child_tgid", None)) == child.pid
        ]
        assert [type(e) for e in mine] == [pe.Fork, pe.Exec, pe.Exit]
        assert mine[0].parent_tgid == os.getpid()
        assert mine[2].signal == signal.SIGSEGV and mine[2].is_crash
    finally:
        sock.close()


def test_live_filter_drops_zero_exits() -> None:
    if not _kernel_at_least(6, 6):
        pytest.skip("kernel-side filtering needs Linux 6.6")
    sock = pe.ProcEventsSocket.open()
    try:
        ok = subprocess.Popen(["true"])
        ok.wait()
        bad = subprocess.Popen(["false"])
        bad.wait()
        events = _collect(
            sock, lambda evs: any(isinstance(e, pe.Exit) and e.tgid == bad.pid for e in evs)
        )
        # `true` exited 0 before `false` exited 1, so its exit would have come first; no exec
        # of any process reaches the crash watch (issue 39, D10), its fork does.
        assert not any(isinstance(e, pe.Exit) and e.tgid == ok.pid for e in events)
        assert any(isinstance(e, pe.Fork) and e.child_tgid == ok.pid for e in events)
        assert not any(isinstance(e, (pe.Exec, pe.Comm)) for e in events), events[:5]
    finally:
        sock.close()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root")
def test_open_from_another_network_namespace_says_why() -> None:
    code = (
        "from drumsd.linux import proc_events as pe\n"
        "try:\n    pe.ProcEventsSocket.open()\n"
        "except pe.ProcEventsError as e:\n    print('REFUSED', e)\n"
        "else:\n    print('OPENED')\n"
    )
    src = str(Path(pe.__file__).parents[2])
    out = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.stdout.startswith("REFUSED"), out
    assert "network namespace" in out.stdout and "crash_watch = false" in out.stdout


def test_tree_moves_counts_the_trees_processes_not_its_threads_or_strangers() -> None:
    from drumsd.linux.proc_events import Exec, Exit, Fork, Overrun, tree_moves

    tree = {10, 11}
    events = [
        Fork(parent_pid=11, parent_tgid=11, child_pid=12, child_tgid=11),  # a thread: no
        Fork(parent_pid=99, parent_tgid=99, child_pid=100, child_tgid=100),  # a stranger: no
        Fork(parent_pid=10, parent_tgid=10, child_pid=20, child_tgid=20),  # the tree forks
        Exec(pid=20, tgid=20),  # the new child execs: it joined the tree
        Exit(pid=21, tgid=20, exit_code=0, exit_signal=-1, parent_pid=10, parent_tgid=10),
        Exit(pid=20, tgid=20, exit_code=0, exit_signal=17, parent_pid=10, parent_tgid=10),
        Exit(pid=100, tgid=100, exit_code=0, exit_signal=17, parent_pid=99, parent_tgid=99),
    ]
    assert tree_moves(events, tree) == ["10 forked 20", "20 exec'd", "20 exited"]
    assert tree_moves(events[:2], tree) == []  # threads and strangers: still quiet
    assert tree_moves([Overrun()], tree) == ["process events overran (some were lost)"]
    assert tree == {10, 11}  # the caller's set is not changed
    # named by a sample of the tree: a forked child is its parent's name until it execs
    assert tree_moves(events, tree, {10: "sh", 11: "bash"}) == [
        "sh(10) forked 20",
        "sh(20) exec'd",
        "20 exited",
    ]


def test_a_quiesce_socket_sees_a_short_lived_child_that_exits_0() -> None:
    from drumsd.linux.proc_events import QUIESCE_EVENTS, ProcEventsSocket, tree_moves

    if os.geteuid() != 0:
        pytest.skip("process events need root here")
    sock = ProcEventsSocket.open(events=QUIESCE_EVENTS)
    events: list = []

    def fork_and_exit() -> list[str] | None:
        events.extend(sock.read_ready())  # the kernel's datagrams arrive on their own time
        moves = tree_moves(events, {os.getpid()})
        seen = {w for m in moves for w in ("forked", "exited") if w in m}
        return moves if seen == {"forked", "exited"} else None

    try:
        subprocess.run(["true"], check=True)  # lives for a moment and exits 0
        poll("the child's fork and exit events", fork_and_exit, 5, every_s=0.01)
    finally:
        sock.close()
