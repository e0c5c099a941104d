"""Crash watch: the ledger's folding of events (crafted, with a fake /proc), and the live service
on real cgroups (root: v1 memory + pids groups under this process's own cgroup paths)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from drumsd.core.seams import CrashFacts
from drumsd.linux import proc_events as pe
from drumsd.linux.cgroups import parse_cgroup_mounts, parse_proc_cgroup
from drumsd.runtime.crash_watch import CrashLedger, CrashWatch, ProcReader, SlotCgroup, slot_cgroup
from harness import wait_for

MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
)


def proc_cgroup(pids_path: str) -> str:
    return f"8:pids:{pids_path}\n4:memory:/base{pids_path}\n0::/\n"


class FakeReader(ProcReader):
    def __init__(self) -> None:
        self.cgroups: dict[int, str] = {}
        self.comms: dict[int, str] = {}
        self.members: dict[str, list[int]] = {}
        self.alive: set[int] = set()

    def cgroup(self, pid: int) -> str | None:
        return self.cgroups.get(pid)

    def comm(self, pid: int) -> str | None:
        return self.comms.get(pid)

    def procs(self, path: str) -> list[int]:
        return list(self.members.get(path, []))

    def exists(self, pid: int) -> bool:
        return pid in self.alive


A = SlotCgroup("pids", "/drums/a", "/sys/fs/cgroup/pids/drums/a/cgroup.procs")
B = SlotCgroup("pids", "/drums/b", "/sys/fs/cgroup/pids/drums/b/cgroup.procs")


def ledger_with_slots() -> tuple[CrashLedger, FakeReader]:
    reader = FakeReader()
    reader.members[A.procs] = [100]
    reader.members[B.procs] = [200]
    reader.comms.update({100: "init-a", 200: "init-b"})
    ledger = CrashLedger(reader, clock=lambda: 1000.0)
    ledger.track("a", A)
    ledger.track("b", B)
    return ledger, reader


def exit_(pid: int, tgid: int, code: int) -> pe.Exit:
    return pe.Exit(pid, tgid, code, 17 if pid == tgid else -1, 1, 1)


def test_slot_cgroup_v1_and_v2() -> None:
    v1 = {
        "memory": "/sys/fs/cgroup/memory/base/drums/x",
        "pids": "/sys/fs/cgroup/pids/drums/x",
    }
    assert slot_cgroup(v1, MOUNTINFO) == SlotCgroup(
        "pids", "/drums/x", "/sys/fs/cgroup/pids/drums/x/cgroup.procs"
    )
    v2 = {"unified": "/sys/fs/cgroup/unified/d/drums/x", "memory": "/sys/fs/cgroup/unified/d/x"}
    assert slot_cgroup(v2, MOUNTINFO).path == "/d/drums/x"
    assert slot_cgroup(v2, MOUNTINFO).key == ""
    with pytest.raises(ValueError, match="no mounted v1 controller"):
        slot_cgroup({"cpu": "/sys/fs/cgroup/cpu/x"}, MOUNTINFO)


def test_forked_child_crash_is_the_parents_slot_and_kills_are_not_crashes() -> None:
    ledger, _ = ledger_with_slots()
    ledger.apply([pe.Fork(100, 100, 101, 101), pe.Fork(100, 100, 102, 102)])
    ledger.apply([pe.Fork(200, 200, 201, 201)])
    ledger.apply([exit_(101, 101, signal.SIGSEGV | 0x80), exit_(102, 102, signal.SIGKILL)])
    ledger.apply([exit_(201, 201, signal.SIGTERM), exit_(300, 300, signal.SIGSEGV)])
    [crash] = ledger.crashes("a")
    assert crash["pid"] == 101 and crash["signal"] == 11 and crash["signal_name"] == "SIGSEGV"
    assert crash["core_dumped"] and crash["name"] == "init-a" and crash["time"] == 1000.0
    assert ledger.crashes("b") == []
    assert 101 not in ledger.owner and 102 not in ledger.owner  # leaders that exited


def test_a_group_exit_counts_once_whichever_thread_reports_first() -> None:
    ledger, _ = ledger_with_slots()
    ledger.apply([pe.Fork(100, 100, 110, 110), pe.Fork(110, 110, 111, 110)])  # + a thread
    ledger.apply([exit_(111, 110, signal.SIGABRT), exit_(110, 110, signal.SIGABRT)])
    assert [(c["pid"], c["tid"]) for c in ledger.crashes("a")] == [(110, 111)]
    # The same pid reused by a new process of the slot may crash again and counts again.
    ledger.apply([pe.Fork(100, 100, 110, 110), exit_(110, 110, signal.SIGBUS)])
    assert [c["signal_name"] for c in ledger.crashes("a")] == ["SIGABRT", "SIGBUS"]


def test_a_reused_pid_outside_the_slot_is_forgotten() -> None:
    ledger, _ = ledger_with_slots()
    ledger.apply([pe.Fork(100, 100, 120, 120)])
    # 120 exits 0 (filtered out by the kernel, never seen); a host process gets pid 120.
    ledger.apply([pe.Fork(5, 5, 120, 120), exit_(120, 120, signal.SIGSEGV)])
    assert ledger.crashes("a") == []


def test_a_crash_is_placed_by_its_parent_without_fork_or_exec_events() -> None:
    # The kernel sends the watch nonzero exits only (issue 39, D10): a process too new for the
    # map is placed by its parent, known (200 is slot b's) or read from /proc (140's cgroup).
    ledger, reader = ledger_with_slots()
    reader.comms[130] = "soffice.bin"
    crash = pe.Exit(130, 130, signal.SIGILL, 17, 200, 200)
    assert ledger.to_look_up([crash]) == [130]  # its name only: the parent is known
    ledger.apply([crash])
    assert [c["comm"] for c in ledger.crashes("b")] == ["soffice.bin"]
    reader.cgroups[140] = proc_cgroup("/drums/a/sub")  # nested below the slot's cgroup
    reader.comms[140] = "helper"
    orphan = pe.Exit(141, 141, signal.SIGSEGV, 17, 140, 140)
    assert ledger.to_look_up([orphan]) == [141, 140]
    ledger.apply([orphan])
    assert [c["comm"] for c in ledger.crashes("a")] == ["child of helper"]
    assert ledger.owner.get(140) == "a"  # its next crashing child needs no read
    assert ledger.to_look_up([pe.Exit(142, 142, signal.SIGSEGV, 17, 140, 140)]) == [142]
    # Not a crash: no lookup at all; over the budget: counted, not placed.
    assert ledger.to_look_up([pe.Exit(150, 150, 1 << 8, 17, 5, 5)]) == []
    ledger.apply([pe.Exit(151, 151, signal.SIGSEGV, 17, 6, 6)], unread=[6])
    assert ledger.dropped == 1 and ledger.crashes("a")[-1]["pid"] == 141
    assert ledger.proc_reads == 1


def test_no_proc_reads_while_nothing_is_tracked() -> None:
    reader = FakeReader()
    ledger = CrashLedger(reader)
    ledger.apply([pe.Exec(5, 5), pe.Fork(5, 5, 6, 6), exit_(6, 6, signal.SIGSEGV)])
    assert ledger.proc_reads == 0 and ledger.records == {}


def test_untrack_forgets_and_retrack_keeps_records() -> None:
    ledger, reader = ledger_with_slots()
    ledger.apply([exit_(100, 100, signal.SIGFPE)])
    moved = SlotCgroup("pids", "/drums/a2", "/sys/fs/cgroup/pids/drums/a2/cgroup.procs")
    reader.members[moved.procs] = [150]
    ledger.track("a", moved)  # a reset into a new instance
    assert ledger.owner.get(150) == "a" and len(ledger.crashes("a")) == 1
    assert ledger.crashes("a", since=1000.5) == []
    ledger.untrack("a")
    assert ledger.crashes("a") == [] and 150 not in ledger.owner
    assert ledger._by_path == {("pids", "/drums/b"): "b"}


def test_overrun_resyncs_and_prune_waits_one_round() -> None:
    ledger, reader = ledger_with_slots()
    reader.members[A.procs] = [100, 140]
    reader.comms[140] = "late"
    ledger.apply([pe.Overrun()])
    assert ledger.owner.get(140) == "a" and ledger.overruns == 1
    reader.alive = {100, 200}
    ledger.prune()
    assert 140 in ledger.owner  # gone once: its exit event may still be queued
    ledger.prune()
    assert 140 not in ledger.owner and 100 in ledger.owner


class BrokenSocket:
    """Readable at once, then fails to read: what a connector socket that breaks looks like."""

    def __init__(self) -> None:
        self.ends = socket.socketpair()
        self.ends[1].send(b"x")
        self.filtered = True
        self.closed = False

    def fileno(self) -> int:
        return self.ends[0].fileno()

    def read_ready(self) -> list:
        raise OSError(errno.EIO, "read failed")

    def close(self) -> None:
        self.closed = True
        for end in self.ends:
            end.close()


async def test_a_watch_that_breaks_says_so_and_does_not_take_the_daemon_down() -> None:
    broken = BrokenSocket()
    watch = CrashWatch(open_socket=lambda: broken)  # type: ignore[arg-type, return-value]
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)  # started: the socket opened
        await wait_for(lambda: not watch.available, 10)
    assert broken.closed and "read failed" in (watch.error or "")
    assert watch.facts("any") == CrashFacts([], watched=False)
    assert watch.health()["error"].startswith("crash watch stopped")


class QueuedSocket:
    """A connector socket fed by the test: readable while events are queued."""

    def __init__(self) -> None:
        self.ends = socket.socketpair()
        self.queued: list[pe.Event | pe.Overrun] = []
        self.filtered = True

    def push(self, *events: pe.Event | pe.Overrun) -> None:
        self.queued.extend(events)
        self.ends[1].send(b"x")

    def fileno(self) -> int:
        return self.ends[0].fileno()

    def read_ready(self) -> list:
        try:
            self.ends[0].recv(4096, socket.MSG_DONTWAIT)
        except BlockingIOError:
            pass
        events, self.queued = self.queued, []
        return events

    def close(self) -> None:
        for end in self.ends:
            end.close()


class ThreadNotingReader(FakeReader):
    """Notes the thread of every /proc read the watch makes."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[tuple[str, int]] = []

    def _note(self, what: str) -> None:
        self.threads.append((what, threading.get_ident()))

    def cgroup(self, pid: int) -> str | None:
        self._note("cgroup")
        return super().cgroup(pid)

    def comm(self, pid: int) -> str | None:
        self._note("comm")
        return super().comm(pid)

    def procs(self, path: str) -> list[int]:
        self._note("procs")
        return super().procs(path)

    def exists(self, pid: int) -> bool:
        self._note("exists")
        return super().exists(pid)

    def mountinfo(self) -> str:
        self._note("mountinfo")
        return MOUNTINFO


