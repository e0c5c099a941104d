"""Episodes and gates: a new episode's gate report, the facts gates are judged from, quarantine on
a failed gate, the per-episode timers (alive_after_resume, the init's exit)."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core import gates as G
from drumsd.core.records import (
    GateEntry,
    SlotRecord,
    SlotStatus,
    is_live,
)
from drumsd.core.seams import (
    RuntimeError_,
    SlotFacts,
    SlotHandle,
)
from drumsd.linux import image_profiles
from drumsd.runtime.handles import handle_of, handle_to_json
from drumsd.runtime.services.spares import SparesHost, note_claim

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from drumsd.core.config import Config
    from drumsd.core.metrics import MetricsWindow
    from drumsd.core.records import CheckpointRecord, SlotRecord
    from drumsd.core.seams import CrashWatchControl
    from drumsd.runtime.gate_evidence import GateEvidence
    from drumsd.runtime.slot_table import SlotTable

log = logging.getLogger("drumsd.supervisor")


class EpisodesHost(SparesHost, Protocol):
    """What an episode's start, gates and timers use of the supervisor (a claim of a warm
    spare is noted in its pool)."""

    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def config(self) -> Config: ...
    @property
    def crash_watch(self) -> CrashWatchControl | None: ...
    @property
    def evidence(self) -> GateEvidence | None: ...
    def gate_statuses(self, rec: SlotRecord) -> dict[str, str]: ...
    @property
    def host_namespaces(self) -> dict[str, int]: ...
    @property
    def metrics(self) -> MetricsWindow: ...
    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None: ...
    @property
    def table(self) -> SlotTable: ...
    @property
    def unwatched(self) -> dict[str, str]: ...
    @property
    def retiring(self) -> set[str]: ...


def set_gate(
    sup: EpisodesHost, rec: SlotRecord, name: str, status: str, evidence: dict[str, Any]
) -> None:
    now = sup.clock()
    for gate in rec.gates:
        if gate.name == name:
            # A failure is final for the episode: later reads must not turn it back to pass.
            if gate.status == G.FAIL and status != G.FAIL:
                return
            gate.status, gate.evidence, gate.checked_at = status, evidence, now
            return
    rec.gates.append(GateEntry(name=name, status=status, evidence=evidence, checked_at=now))


def other_namespaces(sup: EpisodesHost, slot_id: str) -> dict[str, dict[str, int]]:
    """The recorded namespaces of every other slot whose tree is alive (the isolation gate's
    comparison). A slot being torn down or reset, or whose init exited (quarantined, kept until
    destroyed), is left out: the kernel reuses a freed namespace's inode number, so a new slot
    restored meanwhile can get the number its tree had (seen at 8 busy episodes: a valid
    episode quarantined as `mnt: shared with` a slot whose destroy was under way)."""
    out = {}
    for other in sup.slots.values():
        if other.id == slot_id or other.id in sup.retiring:
            continue
        if is_live(other) and other.handle:
            out[other.id] = dict(other.handle.get("namespaces", {}))
    return out


@contextmanager
def retiring(sup: EpisodesHost, slot_id: str) -> Iterator[None]:
    """While the slot's tree is torn down or replaced: its recorded namespaces may be freed, so
    the isolation gate of other slots does not compare with them (`other_namespaces`). Also
    ends the mark `watch_exit` leaves on a slot whose init exited."""
    sup.retiring.add(slot_id)
    try:
        yield
    finally:
        sup.retiring.discard(slot_id)


async def read_facts(
    sup: EpisodesHost, rec: SlotRecord, handle: SlotHandle, *, at_start: bool = False
) -> SlotFacts | None:
    """The runtime's facts with the crash watch's and the evidence module's keys merged into
    `extra` (what the gates judge); `at_start` adds the restored upper layer's hash (state_hash
    is judged once, at episode start)."""
    try:
        facts = await sup.runtime.facts(handle)
    except RuntimeError_ as exc:
        log.warning("slot=%s facts failed: %s", rec.id, exc.message)
        return None
    except OSError as exc:
        log.warning("slot=%s facts failed: %s", rec.id, exc)
        return None
    extra: dict[str, Any] = dict(facts.extra)
    mounts = list(facts.mounts)
    charged = facts.extra.get("memory_mib")
    if isinstance(charged, (int, float)):
        sup.admission_book.charge(rec.id, float(charged))
    if sup.crash_watch is not None:
        since = rec.episode_started_at or 0.0
        extra.update(sup.crash_watch.facts(rec.id, since=since).as_extra())
        if rec.id in sup.unwatched:
            # Not followed: no crash could be seen, so no_app_crash must stay pending.
            extra["crash_watch"] = False
            extra["crash_watch_error"] = sup.unwatched[rec.id]
    if sup.evidence is not None:
        snapshot = written_since = None
        cp = sup.checkpoints.get(rec.checkpoint)
        if at_start and cp is not None and cp.upper_sha256:
            snapshot = Path(cp.dir) / "upper"
            # Files the restored tree writes itself are not a mismatch: anything touched
            # after its restore began. The runtime's wall clock of that start, not "now
            # minus restore_s": a fork restores all its children before their episodes
            # begin, so under load a child's tree has run for seconds by then.
            restored_at = handle.extra.get("restore_started_at")
            written_since = (
                float(restored_at)
                if isinstance(restored_at, (int, float))
                else (rec.episode_started_at or sup.clock()) - handle.restore_s - 1.0
            )
        read = partial(
            sup.evidence.read,
            handle,
            facts,
            profile=rec.profile,
            snapshot=snapshot,
            written_since=written_since,
            caches=image_profiles.state_caches(rec.image),
        )
        try:
            # Abandoned on cancel (a bounded judge's read): reading changes nothing.
            evidence = await trio.to_thread.run_sync(read, abandon_on_cancel=True)
        except Exception as exc:  # evidence must never leave a gate unjudged
            log.warning("slot=%s episode=%s gate evidence failed: %r", rec.id, rec.episode, exc)
            evidence = {"evidence_error": repr(exc)}
        extra.update(evidence)
        if "mounts_normalized" in evidence:
            mounts = list(evidence["mounts_normalized"])
    return dataclasses.replace(facts, mounts=mounts, extra=extra)


def natural_exits(sup: EpisodesHost, rec: SlotRecord) -> list[str]:
    """The process names whose exit alive_after_resume allows on this slot: the daemon's
    natural_exits and those its image's profile declares (image_profiles)."""
    return [*sup.config.natural_exits, *image_profiles.natural_exits(rec.image)]


