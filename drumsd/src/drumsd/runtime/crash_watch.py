"""Crash watch: crash-signal exits of any process in a tracked slot's cgroup, seen through the
kernel's process events connector (`drumsd.linux.proc_events`), for the no_app_crash gate.

The kernel sends the watch forks and nonzero exits only (`proc_events.SUBSCRIBED_EVENTS`): no
exec, comm change or exit 0 of any host process wakes the daemon, and no event costs a /proc read
except a crash's (issue 39, D10: a fork/exec storm in one slot cost the daemon 0.11 core, each
exec a read in a worker thread). A process belongs to a slot when its cgroup is the slot's (or
below it). Membership is a tgid -> slot map, so per-event work is a dict lookup: seeded from the
slot's cgroup.procs on `track` and every `resync_s`, and inherited on fork (a child starts in its
parent's cgroup). A crash of a process the map does not know (the exec helper joins a cgroup
between fork and exec, from outside) is placed by its parent's cgroup, read at the exit; the
exiting task itself cannot be placed by /proc: by then its /proc/<pid>/cgroup reads "/" on
every hierarchy, zombie or not (measured).

Crashes are `proc_events.CRASH_SIGNALS`. SIGKILL and SIGTERM never count: the daemon's own kills,
resets and destroys send them, and an OOM kill (SIGKILL) is the no_oom_kill gate's to judge.
A multi-threaded crash reports one exit per thread; it is counted once per thread group. Nonzero
exits that are not crashes (`exit 1`) are dropped before any lookup. The per-batch work is
bounded: at most `MAX_LOOKUPS_PER_BATCH` pids are read from /proc (crash exits past that are
counted as `dropped` in health), and each slot logs at most `MAX_LOGGED_PER_SLOT` crash lines
per track. A crash's name is its comm when it can still be read (its parent may reap it first),
else what the map knew (its parent's name at the fork).

The ledger folds on the trio thread and never touches /proc there: what a fold will ask (the
cgroup and comm of crashed processes and their parents, the slots' cgroup.procs, which tgids
still exist) is read ahead in a worker thread (`ReadAhead.load`), and the fold answers from it.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from drumsd.core.seams import CrashFacts
from drumsd.linux import proc_events as pe
from drumsd.linux.cgroups import parse_cgroup_mounts, parse_proc_cgroup
from drumsd.linux.proc_reader import ProcReader

log = logging.getLogger("drumsd.crash_watch")

MAX_RECORDS_PER_SLOT = 256
# Parents read from /proc per batch of events (a storm of crashing processes of one parent needs
# one: the parent then joins the map).
MAX_LOOKUPS_PER_BATCH = 64
MAX_LOGGED_PER_SLOT = 20
# Exits of one tgid closer than this are one group exit (one per thread); a later crash of the
# same tgid is a reused pid's.
GROUP_EXIT_NS = 1_000_000_000
# How long the watch lets events gather after the first wakes it: a storm of forks costs one
# wake-up per window instead of one per fork, and a crash is judged this much later.
COALESCE_S = 0.05


@dataclass(frozen=True)
class SlotCgroup:
    """Where a slot's processes are: `key` is the /proc/<pid>/cgroup controller to compare
    ("pids" on v1, "" on v2), `path` the cgroup path there, `procs` its cgroup.procs file."""

    key: str
    path: str
    procs: str


def slot_cgroup(dirs: Mapping[str, str], mountinfo: str) -> SlotCgroup:
    """A slot's cgroup dirs (controller -> dir, as the cgroup drivers return them) -> what to
    compare /proc/<pid>/cgroup lines against."""
    v1, v2 = parse_cgroup_mounts(mountinfo)
    if "unified" in dirs:
        if v2 is None:
            raise ValueError(f"slot cgroup {dirs['unified']} is v2 but no cgroup2 is mounted")
        return SlotCgroup(
            "", _relative(dirs["unified"], v2), str(Path(dirs["unified"]) / "cgroup.procs")
        )
    for key in ("pids", "memory", "freezer", "cpu"):
        if key in dirs and key in v1:
            return SlotCgroup(
                key, _relative(dirs[key], v1[key]), str(Path(dirs[key]) / "cgroup.procs")
            )
    raise ValueError(f"slot cgroup dirs {dict(dirs)} name no mounted v1 controller")


def _relative(directory: str, mount: Path) -> str:
    rel = Path(directory).relative_to(mount)
    return "/" + str(rel).strip(".").strip("/") if str(rel) != "." else "/"


class ReadAhead(ProcReader):
    """The reads one fold of the ledger will make, done beforehand in a worker thread by `load`,
    so the fold itself runs on the trio thread without touching /proc. A read that was not
    loaded answers as for a process that is gone (None, empty)."""

    def __init__(self, source: ProcReader) -> None:
        self.source = source
        self._cgroup: dict[int, str | None] = {}
        self._comm: dict[int, str | None] = {}
        self._procs: dict[str, list[int]] = {}
        self._exists: dict[int, bool] = {}

    def load(
        self,
        *,
        pids: Iterable[int] = (),
        procs_files: Mapping[str, str] | None = None,
        owner: Mapping[int, str] | None = None,
        exists: Iterable[int] = (),
    ) -> None:
        """Blocking: read the cgroup and comm of `pids`, each slot's cgroup.procs
        (`procs_files`: path -> slot id) and the comm of the processes listed there that `owner`
        does not give to that slot, and whether each of `exists` still exists."""
        procs_files, owner = procs_files or {}, owner or {}
        cgroup = {pid: self.source.cgroup(pid) for pid in pids}
        comm = {pid: self.source.comm(pid) for pid in cgroup}
        listed = {path: self.source.procs(path) for path in procs_files}
        for path, tgids in listed.items():
            for tgid in tgids:
                if owner.get(tgid) != procs_files[path] and tgid not in comm:
                    comm[tgid] = self.source.comm(tgid)
        alive = {pid: self.source.exists(pid) for pid in exists}
        self._cgroup, self._comm, self._procs, self._exists = cgroup, comm, listed, alive

    def cgroup(self, pid: int) -> str | None:
        return self._cgroup.get(pid)

    def comm(self, pid: int) -> str | None:
        return self._comm.get(pid)

    def procs(self, path: str) -> list[int]:
        return list(self._procs.get(path, ()))

    def exists(self, pid: int) -> bool:
        return self._exists.get(pid, False)

    def mountinfo(self) -> str:
        return self.source.mountinfo()


class CrashLedger:
    """Folds process events into pid ownership and per-slot crash records. No I/O of its own
    beyond `reader`, no trio: the watch feeds it, tests feed it crafted events."""

    def __init__(self, reader: ProcReader | None = None, clock: Callable[[], float] = time.time):
        self.reader = reader or ProcReader()
        self.clock = clock
        self.slots: dict[str, SlotCgroup] = {}
        self._by_path: dict[tuple[str, str], str] = {}
        self.owner: dict[int, str] = {}  # tgid -> slot id
        self.comm: dict[int, str] = {}  # tgid -> comm, for owned tgids
        # tgid -> the kernel's time of its recorded crash (a group exit reports per thread)
        self._crashed: dict[int, int] = {}
        self._logged: dict[str, int] = {}  # crash lines logged per slot since its track
        self._missing: set[int] = set()  # owned tgids gone at the last prune
        self.records: dict[str, deque[dict[str, Any]]] = {}
        self.events = 0
        self.overruns = 0
        self.proc_reads = 0
        self.dropped = 0  # crash exits not placed: over the batch's lookup budget
        self._unread: set[int] = set()

    # -- slots --------------------------------------------------------------------------

    def track(self, slot_id: str, where: SlotCgroup) -> None:
        self.untrack(slot_id, keep_records=True)
        self.slots[slot_id] = where
        self._by_path[(where.key, where.path)] = slot_id
        self.records.setdefault(slot_id, deque(maxlen=MAX_RECORDS_PER_SLOT))
        self._logged[slot_id] = 0
        self.resync(slot_id)

    def untrack(self, slot_id: str, keep_records: bool = False) -> None:
        where = self.slots.pop(slot_id, None)
        if where is not None:
            self._by_path.pop((where.key, where.path), None)
        for tgid in [t for t, s in self.owner.items() if s == slot_id]:
            self._forget(tgid)
        if not keep_records:
            self.records.pop(slot_id, None)
            self._logged.pop(slot_id, None)

    def resync(self, slot_id: str) -> None:
        """Claim every process now in the slot's cgroup. Nothing is dropped here: a process that
        left may have an exit event still queued, which must find its owner."""
        where = self.slots[slot_id]
        for tgid in self.reader.procs(where.procs):
            if self.owner.get(tgid) != slot_id:
                self.owner[tgid] = slot_id
                self.comm[tgid] = self.reader.comm(tgid) or "?"

    def resync_all(self) -> None:
        for slot_id in list(self.slots):
            self.resync(slot_id)

    def prune(self) -> None:
        """Drop owned tgids that are gone now and were gone at the previous prune too: by then
        any exit event of theirs has long been folded (exit-0 events are filtered out by the
        kernel, so this is how quiet exits leave the map)."""
        gone = {t for t in self.owner if not self.reader.exists(t)}
        for tgid in gone & self._missing:
            self._forget(tgid)
        self._missing = gone - self._missing
        self._crashed.clear()  # group exits are over long before a prune (seconds apart)

    def slot_of_path(self, text: str | None) -> str | None:
        """/proc/<pid>/cgroup text -> the tracked slot whose cgroup holds it (or an ancestor)."""
        if not text or not self._by_path:
            return None
        paths = parse_proc_cgroup(text)
        for key in {k for k, _ in self._by_path}:
            path = paths.get(key)
            while path:
                slot = self._by_path.get((key, path))
                if slot is not None:
                    return slot
                if path == "/":
                    break
                path = path.rsplit("/", 1)[0] or "/"
        return None

    def _lookup(self, tgid: int) -> str | None:
        self.proc_reads += 1
        slot = self.slot_of_path(self.reader.cgroup(tgid))
        if slot is not None:
            self.owner[tgid] = slot
            self.comm[tgid] = self.reader.comm(tgid) or "?"
        return slot

    def to_look_up(self, events: Iterable[pe.Event | pe.Overrun]) -> list[int]:
        """The pids a fold of `events` will read (parents of crash exits neither they nor their
        parent known): what to read ahead. Empty while no slot is tracked."""
        if not self.slots:
            return []
        wanted: dict[int, None] = {}
        for ev in events:
            if isinstance(ev, pe.Exit) and ev.is_crash:
                wanted[ev.tgid] = None  # its comm, while its parent has not reaped it
                if ev.tgid not in self.owner and ev.parent_tgid not in self.owner:
                    wanted[ev.parent_tgid] = None
        return list(wanted)

    def _forget(self, tgid: int) -> None:
        self.owner.pop(tgid, None)
        self.comm.pop(tgid, None)

    # -- events -------------------------------------------------------------------------

    def apply(self, events: Iterable[pe.Event | pe.Overrun], unread: Iterable[int] = ()) -> None:
        """Fold `events`; `unread` are pids the read-ahead left out (over its budget): an exit
        that needs one of them is counted as dropped, not placed."""
        self._unread = set(unread)
        for ev in events:
            self.events += 1
            if isinstance(ev, pe.Fork):
                self._fork(ev)
            elif isinstance(ev, pe.Exit):
                self._exit(ev)
            elif isinstance(ev, pe.Exec):
                self._exec(ev)
            elif isinstance(ev, pe.Comm):
                if ev.pid == ev.tgid and ev.tgid in self.owner:
                    self.comm[ev.tgid] = ev.comm
            elif isinstance(ev, pe.Overrun):
                self.overruns += 1
                self.resync_all()

    def _fork(self, ev: pe.Fork) -> None:
        if ev.is_thread:
            return
        child = ev.child_tgid
        # A new process: its pid may be a reused one, so whatever we knew about it is stale.
        self._crashed.pop(child, None)
        self._missing.discard(child)
        slot = self.owner.get(ev.parent_tgid)
        if slot is None:
            if child in self.owner:
                self._forget(child)
        else:
            self.owner[child] = slot
            self.comm[child] = self.comm.get(ev.parent_tgid, "?")

    def _exec(self, ev: pe.Exec) -> None:
        # Only a kernel that cannot filter sends execs: a new name, nothing to look up.
        if ev.tgid in self.owner:
            self.comm[ev.tgid] = self.reader.comm(ev.tgid) or self.comm.get(ev.tgid, "?")

    def _place(self, ev: pe.Exit) -> str | None:
        """The slot of an exiting process: its own entry, its parent's, or its parent's cgroup
        (a zombie's own /proc/<pid>/cgroup already reads "/", measured)."""
        slot = self.owner.get(ev.tgid)
        if slot is not None or not self.slots:
            return slot
        slot = self.owner.get(ev.parent_tgid)
        if slot is None:
            if ev.parent_tgid in self._unread:
                self.dropped += 1
                return None
            slot = self._lookup(ev.parent_tgid)
        if slot is not None:
            # Its own name when it can still be read; its parent may have reaped it first.
            parent = self.comm.get(ev.parent_tgid, "?")
            self.owner[ev.tgid] = slot
            self.comm[ev.tgid] = self.reader.comm(ev.tgid) or f"child of {parent}"
        return slot

    def _exit(self, ev: pe.Exit) -> None:
        tgid = ev.tgid
        if not ev.is_crash:
            if ev.is_leader and tgid in self.owner:
                self._forget(tgid)
            return
        seen = self._crashed.get(tgid)
        if seen is not None and abs(ev.timestamp_ns - seen) < GROUP_EXIT_NS:
            return
        slot = self._place(ev)
        if slot is None:
            return
        self._crashed[tgid] = ev.timestamp_ns
        comm = self.reader.comm(tgid) or self.comm.get(tgid, "?")
        when = self.clock()
        if ev.timestamp_ns:
            # The kernel's stamp is CLOCK_MONOTONIC: place it on the wall clock.
            when -= max(0.0, time.monotonic() - ev.timestamp_ns / 1e9)
        record = {
            "pid": tgid,
            "tgid": tgid,
            "tid": ev.pid,
            "name": comm,
            "comm": comm,
            "signal": ev.signal,
            "signal_name": pe.signal_name(ev.signal),
            "core_dumped": ev.core_dumped,
            "time": when,
        }
        self.records.setdefault(slot, deque(maxlen=MAX_RECORDS_PER_SLOT)).append(record)
        logged = self._logged.get(slot, 0)
        if logged < MAX_LOGGED_PER_SLOT:
            self._logged[slot] = logged + 1
            log.warning(
                "crash exit in slot",
                extra={"slot": slot, "pid": tgid, "comm": comm, "signal": record["signal_name"]},
            )
        if ev.is_leader:
            self._forget(tgid)

    def crashes(self, slot_id: str, since: float | None = None) -> list[dict[str, Any]]:
        return [
            dict(r) for r in self.records.get(slot_id, ()) if since is None or r["time"] >= since
        ]


class CrashWatch:
    """The trio service. Start it in the root nursery with `await nursery.start(watch.run)`:
    that raises `proc_events.ProcEventsError` (and drumsd must refuse to start) when the
    connector cannot be opened; `available`/`error` say the same for /v1/health."""

    def __init__(
        self,
        *,
        resync_s: float = 2.0,
        prune_s: float = 10.0,
        coalesce_s: float = COALESCE_S,
        reader: ProcReader | None = None,
        open_socket: Callable[[], pe.ProcEventsSocket] = pe.ProcEventsSocket.open,
    ) -> None:
        self.reader = ReadAhead(reader or ProcReader())
        self.ledger = CrashLedger(self.reader)
        # One read-ahead and its fold at a time: `track` and the serve loop share the reader.
        self._fold_lock = trio.Lock()
        self.resync_s = resync_s
        self.prune_s = prune_s
        self.coalesce_s = coalesce_s
        self._open_socket = open_socket
        self._mountinfo: str | None = None
        self._sock: pe.ProcEventsSocket | None = None
        self.available = False
        self.error: str | None = None
        self.filtered: bool | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            sock = await trio.to_thread.run_sync(self._open_socket)
        except pe.ProcEventsError as exc:
            self.error = str(exc)
            raise
        self.available, self.error, self.filtered = True, None, sock.filtered
        self._sock = sock
        log.info("crash watch subscribed", extra={"kernel_filter": sock.filtered})
        task_status.started()
        try:
            await self._serve(sock)
        except Exception as exc:
            # Not fatal to the daemon: with `available` False the no_app_crash gate stays
            # pending, so no episode is judged valid unwatched, and /v1/health says why.
            self.error = f"crash watch stopped: {exc!r}; restart drumsd to watch again"
            log.exception("crash watch stopped", extra={"error": repr(exc)})
        finally:
            self.available, self._sock = False, None
            sock.close()

    async def _serve(self, sock: pe.ProcEventsSocket) -> None:
        next_resync = trio.current_time() + self.resync_s
        next_prune = trio.current_time() + self.prune_s
        while True:
            with trio.move_on_after(max(0.0, next_resync - trio.current_time())):
                await trio.lowlevel.wait_readable(sock.fileno())
                # Let a burst gather: one wake-up and one fold per window, not per fork (the
                # socket holds ~100k events, a window of a storm a few thousand).
                await trio.sleep(self.coalesce_s)
            await self._apply(sock.read_ready())
            now = trio.current_time()
            if now >= next_resync:
                # Drain first: an exit queued before the resync must meet the old ownership.
                await self._apply(sock.read_ready())
                async with self._fold_lock:
                    await self._read_ahead(resync=True)
                    self.ledger.resync_all()
                next_resync = now + self.resync_s
            if now >= next_prune:
                async with self._fold_lock:
                    await self._read_ahead(exists=list(self.ledger.owner))
                    self.ledger.prune()
                next_prune = now + self.prune_s
            await trio.lowlevel.checkpoint()

    async def _apply(self, events: list[pe.Event | pe.Overrun]) -> None:
        """Fold a batch; the /proc reads it needs (an exec's cgroup and comm, an overrun's
        resync) are read ahead in a thread, and only while a slot is tracked."""
        led = self.ledger
        async with self._fold_lock:
            pids = led.to_look_up(events)
            pids, unread = pids[:MAX_LOOKUPS_PER_BATCH], pids[MAX_LOOKUPS_PER_BATCH:]
            overrun = bool(led.slots) and any(isinstance(ev, pe.Overrun) for ev in events)
            if pids or overrun:
                await self._read_ahead(pids=pids, resync=overrun)
            led.apply(events, unread)

    async def _read_ahead(
        self, *, pids: Iterable[int] = (), resync: bool = False, exists: Iterable[int] = ()
    ) -> None:
        """Load the reader for the next fold, in a worker thread (hold `_fold_lock`)."""
        procs = {where.procs: slot for slot, where in self.ledger.slots.items()} if resync else {}
        load = partial(
            self.reader.load,
            pids=list(pids),
            procs_files=procs,
            owner=dict(self.ledger.owner),
            exists=list(exists),
        )
        await trio.to_thread.run_sync(load)

    async def track(self, slot_id: str, cgroup_dirs: Mapping[str, str]) -> None:
        """Watch the processes in this cgroup for `slot_id` (again: replaces its cgroup and
        keeps its crash records, for a reset into a new instance)."""
        if self._mountinfo is None:
            self._mountinfo = await trio.to_thread.run_sync(self.reader.mountinfo)
        where = slot_cgroup(cgroup_dirs, self._mountinfo)
        if self._sock is not None:
            # Fold what is queued first (up to a coalescing window of it): a fork from before
            # the seeding, of a process the seeding claims, would otherwise undo the claim.
            await self._apply(self._sock.read_ready())
        async with self._fold_lock:
            load = partial(
                self.reader.load, procs_files={where.procs: slot_id}, owner=dict(self.ledger.owner)
            )
            await trio.to_thread.run_sync(load)
            self.ledger.track(slot_id, where)

    def untrack(self, slot_id: str) -> None:
        """Stop watching the slot and forget its crash records."""
        self.ledger.untrack(slot_id)

    def crashes(self, slot_id: str, since: float | None = None) -> list[dict[str, Any]]:
        """Crash exits of the slot's processes, oldest first, at or after `since` (a time.time()
        value): {pid, tgid, tid, name, comm, signal, signal_name, core_dumped, time}."""
        return self.ledger.crashes(slot_id, since)

    def facts(self, slot_id: str, since: float | None = None) -> CrashFacts:
        """What the no_app_crash gate judges: the slot's crashes since `since`, and whether the
        watch runs."""
        return CrashFacts(self.crashes(slot_id, since), watched=self.available)

    def health(self) -> dict[str, Any]:
        led = self.ledger
        return {
            "available": self.available,
            "error": self.error,
            "kernel_filter": self.filtered,
            "tracked_slots": len(led.slots),
            "tracked_pids": len(led.owner),
            "events": led.events,
            "overruns": led.overruns,
            "proc_reads": led.proc_reads,
            "dropped": led.dropped,
        }