async def test_the_watch_reads_proc_off_the_event_loop_thread() -> None:
    """track, a crash's parent lookup, an overrun's resync, the periodic resync and prune all read
    /proc: every one of those reads runs in a worker thread, never on trio's."""
    reader = ThreadNotingReader()
    reader.members["/sys/fs/cgroup/pids/drums/x/cgroup.procs"] = [100]
    reader.comms.update({100: "init", 130: "soffice.bin", 131: "sh"})
    reader.cgroups[131] = proc_cgroup("/drums/x")
    reader.alive.add(100)
    sock = QueuedSocket()
    watch = CrashWatch(resync_s=0.01, prune_s=0.01, reader=reader, open_socket=lambda: sock)  # type: ignore[arg-type, return-value]
    loop_thread = threading.get_ident()
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        await watch.track("x", {"pids": "/sys/fs/cgroup/pids/drums/x"})
        assert watch.ledger.owner == {100: "x"} and watch.ledger.comm[100] == "init"
        sock.push(pe.Exit(130, 130, signal.SIGSEGV, 17, 131, 131), pe.Overrun())
        await wait_for(lambda: watch.crashes("x"), 10)
        assert watch.crashes("x")[0]["comm"] == "soffice.bin" and watch.ledger.overruns == 1
        await wait_for(lambda: 131 not in watch.ledger.owner, 10)  # gone twice: pruned
        nursery.cancel_scope.cancel()
    kinds = {what for what, _ in reader.threads}
    assert kinds == {"mountinfo", "procs", "comm", "cgroup", "exists"}, kinds
    on_loop = [what for what, thread in reader.threads if thread == loop_thread]
    assert on_loop == [], f"/proc reads on the trio thread: {on_loop}"