def expected_limits(sup: EpisodesHost) -> dict[str, Any]:
    c = sup.config
    return {"memory_mib": c.memory_mib, "pids_max": c.pids_max, "vcpus": c.vcpus}


async def begin_episode(
    sup: EpisodesHost, rec: SlotRecord, handle: SlotHandle, event: str, *, file: bool = True
) -> None:
    """A new episode: fresh gate report, start gates judged now, alive_after later."""
    rec.episode += 1
    rec.episode_id = uuid.uuid4().hex
    rec.episode_started_at = sup.clock()
    rec.actions = 0
    rec.last_action = None
    rec.terminal = None
    rec.gates = [GateEntry(name=name) for name in G.GATES]
    rec.quarantined_gates = []
    rec.handle = handle_to_json(handle)
    rec.status = SlotStatus.ready
    note_claim(sup, rec.checkpoint, handle)
    await track(sup, rec.id, handle)
    await after_restore(sup, rec, handle)
    facts = await read_facts(sup, rec, handle, at_start=True)
    if facts is None:
        for name in G.START_GATES:
            set_gate(sup, rec, name, G.FAIL, {"reason": "runtime could not read facts"})
    else:
        names = facts.extra.get("proc_names")
        rec.baseline = {
            # A process gone before its name was read had exited by the start: it is not part
            # of the tree at ready (its exit, nameless, would leave alive_after_resume pending
            # for good). Without names (no evidence reader) every listed pid counts.
            "pids": [p for p in facts.pids if str(p) in names]
            if isinstance(names, dict)
            else list(facts.pids),
            "proc_names": names or {},
            "guest_workers": facts.extra.get("guest_workers", []),
            "display_server": facts.extra.get("display_server"),
            "oom_kills": facts.oom_kills,
            "pids_max_hits": facts.extra.get("pids_max_hits") or 0,
        }
        cp = sup.checkpoints.get(rec.checkpoint)
        judge_start(sup, rec, facts, cp.upper_sha256 if cp else None, handle)
        judge_running(sup, rec, facts)
    set_gate(sup, rec, "not_quarantined", *G.judge_not_quarantined(None))
    if sup.config.alive_after_s == 0 and facts is not None:
        set_gate(
            sup,
            rec,
            "alive_after_resume",
            *G.judge_alive_after_resume(facts, rec.baseline, natural_exits(sup, rec)),
        )
    sup.table.save_slot(rec, event, file=file)
    quarantine_on_failure(sup, rec)
    sup.spawn(judge_alive_after, sup, rec.id, rec.episode_id)
    sup.spawn(watch_exit, sup, rec.id, rec.episode_id, handle)


