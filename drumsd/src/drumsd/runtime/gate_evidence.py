"""Gate evidence the runtime's `facts()` does not give, read from the OS for a `SlotHandle`.

`GateEvidence.read` returns keys to merge into `SlotFacts.extra` (see `drumsd.core.gates`):
  mounts_normalized  the slot's mount table as "<mount point> <fstype>" (from the runtime's raw
                     mountinfo lines); the supervisor judges these instead of the raw lines
  expected_mounts    the table a restored slot must have (the stage-1 plan of its template)
  proc_names         {pid: comm} of the tree, so natural_exits can apply
  display_server     who serves the slot's X display: the listening sockets of :0 in its netns
                     and the process holding them (pid, start time, uid), for the
                     display_server gate
  guest_workers      pids of the guest agent's action worker, which the agent restarts itself
                     (a step that kills it): its exit is not an app's (alive_after_resume)
  lock_applied       hardened profile: the init's user namespace maps in-slot root to the slot's
                     own unprivileged host range, every process of the tree runs inside it, and
                     every one is locked (NoNewPrivs 1, Seccomp 2, an empty bounding set;
                     desktop-init too: what it keeps is in its permitted set, not the bounding)
  upper_sha256       (at episode start) the hash of what was restored into the upper layer: the
                     checkpoint snapshot's tree hash when the live upper still equals the snapshot
                     (outside the volatile paths the restored tree writes itself, and the image's
                     caches, image_profiles.state_caches), else a hash of the live upper, with
                     the difference in `upper_diff`
  upper_caches       (with upper_sha256, when the image has any) the cache globs not compared
  upper_written      (with upper_sha256) entries of the difference the restored tree made itself
                     (touched after its restore began), not counted as a mismatch
  upper_mapped       (with upper_sha256) changed files the restored tree maps shared and
                     writable, not counted as a mismatch: such a file changes with no write() and,
                     on the upper's tmpfs, with no new mtime or ctime (Chromium's BrowserMetrics)
Reading is synchronous file work; call it through `trio.to_thread`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from drumsd.core.seams import SlotFacts, SlotHandle
from drumsd.linux import evidence as ev
from drumsd.linux import trees

HARDENED_RANGE = 65536
ALLOWED_CAPBND = 0


def _tree_sha256(root: Path) -> str:
    # The runtime's own hash function recorded the snapshot's upper_sha256: use the same one.
    return trees.tree_sha256(root)


SnapshotFacts = tuple[str, dict[str, str]]  # a snapshot's tree hash and its upper manifest


def snapshot_facts(snapshot: Path, volatile: Sequence[str]) -> SnapshotFacts:
    return _tree_sha256(snapshot), ev.upper_manifest(snapshot, volatile)


def state_hash_evidence(
    live_upper: Path,
    snapshot: Path,
    volatile: Sequence[str] = ev.VOLATILE_UPPER,
    written_since: float | None = None,
    known: SnapshotFacts | None = None,
    mapped: Callable[[], ev.SharedMaps] | None = None,
) -> dict[str, Any]:
    """upper_sha256 (+ upper_diff) for the state_hash gate; see the module doc.

    With `written_since` (when criu began the restore, wall clock, taken after the snapshot was
    copied into the upper), a difference the restored tree made itself (an entry, or for a
    removal its parent dir, whose mtime or ctime is at or after that time) is reported apart, in
    `upper_written`, not as a mismatch: apps of a template write their files as soon as they
    run (Chromium rewrites `Web Data` and its leveldb logs on resume). A copy changed before
    the restore keeps older times, so it stays a mismatch.

    With `mapped` (read only when a difference is left): a changed file that a process of the
    tree maps shared and writable is the tree's own writing too, reported apart in
    `upper_mapped`. On a tmpfs (the slot's upper) a page of such a mapping that a read fault
    brought in is mapped writable, so the tree's later writes to it never fault and never move
    the file's times: Chromium reads and writes its BrowserMetrics file that way on resume."""
    if not snapshot.is_dir():
        return {"upper_unreadable": f"checkpoint snapshot {snapshot} is missing"}
    if not live_upper.is_dir():
        return {"upper_unreadable": f"slot upper {live_upper} is missing"}
    snapshot_sha, snapshot_manifest = known or snapshot_facts(snapshot, volatile)
    live = ev.upper_manifest(live_upper, volatile)
    diff = ev.manifest_diff(live, snapshot_manifest)
    written: list[str] = []
    if written_since is not None:
        diff, written = ev.split_written_since(diff, live_upper, written_since)
    out: dict[str, Any] = {"upper_written": written[:20]} if written else {}
    if mapped is not None and diff.get("changed"):
        diff, by_mapping = ev.split_mapped(diff, live_upper, mapped())
        if by_mapping:
            out["upper_mapped"] = by_mapping[:20]
    if any(diff.values()):
        return {
            **out,
            "upper_sha256": "live:" + ev.manifest_sha256(live),
            "upper_diff": {k: v[:20] for k, v in diff.items()},
        }
    return {**out, "upper_sha256": snapshot_sha}


def lock_evidence(pids: Sequence[int], init_pid: int, uid_base: int | None) -> dict[str, Any]:
    """lock_applied for the hardened profile: uid_map, every process's host uids and lock."""
    if uid_base is None:
        return {"lock_applied": False, "lock": {"reason": "the slot has no uid range (uid_base)"}}
    text = ev.read_text(f"/proc/{init_pid}/uid_map")
    if text is None:
        return {"lock": {"reason": "the init's uid_map cannot be read"}}
    uid_map = ev.parse_uid_map(text)
    want = [(0, uid_base, HARDENED_RANGE)]
    outside = {
        pid: uids
        for pid, uids in ev.host_uids(pids).items()
        if any(not uid_base <= u < uid_base + HARDENED_RANGE for u in uids)
    }
    not_locked = ev.process_locks(pids, ALLOWED_CAPBND)
    applied = uid_map == want and uid_base > 0 and not outside and not not_locked and bool(pids)
    detail: dict[str, Any] = {"uid_map": uid_map, "uid_base": uid_base}
    if outside:
        detail["host_uids_outside_range"] = dict(list(outside.items())[:10])
    if not_locked:
        detail["not_locked"] = dict(list(not_locked.items())[:10])
    if not pids:
        detail["reason"] = "the slot has no processes to check"
    return {"lock_applied": applied, "lock": detail}


SNAPSHOTS_KEPT = 64


class GateEvidence:
    """Reads the evidence; keeps the expected mount table (same for every slot) and the facts of
    checkpoint snapshots it has read. A checkpoint's upper snapshot is written once, by its dump,
    and only copied from after: its hash and manifest are read once (per directory inode and
    mtime), not at every episode start (0.2-0.3 s of a reset for an office task checkpoint's
    260-entry upper, measured here). The live upper is still walked every time."""

    def __init__(
        self, volatile: Sequence[str] = ev.VOLATILE_UPPER, *, procview: bool = False
    ) -> None:
        self.volatile = tuple(volatile)
        self.expected_mounts = ev.expected_slot_mounts(procview=procview)
        self._snapshots: dict[tuple[str, int, int, tuple[str, ...]], SnapshotFacts] = {}

    def snapshot(self, snapshot: Path, volatile: Sequence[str] = ()) -> SnapshotFacts | None:
        """The snapshot's facts, read once; None when it cannot be read (the caller reports)."""
        try:
            st = snapshot.stat()
        except OSError:
            return None
        globs = tuple(volatile) or self.volatile
        key = (str(snapshot), st.st_ino, st.st_mtime_ns, globs)
        known = self._snapshots.get(key)
        if known is None:
            known = snapshot_facts(snapshot, globs)
            while len(self._snapshots) >= SNAPSHOTS_KEPT:
                self._snapshots.pop(next(iter(self._snapshots)), None)
            self._snapshots[key] = known
        return known

    def display_server(
        self, handle: SlotHandle, pids: Sequence[int], names: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The X server's identity now (`evidence.display_server`); the processes named like an
        X server are asked first, so a full read rarely lists more than one process's fds."""
        names = names or {}
        first = [p for p in pids if names.get(str(p)) in ev.X_SERVER_NAMES]
        rest = [p for p in pids if p not in first]
        return ev.display_server(handle.init_pid, [*first, *rest])

    def read(
        self,
        handle: SlotHandle,
        facts: SlotFacts,
        *,
        profile: str,
        snapshot: Path | None = None,
        written_since: float | None = None,
        caches: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The `SlotFacts.extra` keys (module doc) for the runtime's `facts` of this handle; with
        `snapshot` (the checkpoint's upper dir), the state_hash evidence too, not comparing
        the image's `caches` (globs)."""
        out: dict[str, Any] = {"expected_mounts": self.expected_mounts}
        try:
            out["mounts_normalized"] = ev.mount_entries(facts.mounts)
        except (ValueError, IndexError) as exc:
            out["mounts_unparsed"] = str(exc)
        pids = [int(p) for p in facts.pids]
        out["proc_names"] = ev.proc_names(pids)
        out["guest_workers"] = ev.guest_workers(out["proc_names"])
        if facts.alive:
            out["display_server"] = self.display_server(handle, pids, out["proc_names"])
        if profile == "hardened" and facts.alive:
            out.update(lock_evidence(pids, handle.init_pid, handle.extra.get("uid_base")))
        if snapshot is not None:
            volatile = (*self.volatile, *caches)
            known = self.snapshot(snapshot, volatile) if snapshot.is_dir() else None
            mapped = partial(ev.shared_writable_maps, pids)
            out.update(
                state_hash_evidence(
                    handle.upper, snapshot, volatile, written_since, known, mapped=mapped
                )
            )
            if caches:
                out["upper_caches"] = list(caches)
        return out