# -- live --------------------------------------------------------------------------------------

needs_root_v1 = pytest.mark.skipif(
    os.geteuid() != 0
    or not {"memory", "pids"}
    <= set(parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())[0]),
    reason="needs root and cgroup v1 memory + pids",
)


def make_cgroup() -> dict[str, str]:
    """A memory + pids group under this process's own cgroups, named so no drumsd reconciler
    mistakes it for one of its slots."""
    mounts, _ = parse_cgroup_mounts(Path("/proc/self/mountinfo").read_text())
    bases = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    name = f"crash-watch-test-{uuid.uuid4().hex[:8]}"
    dirs = {c: str(mounts[c] / bases.get(c, "/").lstrip("/") / name) for c in ("memory", "pids")}
    for d in dirs.values():
        os.makedirs(d)
    return dirs


def remove_cgroup(dirs: dict[str, str]) -> None:
    deadline = time.monotonic() + 10
    for d in dirs.values():
        while True:
            for pid in ProcReader().procs(f"{d}/cgroup.procs"):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)


@pytest.fixture
def cgroups() -> Iterator[list[dict[str, str]]]:
    made: list[dict[str, str]] = []
    yield made
    for dirs in made:
        remove_cgroup(dirs)


def join(dirs: dict[str, str]) -> str:
    """Shell lines that move the shell itself into the group."""
    return "".join(f"echo $$ > {d}/cgroup.procs; " for d in dirs.values())