# The after-restore command's limit: it only emits a signal; the episode does not wait longer.
AFTER_RESTORE_TIMEOUT_S = 5.0


async def after_restore(sup: EpisodesHost, rec: SlotRecord, handle: SlotHandle) -> None:
    """Run the slot's image's after-restore command (image_profiles.Profile.after_restore; the
    osworld image's brings GNOME Shell's clock to the current minute) as the desktop user, before
    the start gates read the tree (its process has exited by then). A failure is logged: the
    desktop is as sound as without the command, so the episode goes on."""
    argv = image_profiles.after_restore(rec.image)
    if not argv:
        return
    try:
        done = await sup.runtime.exec_user(handle, argv, AFTER_RESTORE_TIMEOUT_S)
    except RuntimeError_ as exc:
        log.warning("slot=%s after-restore command %s failed: %s", rec.id, argv[0], exc.message)
        return
    if done.returncode != 0:
        log.warning(
            "slot=%s after-restore command %s exited %d: %s",
            rec.id,
            argv[0],
            done.returncode,
            done.stderr.strip()[-300:],
        )


def judge_start(
    sup: EpisodesHost,
    rec: SlotRecord,
    facts: SlotFacts,
    upper_sha256: str | None,
    handle: SlotHandle,
) -> None:
    expected_mounts = handle.extra.get("expected_mounts")
    host_ns = facts.extra.get("host_namespaces") or sup.host_namespaces
    judged = {
        "lock_applied": G.judge_lock_applied(facts, rec.profile),
        "cgroup": G.judge_cgroup(facts, expected_limits(sup)),
        "init_identity": G.judge_init_identity(facts),
        "mount_table": G.judge_mount_table(facts, expected_mounts),
        "netns": G.judge_netns(facts, host_ns),
        "guest_ready": G.judge_guest_ready(facts),
        "state_hash": G.judge_state_hash(facts, upper_sha256),
        "isolation": G.judge_isolation(facts, host_ns, other_namespaces(sup, rec.id)),
    }
    for name, (status, evidence) in judged.items():
        set_gate(sup, rec, name, status, evidence)


def judge_running(sup: EpisodesHost, rec: SlotRecord, facts: SlotFacts) -> None:
    """Gates that can turn to fail mid-episode, judged whenever facts are read."""
    set_gate(sup, rec, "no_oom_kill", *G.judge_no_oom_kill(facts, rec.baseline))
    set_gate(sup, rec, "no_app_crash", *G.judge_no_app_crash(facts, sup.config.crash_watch))
    if facts.alive:
        held = (rec.baseline or {}).get("display_server")
        now = facts.extra.get("display_server")
        set_gate(sup, rec, "display_server", *G.judge_display_server(now, held))
    if not facts.alive or not facts.init_identity_ok:
        set_gate(sup, rec, "init_identity", *G.judge_init_identity(facts))
    if facts.alive and facts.extra.get("expected_mounts") is not None:
        # A mount added mid-episode (e.g. by a root process in the slot) is a failure too.
        set_gate(sup, rec, "mount_table", *G.judge_mount_table(facts, None))
    # alive_after_resume is judged once, alive_after_s after ready (an agent may close apps
    # later on purpose); only the init's death turns it to fail afterwards.
    if not facts.alive:
        set_gate(
            sup,
            rec,
            "alive_after_resume",
            *G.judge_alive_after_resume(facts, rec.baseline, natural_exits(sup, rec)),
        )


async def check_display(sup: EpisodesHost, rec: SlotRecord, handle: SlotHandle) -> None:
    """At each screenshot and step: does the X server of the episode's start still hold the
    display? One process's fds and the netns's socket table, read in a thread; a replacement
    fails display_server and quarantines the slot at once, not at the next gate refresh."""
    held = (rec.baseline or {}).get("display_server")
    if sup.evidence is None or not held or held.get("pid") is None:
        return
    episode_id = rec.episode_id
    read = partial(sup.evidence.display_server, handle, [int(held["pid"])])
    now = await trio.to_thread.run_sync(read)
    if rec.episode_id != episode_id:
        return
    status, evidence = G.judge_display_server(now, held)
    if status == G.FAIL:
        apply_gate(sup, rec, "display_server", status, evidence)


def apply_gate(
    sup: EpisodesHost, rec: SlotRecord, name: str, status: str, evidence: dict[str, Any]
) -> None:
    """A gate judged outside an operation's save (a check at a step, a timer): set it, save the
    record (the journal write can wait) and quarantine the slot if the gate failed."""
    set_gate(sup, rec, name, status, evidence)
    sup.table.save_slot(rec, "gates", file=False)
    quarantine_on_failure(sup, rec)