class Shell:
    """A shell in a slot cgroup: joins, says `joined`, then runs `script` when told `go`."""

    def __init__(self, proc: trio.Process) -> None:
        self.proc = proc
        self.buffer = b""

    @classmethod
    async def start(cls, dirs: dict[str, str], script: str) -> Shell:
        body = f"{join(dirs)}echo joined; read go; ulimit -c 0; {script} echo done; read end"
        proc = await trio.lowlevel.open_process(
            ["sh", "-c", body], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        shell = cls(proc)
        await shell.expect("joined")
        return shell

    async def expect(self, word: str, timeout_s: float = 20) -> str:
        assert self.proc.stdout is not None
        with trio.fail_after(timeout_s):
            while f"{word}\n".encode() not in self.buffer:
                chunk = await self.proc.stdout.receive_some()
                assert chunk, f"shell ended before {word!r}: {self.buffer!r}"
                self.buffer += chunk
        return self.buffer.decode()

    async def go(self) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(b"go\n")

    async def aclose(self) -> None:
        self.proc.kill()
        await self.proc.wait()


THREADED_ABORT = (
    f"{sys.executable} -c 'import os, threading; e = threading.Event(); "
    "[threading.Thread(target=e.wait, daemon=True).start() for _ in range(4)]; os.abort()'"
)


@needs_root_v1
async def test_live_only_the_crash_counts_and_only_for_its_slot(cgroups) -> None:
    a, b, barrier = make_cgroup(), make_cgroup(), make_cgroup()
    cgroups.extend([a, b, barrier])
    watch = CrashWatch()
    started = time.time()
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        assert watch.available and watch.error is None
        shell_a = await Shell.start(
            a,
            "sh -c 'kill -SEGV $$'; echo segv $?; true; echo true $?; "
            "sh -c 'kill -KILL $$'; echo kill $?; sh -c 'kill -TERM $$'; echo term $?; "
            f"sh -c 'exit 3'; echo exit $?; {THREADED_ABORT}; echo abort $?;",
        )
        shell_b = await Shell.start(b, "true; sh -c 'kill -KILL $$'; echo kill $?; sh -c 'exit 3';")
        shell_x = await Shell.start(barrier, "sh -c 'kill -SEGV $$';")
        await watch.track("a", a)
        await watch.track("b", b)
        await watch.track("barrier", barrier)
        assert watch.ledger.owner.get(shell_a.proc.pid) == "a"  # seeded from cgroup.procs
        await shell_a.go()
        await shell_b.go()
        out_a = await shell_a.expect("done")
        await shell_b.expect("done")
        for line in ("segv 139", "true 0", "kill 137", "term 143", "exit 3", "abort 134"):
            assert line in out_a, out_a
        # Events come in order: once the barrier's crash is seen, a's and b's were folded.
        await shell_x.go()
        await wait_for(lambda: watch.crashes("barrier"), 10)
        crashes = watch.crashes("a")
        # No exec event comes: named by their own comm when the read beat the shell's reap,
        # else by what they were at the fork (the shell).
        assert [c["signal_name"] for c in crashes] == ["SIGSEGV", "SIGABRT"], crashes
        assert crashes[0]["comm"] == "sh", crashes
        assert crashes[1]["comm"] in (Path(sys.executable).name[:15], "sh"), crashes
        assert all(started <= c["time"] <= time.time() for c in crashes)
        assert watch.crashes("b") == []
        assert watch.crashes("a", since=time.time()) == []
        assert watch.facts("a").watched is True
        health = watch.health()
        assert health["available"] and health["tracked_slots"] == 3 and health["overruns"] == 0
        for shell in (shell_a, shell_b, shell_x):
            await shell.aclose()
        nursery.cancel_scope.cancel()
    assert not watch.available


@needs_root_v1
async def test_live_child_of_a_process_that_joined_after_track_is_placed_by_its_parent(
    cgroups,
) -> None:
    d = make_cgroup()
    cgroups.append(d)
    watch = CrashWatch(resync_s=3600)  # no resync: only the parent's lookup can place it
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        await watch.track("s", d)
        # Exec-helper style: a shell joins the slot's cgroup from outside and execs a program
        # whose child crashes; the map never knew the shell (its fork was outside the slot).
        helper = await trio.lowlevel.open_process(
            ["sh", "-c", join(d) + "exec sh -c \"sh -c 'kill -SEGV \\$\\$'; sleep 0.5\""]
        )
        assert await helper.wait() == 0
        await wait_for(lambda: len(watch.crashes("s")) == 1, 10)
        assert watch.crashes("s")[0]["pid"] != helper.pid
        assert watch.health()["proc_reads"] >= 1 and watch.health()["dropped"] == 0
        watch.untrack("s")
        assert watch.crashes("s") == [] and watch.health()["tracked_pids"] == 0
        nursery.cancel_scope.cancel()


@needs_root_v1
async def test_live_process_that_joins_without_exec_is_claimed_by_resync(cgroups) -> None:
    d = make_cgroup()
    cgroups.append(d)
    watch = CrashWatch(resync_s=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        await watch.track("s", d)
        shell = await Shell.start(d, "sh -c 'kill -BUS $$';")
        await wait_for(lambda: watch.ledger.owner.get(shell.proc.pid) == "s", 10)
        await shell.go()
        await shell.expect("done")
        await wait_for(lambda: len(watch.crashes("s")) == 1, 10)
        assert [c["signal_name"] for c in watch.crashes("s")] == ["SIGBUS"]
        await shell.aclose()
        nursery.cancel_scope.cancel()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for unshare --net")
def test_run_refuses_to_start_without_the_connector() -> None:
    code = (
        "import trio\n"
        "from drumsd.linux.proc_events import ProcEventsError\n"
        "from drumsd.runtime.crash_watch import CrashWatch\n"
        "w = CrashWatch()\n"
        "async def main():\n"
        "    async with trio.open_nursery() as n:\n"
        "        await n.start(w.run)\n"
        "try:\n    trio.run(main)\n"
        "except* ProcEventsError:\n    print('REFUSED', w.available, w.error)\n"
    )
    src = str(Path(pe.__file__).parents[2])
    out = subprocess.run(
        ["unshare", "--net", sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": src},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.startswith("REFUSED False cannot subscribe"), out
    assert "host's network namespace" in out.stdout