def quarantine_on_failure(sup: EpisodesHost, rec: SlotRecord) -> None:
    statuses = sup.gate_statuses(rec)
    # Each failure quarantines once: after a release, the same failure does not re-trigger.
    fresh = {
        name: status
        for name, status in statuses.items()
        if not (status == G.FAIL and name in rec.quarantined_gates)
    }
    evidence = {g.name: g.evidence for g in rec.gates}
    reason = G.quarantine_reason(fresh, evidence)
    if reason and rec.status is SlotStatus.ready:
        rec.quarantined_gates = G.failed_gates(statuses)
        quarantine_slot(sup, rec, reason)


def quarantine_slot(sup: EpisodesHost, rec: SlotRecord, reason: str) -> None:
    rec.status = SlotStatus.quarantined
    rec.quarantine_reason = reason
    set_gate(sup, rec, "not_quarantined", G.FAIL, {"reason": reason})
    sup.metrics.failure("quarantined")
    sup.table.save_slot(rec, "quarantined")
    log.warning("slot=%s episode=%s quarantined: %s", rec.id, rec.episode, reason)


async def refresh_gates(sup: EpisodesHost, rec: SlotRecord) -> None:
    if rec.status not in (SlotStatus.ready, SlotStatus.quarantined) or rec.handle is None:
        return
    facts = await read_facts(sup, rec, handle_of(rec))
    if facts is None:
        return
    before = [(g.name, g.status) for g in rec.gates]
    judge_running(sup, rec, facts)
    if [(g.name, g.status) for g in rec.gates] != before:
        sup.table.save_slot(rec, "gates", file=False)
    quarantine_on_failure(sup, rec)


async def track(sup: EpisodesHost, slot_id: str, handle: SlotHandle) -> None:
    """Point the crash watch at the slot's (new) cgroups; records of earlier episodes stay
    but facts() reads only those since the episode's start."""
    if sup.crash_watch is None:
        return
    try:
        if not handle.cgroups:
            raise ValueError("the runtime reported no cgroups for the slot")
        await sup.crash_watch.track(slot_id, dict(handle.cgroups))
        sup.unwatched.pop(slot_id, None)
    except (OSError, ValueError) as exc:
        # Untracked, its crash_exits would stay empty and no_app_crash would pass unwatched:
        # _facts marks it unwatched instead, so the gate stays pending.
        sup.unwatched[slot_id] = f"cannot track cgroups {dict(handle.cgroups)}: {exc}"
        log.error("slot=%s crash watch %s", slot_id, sup.unwatched[slot_id])


def untrack(sup: EpisodesHost, slot_id: str) -> None:
    sup.unwatched.pop(slot_id, None)
    if sup.crash_watch is not None:
        sup.crash_watch.untrack(slot_id)


# Tries of the alive_after_resume judge's fact read before it judges "could not read facts",
# and how long each may take: a read past it is abandoned and counts as failed, so the gate gets a
# verdict within JUDGE_READ_TRIES * (JUDGE_READ_TIMEOUT_S + 1) s of alive_after_s (f3977615's
# first episode stayed pending for the sweep's 60 s, its judge never reaching a verdict).
JUDGE_READ_TRIES = 3
JUDGE_READ_TIMEOUT_S = 10.0


async def judge_alive_after(sup: EpisodesHost, slot_id: str, episode_id: str) -> None:
    """Judge alive_after_resume once, alive_after_s after ready, from the tree as it is at that
    instant: what was alive at ready against what is alive now. Not under the slot's lock: a
    long first step (or one that restarts the guest's worker) held it for as long as it ran,
    and the judgement then saw the tree after the step, closed apps and all (issue 39, D8).
    Reading facts changes nothing, and the verdict is applied without an await in between, so
    no operation of the slot sees half of it. It must always end with a verdict: a gate left
    pending makes every verify of the episode invalid, so an unexpected error is logged and
    judged as a failed read rather than ending the task silently."""
    await trio.sleep(sup.config.alive_after_s)
    late = 0  # how many of the reads ran out of time
    attempt = 0
    while attempt < JUDGE_READ_TRIES:
        # A capture (a task checkpoint's, right after a create's setup) or a reset marks the
        # slot busy while it holds the tree: judge once it is back, as the same episode or not
        # at all. (A poll: busy ends in several operations, and no event marks it.)
        while (busy := episode_record(sup, slot_id, episode_id)) and busy.status is SlotStatus.busy:  # noqa: ASYNC110
            await trio.sleep(0.2)
        rec = current_episode(sup, slot_id, episode_id)
        if rec is None:
            return
        facts = None
        with trio.move_on_after(JUDGE_READ_TIMEOUT_S) as bound:
            try:
                facts = await read_facts(sup, rec, handle_of(rec))
            except Exception:
                log.exception(
                    "slot=%s episode=%s alive_after_resume: reading facts", slot_id, rec.episode
                )
        if episode_record(sup, slot_id, episode_id) is not rec:
            return  # reset, fork or destroy replaced the tree while it was read
        if rec.status is SlotStatus.busy:
            # Same episode, turned busy while it read: a capture (a task checkpoint's, right
            # after a create's setup) holds the tree. The judge used to return here with no
            # verdict, leaving the gate pending for good (a unit test reproduces it; a first
            # episode whose setup was captured seconds after ready, f3977615's, was left so).
            # Read again once the capture is over.
            log.info(
                "slot=%s episode=%s alive_after_resume: the slot turned busy during the read; "
                "reading again after it",
                slot_id,
                rec.episode,
            )
            continue
        if current_episode(sup, slot_id, episode_id) is not rec:
            return  # destroyed or failed while it was read
        attempt += 1
        if bound.cancelled_caught:
            late += 1
        if facts is None and attempt < JUDGE_READ_TRIES:
            log.warning(
                "slot=%s episode=%s alive_after_resume: facts %s (try %d of %d)",
                slot_id,
                rec.episode,
                f"not read within {JUDGE_READ_TIMEOUT_S:g} s"
                if bound.cancelled_caught
                else "unreadable",
                attempt,
                JUDGE_READ_TRIES,
            )
            await trio.sleep(1.0)
            continue
        if facts is None:
            status, evidence = G.FAIL, unread_facts(late)
        else:
            judge_running(sup, rec, facts)
            status, evidence = G.judge_alive_after_resume(
                facts, rec.baseline, natural_exits(sup, rec)
            )
        apply_gate(sup, rec, "alive_after_resume", status, evidence)
        return


def unread_facts(late: int) -> dict[str, Any]:
    """The evidence of an alive_after_resume failed because no read of facts succeeded: why."""
    if not late:
        return {"reason": "runtime could not read facts", "tries": JUDGE_READ_TRIES}
    return {
        "reason": f"runtime could not read facts ({late} of {JUDGE_READ_TRIES} reads took over "
        f"{JUDGE_READ_TIMEOUT_S:g} s and were abandoned)",
        "tries": JUDGE_READ_TRIES,
        "timed_out": late,
    }


def episode_record(sup: EpisodesHost, slot_id: str, episode_id: str) -> SlotRecord | None:
    """The slot's record while `episode_id` is its episode (busy or not); else None."""
    rec = sup.slots.get(slot_id)
    return rec if rec is not None and rec.episode_id == episode_id else None


def current_episode(sup: EpisodesHost, slot_id: str, episode_id: str) -> SlotRecord | None:
    """The slot's record while `episode_id` is its live, judged episode; else None."""
    rec = episode_record(sup, slot_id, episode_id)
    if rec is None or rec.handle is None:
        return None
    if rec.status not in (SlotStatus.ready, SlotStatus.quarantined):
        return None
    return rec


async def watch_exit(sup: EpisodesHost, slot_id: str, episode_id: str, handle: SlotHandle) -> None:
    try:
        how = await sup.runtime.wait_exit(handle)
    except RuntimeError_:
        return
    async with sup.table.lock(slot_id):
        rec = current_episode(sup, slot_id, episode_id)
        if rec is None:
            return  # reset, fork or destroy replaced this tree on purpose
        sup.retiring.add(slot_id)  # its namespaces are freed; until its destroy or reset ends
        set_gate(
            sup, rec, "alive_after_resume", G.FAIL, {"reason": "the slot's init exited", "how": how}
        )
        sup.metrics.failure("init_exited")
        if rec.status is SlotStatus.ready:
            quarantine_slot(sup, rec, f"the slot's init exited mid-episode ({how})")  # logs it
        else:
            sup.table.save_slot(rec, "gates")
            log.warning(
                "slot=%s episode=%s init exited (already quarantined): %s",
                slot_id,
                rec.episode,
                how,
            )


def finish_episode(sup: EpisodesHost, rec: SlotRecord) -> None:
    if rec.episode <= 0 or not rec.episode_id:
        return
    verdict = G.verdict(sup.gate_statuses(rec), rec.status is SlotStatus.quarantined)
    rec.verdicts.append(verdict)
    sup.metrics.episode_finished(verdict)
