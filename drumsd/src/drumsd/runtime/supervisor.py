"""The slot supervisor: every slot and checkpoint operation, in trio, over a SlotRuntime.

Each operation is refresh -> check -> effect -> save: the record is written to the journal before
the runtime starts work, so a daemon killed at any moment leaves a record that the next start
reconciles (adopt the live, clean the dead). Background work (reaper, admission sampler, gate
timers, exit watchers, template builds) runs in the supervisor's own nursery, never the web app's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import secrets
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import trio
from drums.models import (
    BranchRequest,
    CaptureRequest,
    CheckpointAdopt,
    PreforkRequest,
    QuiescentRequest,
    SlotCreate,
    StepRequest,
    TaskInfo,
    VerifyRequest,
    VerifyResult,
)

from drumsd.core import gates as G
from drumsd.core.admission import (
    Decision,
    HostSample,
    decide,
    slot_cost_mib,
    state_space_warnings,
)
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.journal import JournalState, snapshot_events
from drumsd.core.leases import (
    expired_checkpoints,
    expired_slots,
    prefork_reusable,
    slot_lease,
    stale_tombstones,
    state_lease,
)
from drumsd.core.metrics import Histogram, MetricsWindow
from drumsd.core.records import (
    CheckpointKind,
    CheckpointRecord,
    GateEntry,
    SlotRecord,
    SlotStatus,
    check_can_capture,
    check_can_fork,
    check_can_observe,
    check_can_quarantine,
    check_can_release,
    check_can_reset,
    check_can_step,
    check_can_verify,
    check_is_known,
    check_not_destroyed,
    is_live,
)
from drumsd.core.retention import files_to_delete, forgotten_warnings, keep_kind
from drumsd.core.seams import (
    CheckpointRef,
    KsmControl,
    RuntimeError_,
    SlotHandle,
    SlotLimits,
    SlotRuntime,
    SpareControl,
)
from drumsd.core.spare_pool import PoolStats, share_host, spare_target
from drumsd.linux.host_sampler import read_host_namespaces, read_space, sample_host
from drumsd.linux.journal_io import Journal
from drumsd.runtime.forgotten import delete_archives, scan_forgotten, write_forgotten
from drumsd.runtime.gate_evidence import GateEvidence
from drumsd.runtime.verifier import NoTaskCatalog, NoTaskVerifier, TaskCatalog, Verifier

log = logging.getLogger("drumsd.supervisor")

# Which fields an action type needs (beyond `type`); checked before the runtime sees it.
ACTION_REQUIRES: dict[str, tuple[str, ...]] = {
    "pyautogui": ("code",),
    "drag": ("to_x", "to_y"),
    "scroll": ("clicks",),
    "type": ("text",),
    "key": ("key",),
    "hotkey": ("keys",),
    "wait": ("seconds",),
    "execute": ("command",),
}
TERMINAL_ACTIONS = ("done", "fail")
# How often live slots' running gates (crash, OOM, mounts, init) are judged without a request, so
# a failure quarantines the slot mid-episode even when nobody asks for its gates.
GATE_REFRESH_S = 3.0
# How long verify waits, past alive_after_s, for the gate judge to read facts under load.
GATE_JUDGE_S = 5.0
SPARE_SIZING_S = 2.0  # how often pool targets follow the observed claim rate
EVENTS_COMPACT_BYTES = 64 * 1024 * 1024


def handle_to_json(handle: SlotHandle) -> dict[str, Any]:
    data = dataclasses.asdict(handle)
    data["root"] = str(handle.root)
    data["upper"] = str(handle.upper)
    data["cgroups"] = dict(handle.cgroups)
    data["namespaces"] = dict(handle.namespaces)
    data["extra"] = json.loads(json.dumps(dict(handle.extra), default=str))
    return data


def handle_from_json(data: Mapping[str, Any]) -> SlotHandle:
    fields = {f.name for f in dataclasses.fields(SlotHandle)}
    values = {k: v for k, v in data.items() if k in fields}
    values["root"] = Path(values["root"])
    values["upper"] = Path(values["upper"])
    return SlotHandle(**values)


def _new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def _runtime_error(exc: RuntimeError_, slot_id: str | None = None) -> DrumsdError:
    detail = dict(exc.detail)
    if slot_id:
        detail.setdefault("slot", slot_id)
    return DrumsdError(exc.code, exc.message, **detail)


class Supervisor:
    """Owns every record; the API calls its methods, the runtime does the OS work."""

    def __init__(
        self,
        config: Config,
        runtime: SlotRuntime,
        journal: Journal,
        *,
        verifier: Verifier | None = None,
        tasks: TaskCatalog | None = None,
        sampler: Callable[[Path], HostSample] = sample_host,
        host_namespaces: Mapping[str, int] | None = None,
        clock: Callable[[], float] = time.time,
        version: str = "0.1.0",
        crash_watch: Any = None,
        evidence: GateEvidence | None = None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.journal = journal
        self.verifier: Verifier = verifier or NoTaskVerifier()
        self.tasks: TaskCatalog = tasks or NoTaskCatalog()
        self.sampler = sampler
        self.host_namespaces = dict(
            host_namespaces if host_namespaces is not None else read_host_namespaces()
        )
        self.clock = clock
        self.version = version
        # A started `CrashWatch` (track/untrack/facts/health) when config.crash_watch is on.
        self.crash_watch = crash_watch
        self._unwatched: dict[str, str] = {}  # slot id -> why the crash watch cannot follow it
        # Evidence from /proc and the upper layer (the Linux runtime; None for fake desktops).
        self.evidence = evidence
        self.slots: dict[str, SlotRecord] = {}
        self.checkpoints: dict[str, CheckpointRecord] = {}
        self.metrics = MetricsWindow(started_at=clock())
        self.slot_latency: dict[str, dict[str, Histogram]] = {}
        self.last_screenshot: dict[str, bytes] = {}
        self.sample: HostSample | None = None
        self.last_decision: Decision | None = None
        self.template_status: dict[str, str] = {}  # image -> building | ready | error: ...
        self.warnings: list[str] = []
        self.draining = False
        self.reconciled: dict[str, list[str]] = {}
        self._locks: dict[str, trio.Lock] = {}
        self._dirty: set[str] = set()
        self._pending_mib = 0.0
        self._charged_mib: dict[str, float] = {}  # slot -> memory charged to its cgroup, last read
        self._nursery: trio.Nursery | None = None
        self._forgotten_bytes = 0
        # Warm spares (a Linux runtime extra): checkpoints with a pool, what claims looked like.
        self.pool_stats: dict[str, PoolStats] = {}
        self._pool_since: dict[str, float] = {}
        self._pool_targets: dict[str, int] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED):
        """Reconcile, start the reaper, the sampler and template builds; run until cancelled.
        Slots outlive the daemon (the next start adopts them), so stopping destroys nothing."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await self.reconcile()
            await self.sample_now()
            self._spawn(self._sample_loop)
            self._spawn(self._reap_loop)
            self._spawn(self._gate_loop)
            if self._spares_on():
                assert isinstance(self.runtime, SpareControl)
                self.runtime.refill_allowed = self._refill_allowed
                self._spawn(self._spare_sizing_loop)
            self._start_template_builds()
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self._flush_dirty()  # synchronous: runs even while cancelled

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._guarded, fn, *args)

    async def _guarded(self, fn: Callable[..., Any], *args: Any) -> None:
        """A background task's failure is logged; it must never take the supervisor down."""
        try:
            await fn(*args)
        except Exception:
            log.exception("background task %s%r failed", getattr(fn, "__name__", fn), args[:2])

    def _lock(self, slot_id: str) -> trio.Lock:
        return self._locks.setdefault(slot_id, trio.Lock())

    # --- persistence ----------------------------------------------------------------------------

    def _save_slot(self, rec: SlotRecord, event: str, *, file: bool = True) -> None:
        rec.rev += 1
        self.slots[rec.id] = rec
        self.journal.save("slot", rec.model_dump(mode="json"), event, self.clock(), file=file)
        self._dirty.discard(rec.id)
        log.info(
            "slot=%s episode=%s status=%s event=%s", rec.id, rec.episode, rec.status.value, event
        )

    def _save_checkpoint(self, cp: CheckpointRecord, event: str) -> None:
        cp.rev += 1
        self.checkpoints[cp.id] = cp
        self.journal.save("checkpoint", cp.model_dump(mode="json"), event, self.clock())
        log.info("checkpoint=%s kind=%s event=%s", cp.id, cp.kind.value, event)

    def _flush_dirty(self) -> None:
        """Renewals and step counters are saved lazily (not on every step, for latency)."""
        for slot_id in list(self._dirty):
            rec = self.slots.get(slot_id)
            if rec is not None:
                self._save_slot(rec, "touched", file=False)
        self._dirty.clear()

    # --- lookups --------------------------------------------------------------------------------

    def get_slot(self, slot_id: str, *, renew: bool = True) -> SlotRecord:
        rec = check_is_known(self.slots.get(slot_id), slot_id)
        check_not_destroyed(rec)
        if renew and is_live(rec):
            rec.last_used_at = self.clock()
            self._dirty.add(rec.id)
        return rec

    def list_slots(self, include_all: bool = False) -> list[SlotRecord]:
        recs = sorted(self.slots.values(), key=lambda r: r.created_at)
        return recs if include_all else [r for r in recs if is_live(r)]

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        cp = self.checkpoints.get(checkpoint_id)
        if cp is None:
            raise DrumsdError(
                "not_found",
                f"no checkpoint {checkpoint_id!r}; list them with GET /v1/checkpoints",
            )
        return cp

    def list_checkpoints(self) -> list[CheckpointRecord]:
        return sorted(self.checkpoints.values(), key=lambda c: c.created_at)

    def _handle(self, rec: SlotRecord) -> SlotHandle:
        if rec.handle is None:
            raise DrumsdError(
                "conflict", f"slot {rec.id} has no running tree yet; retry shortly", slot=rec.id
            )
        return handle_from_json(rec.handle)

    def _ref(self, cp: CheckpointRecord) -> CheckpointRef:
        return CheckpointRef(
            id=cp.id,
            dir=Path(cp.dir),
            lower=Path(cp.lower),
            image_sha256=cp.image_sha256,
            upper_sha256=cp.upper_sha256,
            profile=cp.profile,
        )

    def _limits(self) -> SlotLimits:
        c = self.config
        return SlotLimits(
            vcpus=c.vcpus,
            memory_mib=c.memory_mib,
            swap_mib=c.swap_mib,
            pids_max=c.pids_max,
            tmpfs_mib=c.tmpfs_mib,
        )

    def _observe(self, operation: str, slot_id: str | None, seconds: float) -> None:
        self.metrics.observe(operation, seconds)
        if slot_id is not None:
            self.slot_latency.setdefault(slot_id, {}).setdefault(operation, Histogram()).observe(
                seconds
            )

    def _check_open(self) -> None:
        if self.draining:
            raise DrumsdError(
                "shutting_down", "drumsd is shutting down; retry against the restarted daemon"
            )

    # --- admission ------------------------------------------------------------------------------

    async def sample_now(self) -> HostSample | None:
        try:
            self.sample = await trio.to_thread.run_sync(self.sampler, self.config.state_dir)
        except OSError as exc:
            log.warning("admission sample failed: %s", exc)
        return self.sample

    async def _sample_loop(self) -> None:
        while True:
            await trio.sleep(self.config.admission.sample_interval_s)
            await self.sample_now()

    def _check_state_space(self, operation: str) -> None:
        """A dump needs room in state_dir; below state_min_free_mib it is refused (507)."""
        free = self.sample.state_free_mib if self.sample else None
        if free is not None and free < self.config.state_min_free_mib:
            self.metrics.failure("state_dir_full")
            raise DrumsdError(
                "state_dir_full",
                f"{operation} refused: state_dir {self.config.state_dir} has {free:.0f} MiB free,"
                f" below state_min_free_mib={self.config.state_min_free_mib}; delete saved states"
                " (DELETE /v1/checkpoints/{id}) or destroy slots",
                free_mib=free,
            )

    def slot_cost_mib(self) -> float:
        """Admission's cost of one more slot: the real, KSM-merged charge of the live slots."""
        live = [
            self._charged_mib[i]
            for i, r in self.slots.items()
            if i in self._charged_mib and r.status in (SlotStatus.ready, SlotStatus.quarantined)
        ]
        return slot_cost_mib(self.config.admission.env_mib, live)

    def _admit(self, operation: str, cost_mib: float) -> None:
        decision = decide(
            self.sample, self.config.admission, cost_mib, pending_mib=self._pending_mib
        )
        self.last_decision = decision
        if not decision.admit:
            self.metrics.failure("overloaded")
            raise DrumsdError(
                "overloaded",
                f"{operation} refused: {decision.reason}",
                retry_after_s=decision.retry_after_s,
                limit=decision.limit,
            )

    # --- checkpoints resolution -----------------------------------------------------------------

    def _resolve_source(self, req: SlotCreate) -> CheckpointRecord:
        if req.image and req.from_state:
            raise DrumsdError(
                "invalid_request", "give either image or from_state, not both", field="image"
            )
        cp: CheckpointRecord | None
        if req.from_state:
            cp = self.get_checkpoint(req.from_state)
        else:
            name = req.image or self.config.default_image
            cp = self.checkpoints.get(name) or self._template_for(name)
            if cp is None:
                status = self.template_status.get(name)
                if status == "building":
                    raise DrumsdError(
                        "runtime_error",
                        f"the template checkpoint of image {name!r} is being built; retry soon",
                        retry_after_s=10.0,
                    )
                raise DrumsdError(
                    "not_found",
                    f"no template checkpoint for image {name!r}"
                    + (f" ({status})" if status else "")
                    + f"; build it with `drumsd image build --profile {name}` and restart, "
                    "or name a saved state with from_state",
                    image=name,
                )
        if not cp.ready:
            raise DrumsdError(
                "conflict", f"checkpoint {cp.id} is still being written; retry shortly"
            )
        return cp

    def _template_for(self, image: str) -> CheckpointRecord | None:
        found = [
            cp
            for cp in self.checkpoints.values()
            if cp.kind is CheckpointKind.template and cp.image == image and cp.ready
        ]
        return max(found, key=lambda c: c.created_at) if found else None

    def _referenced_checkpoints(self) -> set[str]:
        return {
            s.checkpoint for s in self.slots.values() if is_live(s) or s.status is SlotStatus.failed
        }

    # --- episodes and gates ---------------------------------------------------------------------

    def _set_gate(self, rec: SlotRecord, name: str, status: str, evidence: dict[str, Any]) -> None:
        now = self.clock()
        for gate in rec.gates:
            if gate.name == name:
                # A failure is final for the episode: later reads must not turn it back to pass.
                if gate.status == G.FAIL and status != G.FAIL:
                    return
                gate.status, gate.evidence, gate.checked_at = status, evidence, now
                return
        rec.gates.append(GateEntry(name=name, status=status, evidence=evidence, checked_at=now))

    def gate_statuses(self, rec: SlotRecord) -> dict[str, str]:
        return {g.name: g.status for g in rec.gates}

    def _other_namespaces(self, slot_id: str) -> dict[str, dict[str, int]]:
        out = {}
        for other in self.slots.values():
            if other.id != slot_id and is_live(other) and other.handle:
                out[other.id] = dict(other.handle.get("namespaces", {}))
        return out

    async def _facts(
        self, rec: SlotRecord, handle: SlotHandle, *, at_start: bool = False
    ) -> dict[str, Any] | None:
        """The runtime's facts plus the crash watch's and the evidence module's; `at_start` adds
        the restored upper layer's hash (state_hash is judged once, at episode start)."""
        try:
            facts = await self.runtime.facts(handle)
        except RuntimeError_ as exc:
            log.warning("slot=%s facts failed: %s", rec.id, exc.message)
            return None
        except OSError as exc:
            log.warning("slot=%s facts failed: %s", rec.id, exc)
            return None
        out: dict[str, Any] = {
            "alive": facts.alive,
            "init_identity_ok": facts.init_identity_ok,
            "limits_in_force": dict(facts.limits_in_force),
            "mounts": list(facts.mounts),
            "net_links": list(facts.net_links),
            "namespaces": dict(facts.namespaces),
            "oom_kills": facts.oom_kills,
            "pids": list(facts.pids),
            "extra": dict(facts.extra),
        }
        charged = facts.extra.get("memory_mib")
        if isinstance(charged, (int, float)):
            self._charged_mib[rec.id] = float(charged)
        if self.crash_watch is not None:
            since = rec.episode_started_at or 0.0
            out["extra"].update(self.crash_watch.facts(rec.id, since=since))
            if rec.id in self._unwatched:
                # Not followed: no crash could be seen, so no_app_crash must stay pending.
                out["extra"]["crash_watch"] = False
                out["extra"]["crash_watch_error"] = self._unwatched[rec.id]
        if self.evidence is not None:
            snapshot = written_since = None
            cp = self.checkpoints.get(rec.checkpoint)
            if at_start and cp is not None and cp.upper_sha256:
                snapshot = Path(cp.dir) / "upper"
                # Files the restored tree writes itself are not a mismatch: anything touched
                # after its restore began. The runtime's wall clock of that start, not "now
                # minus restore_s": a branch restores all its children before their episodes
                # begin, so under load a child's tree has run for seconds by then.
                restored_at = handle.extra.get("restore_started_at")
                written_since = (
                    float(restored_at)
                    if isinstance(restored_at, (int, float))
                    else (rec.episode_started_at or self.clock()) - handle.restore_s - 1.0
                )
            read = partial(
                self.evidence.read,
                handle,
                out,
                profile=rec.profile,
                snapshot=snapshot,
                written_since=written_since,
            )
            try:
                extra = await trio.to_thread.run_sync(read)
            except OSError as exc:
                log.warning("slot=%s gate evidence failed: %s", rec.id, exc)
                extra = {"evidence_error": str(exc)}
            out["extra"].update(extra)
            if "mounts_normalized" in extra:
                out["mounts"] = extra["mounts_normalized"]
        return out

    def _expected_limits(self) -> dict[str, Any]:
        c = self.config
        return {"memory_mib": c.memory_mib, "pids_max": c.pids_max, "vcpus": c.vcpus}

    async def _begin_episode(
        self, rec: SlotRecord, handle: SlotHandle, event: str, *, file: bool = True
    ) -> None:
        """A new episode: fresh gate report, start gates judged now, alive_after later."""
        rec.episode += 1
        rec.episode_id = uuid.uuid4().hex
        rec.episode_started_at = self.clock()
        rec.actions = 0
        rec.last_action = None
        rec.terminal = None
        rec.gates = [GateEntry(name=name) for name in G.GATES]
        rec.quarantined_gates = []
        rec.handle = handle_to_json(handle)
        rec.status = SlotStatus.ready
        self._note_claim(rec.checkpoint, handle)
        self._track(rec.id, handle)
        facts = await self._facts(rec, handle, at_start=True)
        if facts is None:
            for name in G.START_GATES:
                self._set_gate(rec, name, G.FAIL, {"reason": "runtime could not read facts"})
        else:
            rec.baseline = {
                "pids": facts["pids"],
                "proc_names": facts["extra"].get("proc_names", {}),
                "oom_kills": facts["oom_kills"],
            }
            cp = self.checkpoints.get(rec.checkpoint)
            self._judge_start(rec, facts, cp.upper_sha256 if cp else None, handle)
            self._judge_running(rec, facts)
        self._set_gate(rec, "not_quarantined", *G.judge_not_quarantined(None))
        if self.config.alive_after_s == 0 and facts is not None:
            self._set_gate(
                rec,
                "alive_after_resume",
                *G.judge_alive_after_resume(facts, rec.baseline, self.config.natural_exits),
            )
        self._save_slot(rec, event, file=file)
        self._quarantine_on_failure(rec)
        self._spawn(self._judge_alive_after, rec.id, rec.episode_id)
        self._spawn(self._watch_exit, rec.id, rec.episode_id, handle)

    def _judge_start(
        self, rec: SlotRecord, facts: dict[str, Any], upper_sha256: str | None, handle: SlotHandle
    ) -> None:
        expected_mounts = handle.extra.get("expected_mounts")
        host_ns = facts["extra"].get("host_namespaces") or self.host_namespaces
        judged = {
            "lock_applied": G.judge_lock_applied(facts, rec.profile),
            "cgroup": G.judge_cgroup(facts, self._expected_limits()),
            "init_identity": G.judge_init_identity(facts),
            "mount_table": G.judge_mount_table(facts, expected_mounts),
            "netns": G.judge_netns(facts, host_ns),
            "guest_ready": G.judge_guest_ready(facts),
            "state_hash": G.judge_state_hash(facts, upper_sha256),
            "isolation": G.judge_isolation(facts, host_ns, self._other_namespaces(rec.id)),
        }
        for name, (status, evidence) in judged.items():
            self._set_gate(rec, name, status, evidence)

    def _judge_running(self, rec: SlotRecord, facts: dict[str, Any]) -> None:
        """Gates that can turn to fail mid-episode, judged whenever facts are read."""
        self._set_gate(rec, "no_oom_kill", *G.judge_no_oom_kill(facts, rec.baseline))
        self._set_gate(rec, "no_app_crash", *G.judge_no_app_crash(facts, self.config.crash_watch))
        if not facts["alive"] or not facts["init_identity_ok"]:
            self._set_gate(rec, "init_identity", *G.judge_init_identity(facts))
        if facts["alive"] and facts["extra"].get("expected_mounts") is not None:
            # A mount added mid-episode (e.g. by a root process in the slot) is a failure too.
            self._set_gate(rec, "mount_table", *G.judge_mount_table(facts, None))
        # alive_after_resume is judged once, alive_after_s after ready (an agent may close apps
        # later on purpose); only the init's death turns it to fail afterwards.
        if not facts["alive"]:
            self._set_gate(
                rec,
                "alive_after_resume",
                *G.judge_alive_after_resume(facts, rec.baseline, self.config.natural_exits),
            )

    def _quarantine_on_failure(self, rec: SlotRecord) -> None:
        statuses = self.gate_statuses(rec)
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
            self._quarantine(rec, reason)

    def _quarantine(self, rec: SlotRecord, reason: str) -> None:
        rec.status = SlotStatus.quarantined
        rec.quarantine_reason = reason
        self._set_gate(rec, "not_quarantined", G.FAIL, {"reason": reason})
        self.metrics.failure("quarantined")
        self._save_slot(rec, "quarantined")
        log.warning("slot=%s episode=%s quarantined: %s", rec.id, rec.episode, reason)

    async def refresh_gates(self, rec: SlotRecord) -> None:
        if rec.status not in (SlotStatus.ready, SlotStatus.quarantined) or rec.handle is None:
            return
        facts = await self._facts(rec, self._handle(rec))
        if facts is None:
            return
        before = [(g.name, g.status) for g in rec.gates]
        self._judge_running(rec, facts)
        if [(g.name, g.status) for g in rec.gates] != before:
            self._save_slot(rec, "gates", file=False)
        self._quarantine_on_failure(rec)

    def _track(self, slot_id: str, handle: SlotHandle) -> None:
        """Point the crash watch at the slot's (new) cgroups; records of earlier episodes stay
        but facts() reads only those since the episode's start."""
        if self.crash_watch is None:
            return
        try:
            if not handle.cgroups:
                raise ValueError("the runtime reported no cgroups for the slot")
            self.crash_watch.track(slot_id, dict(handle.cgroups))
            self._unwatched.pop(slot_id, None)
        except (OSError, ValueError) as exc:
            # Untracked, its crash_exits would stay empty and no_app_crash would pass unwatched:
            # _facts marks it unwatched instead, so the gate stays pending.
            self._unwatched[slot_id] = f"cannot track cgroups {dict(handle.cgroups)}: {exc}"
            log.error("slot=%s crash watch %s", slot_id, self._unwatched[slot_id])

    def _untrack(self, slot_id: str) -> None:
        self._unwatched.pop(slot_id, None)
        if self.crash_watch is not None:
            self.crash_watch.untrack(slot_id)

    async def _gate_loop(self) -> None:
        while True:
            await trio.sleep(GATE_REFRESH_S)
            for slot_id in [r.id for r in self.slots.values() if r.status is SlotStatus.ready]:
                lock = self._lock(slot_id)
                if lock.locked():
                    continue  # a request holds it (and refreshes gates itself when it matters)
                async with lock:
                    rec = self.slots.get(slot_id)
                    if rec is not None and rec.status is SlotStatus.ready:
                        await self.refresh_gates(rec)

    async def _judge_alive_after(self, slot_id: str, episode_id: str) -> None:
        await trio.sleep(self.config.alive_after_s)
        async with self._lock(slot_id):
            rec = self.slots.get(slot_id)
            if rec is None or rec.episode_id != episode_id or rec.handle is None:
                return
            if rec.status not in (SlotStatus.ready, SlotStatus.quarantined):
                return
            facts = await self._facts(rec, self._handle(rec))
            if facts is None:
                status, evidence = G.FAIL, {"reason": "runtime could not read facts"}
            else:
                self._judge_running(rec, facts)
                status, evidence = G.judge_alive_after_resume(
                    facts, rec.baseline, self.config.natural_exits
                )
            self._set_gate(rec, "alive_after_resume", status, evidence)
            self._save_slot(rec, "gates", file=False)
            self._quarantine_on_failure(rec)

    async def _watch_exit(self, slot_id: str, episode_id: str, handle: SlotHandle) -> None:
        try:
            await self.runtime.wait_exit(handle)
        except RuntimeError_:
            return
        async with self._lock(slot_id):
            rec = self.slots.get(slot_id)
            if rec is None or rec.episode_id != episode_id:
                return  # reset, branch or destroy replaced this tree on purpose
            if rec.status not in (SlotStatus.ready, SlotStatus.quarantined):
                return
            self._set_gate(rec, "alive_after_resume", G.FAIL, {"reason": "the slot's init exited"})
            self.metrics.failure("init_exited")
            if rec.status is SlotStatus.ready:
                self._quarantine(rec, "the slot's init exited mid-episode")
            else:
                self._save_slot(rec, "gates")

    def _finish_episode(self, rec: SlotRecord) -> None:
        if rec.episode <= 0 or not rec.episode_id:
            return
        verdict = G.verdict(self.gate_statuses(rec), rec.status is SlotStatus.quarantined)
        rec.verdicts.append(verdict)
        self.metrics.episode_finished(verdict)

    # --- create ---------------------------------------------------------------------------------

    async def create(self, req: SlotCreate) -> SlotRecord:
        self._check_open()
        cp = self._resolve_source(req)
        self._admit("create", self.slot_cost_mib())
        now = self.clock()
        lease = slot_lease(self.config, req.idle_timeout_s, req.ttl_s)
        rec = SlotRecord(
            id=_new_id("s"),
            created_at=now,
            last_used_at=now,
            idle_timeout_s=lease.idle_timeout_s,
            ttl_s=lease.ttl_s,
            checkpoint=cp.id,
            image=cp.image,
            profile=self.config.profile,
            labels=dict(req.labels),
            task_id=cp.task_id,
            task=cp.task,
        )
        if cp.kind is not CheckpointKind.template:
            cp.last_used_at = now
            self._save_checkpoint(cp, "used")
        started = time.monotonic()
        async with self._lock(rec.id):
            self._save_slot(rec, "created")  # before any work: a crash now is reconciled
            handle = await self._restore_new(rec, cp)
            await self._begin_episode(rec, handle, "ready")
            self._observe("create", rec.id, time.monotonic() - started)
            if req.task is not None:
                await self._load_task(rec, handle, req.task, destroy_on_error=True)
        return rec

    async def _restore_new(self, rec: SlotRecord, cp: CheckpointRecord) -> SlotHandle:
        cost = self.slot_cost_mib()
        self._pending_mib += cost
        try:
            return await self.runtime.restore(rec.id, self._ref(cp), self._limits())
        except RuntimeError_ as exc:
            self.metrics.failure(exc.code)
            with trio.CancelScope(shield=True):
                await self._discard(rec, f"{exc.code}: {exc.message}")
            raise _runtime_error(exc, rec.id) from exc
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._discard(rec, "create was cancelled")
            raise
        finally:
            self._pending_mib -= cost

    async def _discard(self, rec: SlotRecord, failure: str) -> None:
        """A slot that never became ready: clean the runtime side, keep a full archive."""
        rec.failure = failure
        try:
            with trio.move_on_after(60):
                await self.runtime.destroy(rec.id)
        except RuntimeError_ as exc:
            log.error("slot=%s cleanup after failure failed: %s", rec.id, exc.message)
        self._untrack(rec.id)
        rec.status = SlotStatus.destroyed
        rec.destroyed_at = self.clock()
        self._save_slot(rec, "rejected")
        await self._archive(rec)

    async def _load_task(
        self,
        rec: SlotRecord,
        handle: SlotHandle,
        task: str | dict[str, Any],
        *,
        destroy_on_error: bool = False,
    ) -> TaskInfo:
        started = time.monotonic()
        try:
            info, task_json = await self.tasks.load(rec, handle, task)
        except DrumsdError:
            if destroy_on_error:
                with trio.CancelScope(shield=True):
                    await self._destroy_locked(rec, "task setup failed", rejected=True)
            raise
        rec.task_id = info.id
        rec.task = task_json
        self._save_slot(rec, "task_loaded")
        self._observe("task_setup", rec.id, time.monotonic() - started)
        return info

    # --- reset / destroy ------------------------------------------------------------------------

    async def reset(self, slot_id: str) -> SlotRecord:
        self._check_open()
        rec = self.get_slot(slot_id)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_reset(rec)
            cp = self.get_checkpoint(rec.checkpoint)
            old = self._handle(rec)
            self._finish_episode(rec)
            # Busy in memory only: after a crash mid-reset the journal still names the old tree,
            # which adopt() finds gone, so the slot is marked down and cleaned.
            rec.status = SlotStatus.busy
            started = time.monotonic()
            try:
                handle = await self.runtime.reset(old, self._ref(cp), self._limits())
            except RuntimeError_ as exc:
                self.metrics.failure(exc.code)
                rec.status = SlotStatus.failed
                rec.failure = f"reset: {exc.code}: {exc.message}"
                self._save_slot(rec, "failed")
                raise _runtime_error(exc, slot_id) from exc
            except BaseException:
                rec.status = SlotStatus.failed
                rec.failure = "reset was cancelled midway"
                self._save_slot(rec, "failed")
                raise
            await self._begin_episode(rec, handle, "reset", file=False)
            self._observe("reset", slot_id, time.monotonic() - started)
            if rec.task is not None and rec.status is SlotStatus.ready:
                await self._load_task(rec, handle, rec.task)
        return rec

    async def destroy(self, slot_id: str, reason: str = "api") -> tuple[SlotRecord, bool]:
        """Idempotent: (record, already_destroyed)."""
        rec = check_is_known(self.slots.get(slot_id), slot_id)
        if rec.status is SlotStatus.destroyed:
            return rec, True
        with trio.CancelScope(shield=True):  # a half-done destroy would leak a desktop
            async with self._lock(slot_id):
                if rec.status is SlotStatus.destroyed:
                    return rec, True
                await self._destroy_locked(rec, reason)
        return rec, False

    async def _destroy_locked(self, rec: SlotRecord, reason: str, rejected: bool = False) -> None:
        if rec.status is not SlotStatus.failed:
            self._finish_episode(rec)
        if rejected:
            rec.failure = rec.failure or reason
        try:
            with trio.move_on_after(120):
                await self.runtime.destroy(rec.id)
        except RuntimeError_ as exc:
            log.error("slot=%s destroy failed: %s; the next start sweeps it", rec.id, exc.message)
        self._untrack(rec.id)
        rec.status = SlotStatus.destroyed
        rec.destroyed_at = self.clock()
        self._save_slot(rec, f"destroyed ({reason})")
        await self._archive(rec)
        self.last_screenshot.pop(rec.id, None)
        self.slot_latency.pop(rec.id, None)
        self._charged_mib.pop(rec.id, None)
        self._dirty.discard(rec.id)
        # Preforks of this slot are no use to anyone once no child restores from them.
        referenced = self._referenced_checkpoints()
        for cp in list(self.checkpoints.values()):
            if (
                cp.kind is CheckpointKind.prefork
                and cp.source_slot == rec.id
                and cp.id not in referenced
            ):
                await self._delete_checkpoint(cp, "source slot destroyed")

    async def _archive(self, rec: SlotRecord) -> None:
        kind = keep_kind(rec, self.config.retention.mode)
        record = rec.model_dump(mode="json")
        gate_report = {
            "episode": rec.episode,
            "gates": [g.model_dump(mode="json") for g in rec.gates],
        }
        screenshot = self.last_screenshot.get(rec.id)
        logs = [str(p) for p in (rec.handle or {}).get("extra", {}).get("log_files", [])]
        events = await trio.to_thread.run_sync(self.journal.events_of, rec.id)
        try:
            await trio.to_thread.run_sync(
                write_forgotten,
                self.config.forgotten_dir,
                kind,
                record,
                events,
                gate_report,
                screenshot,
                logs,
            )
        except (OSError, RuntimeError) as exc:
            log.error("slot=%s could not write its archive to forgotten_dir: %s", rec.id, exc)

    # --- step / observe -------------------------------------------------------------------------

    async def step(self, slot_id: str, req: StepRequest) -> dict[str, Any]:
        self._check_open()
        self.get_slot(slot_id)
        action = self._action_dict(req)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_step(rec)
            handle = self._handle(rec)
            started = time.monotonic()
            kind = action["type"]
            output = None
            if kind in TERMINAL_ACTIONS:
                rec.terminal = kind
            elif kind == "wait":
                await trio.sleep(float(action["seconds"]))
            else:
                try:
                    timeout = float(action.get("timeout") or 120.0)
                    with trio.fail_after(timeout + 5):
                        outcome = await self.runtime.step(handle, action)
                except trio.TooSlowError:
                    self.metrics.failure("step_timeout")
                    raise DrumsdError(
                        "timeout", f"step on slot {slot_id} took longer than {timeout:g}s"
                    ) from None
                except RuntimeError_ as exc:
                    self.metrics.failure(exc.code)
                    raise _runtime_error(exc, slot_id) from exc
                if outcome.output is not None:
                    output = dataclasses.asdict(outcome.output)
            rec.actions += 1
            rec.last_action = kind
            if kind in TERMINAL_ACTIONS:
                self._save_slot(rec, f"terminal_{kind}", file=False)
            else:
                self._dirty.add(rec.id)
            elapsed = time.monotonic() - started
            self._observe("step", slot_id, elapsed)
            png = None
            if req.screenshot:
                png = await self._screenshot_locked(rec, handle)
            return {
                "slot": slot_id,
                "episode": rec.episode,
                "action_type": kind,
                "elapsed_s": elapsed,
                "actions": rec.actions,
                "terminal": rec.terminal if kind in TERMINAL_ACTIONS else None,
                "output": output,
                "screenshot_png": png,
            }

    def _action_dict(self, req: StepRequest) -> dict[str, Any]:
        if isinstance(req.action, str):
            if not req.action.strip():
                raise DrumsdError("invalid_request", "action: empty pyautogui code", field="action")
            return {"type": "pyautogui", "code": req.action}
        action = req.action.model_dump(exclude_none=True)
        # The wire says timeout_s, like every API duration; the guest protocol says timeout.
        if "timeout_s" in action:
            action["timeout"] = action.pop("timeout_s")
        missing = [f for f in ACTION_REQUIRES.get(action["type"], ()) if f not in action]
        if action["type"] in ("click", "double_click", "right_click", "move") and (
            ("x" in action) != ("y" in action)
        ):
            missing.append("x and y together")
        if missing:
            raise DrumsdError(
                "invalid_request",
                f"action {action['type']!r} needs {', '.join(missing)}",
                field="action",
                missing=missing,
            )
        return action

    async def screenshot(self, slot_id: str) -> bytes:
        self.get_slot(slot_id)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_observe(rec)
            return await self._screenshot_locked(rec, self._handle(rec))

    async def _screenshot_locked(self, rec: SlotRecord, handle: SlotHandle) -> bytes:
        started = time.monotonic()
        try:
            png = await self.runtime.screenshot(handle)
        except RuntimeError_ as exc:
            self.metrics.failure(exc.code)
            raise _runtime_error(exc, rec.id) from exc
        self._observe("screenshot", rec.id, time.monotonic() - started)
        self.last_screenshot[rec.id] = png
        return png

    # --- capture / prefork / branch -------------------------------------------------------------

    async def capture(self, slot_id: str, req: CaptureRequest) -> CheckpointRecord:
        self._check_open()
        self.get_slot(slot_id)
        self._check_state_space("capture")
        self._admit("capture", self.config.admission.capture_mib)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_capture(rec)
            lease = state_lease(self.config, CheckpointKind.saved, req.idle_timeout_s, req.ttl_s)
            cp = await self._dump(rec, CheckpointKind.saved, lease.idle_timeout_s, lease.ttl_s)
            return cp

    async def prefork(self, slot_id: str, req: PreforkRequest) -> CheckpointRecord:
        self._check_open()
        rec = self.get_slot(slot_id)
        reusable = self._reusable_prefork(rec)
        if reusable is not None:
            return reusable
        self._check_state_space("prefork")
        self._admit("prefork", self.config.admission.capture_mib)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_capture(rec)
            reusable = self._reusable_prefork(rec)
            if reusable is not None:
                return reusable
            lease = state_lease(self.config, CheckpointKind.prefork, req.idle_timeout_s, None)
            return await self._dump(rec, CheckpointKind.prefork, lease.idle_timeout_s, lease.ttl_s)

    def _reusable_prefork(self, rec: SlotRecord) -> CheckpointRecord | None:
        now = self.clock()
        found = [
            cp
            for cp in self.checkpoints.values()
            if prefork_reusable(cp, rec, now, self.config.prefork_max_age_s)
        ]
        return max(found, key=lambda c: c.created_at) if found else None

    async def _dump(
        self,
        rec: SlotRecord,
        kind: CheckpointKind,
        idle_timeout_s: float | None,
        ttl_s: float | None,
    ) -> CheckpointRecord:
        handle = self._handle(rec)
        now = self.clock()
        prefix = {"saved": "st", "prefork": "pf", "template": "tpl"}[kind.value]
        cp_id = _new_id(prefix)
        dest = self.config.state_dir / "checkpoints" / cp_id
        source = self.checkpoints.get(rec.checkpoint)
        cp = CheckpointRecord(
            id=cp_id,
            kind=kind,
            created_at=now,
            last_used_at=now,
            idle_timeout_s=idle_timeout_s,
            ttl_s=ttl_s,
            dir=str(dest),
            lower=source.lower if source else "",
            image=rec.image,
            image_sha256=source.image_sha256 if source else "",
            source_slot=rec.id,
            source_episode=rec.episode,
            source_actions=rec.actions,
            task_id=rec.task_id,
            task=rec.task,
            profile=rec.profile,
        )
        self._save_checkpoint(cp, "dumping")  # before work: a crash leaves a record to clean
        rec.status = SlotStatus.busy
        started = time.monotonic()
        self._pending_mib += self.config.admission.capture_mib
        try:
            ref = await self.runtime.capture(handle, cp_id, dest)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                rec.status = SlotStatus.ready
                await self._delete_checkpoint(cp, "dump failed")
            if isinstance(exc, RuntimeError_):
                self.metrics.failure(exc.code)
                raise _runtime_error(exc, rec.id) from exc
            raise
        finally:
            self._pending_mib -= self.config.admission.capture_mib
            if rec.status is SlotStatus.busy:
                rec.status = SlotStatus.ready
        cp.upper_sha256 = ref.upper_sha256
        cp.image_sha256 = ref.image_sha256 or cp.image_sha256
        cp.lower = str(ref.lower)
        cp.size_mib = await trio.to_thread.run_sync(_dir_size_mib, dest)
        cp.ready = True
        self._save_checkpoint(cp, "ready")
        if kind is CheckpointKind.prefork:
            self._enable_spares(cp)  # a prefork is captured to be branched: make that a thaw
        self._observe(
            "capture" if kind is CheckpointKind.saved else "prefork",
            rec.id,
            time.monotonic() - started,
        )
        return cp

    async def branch(self, slot_id: str, req: BranchRequest) -> dict[str, Any]:
        self._check_open()
        rec = self.get_slot(slot_id)
        started = time.monotonic()
        source = None
        if req.prefork is not None:
            source = self.get_checkpoint(req.prefork)
            if source.kind is CheckpointKind.template or not source.ready:
                raise DrumsdError(
                    "invalid_request",
                    f"checkpoint {source.id} is a {source.kind.value}, not a ready prefork or "
                    "saved state of this slot",
                    field="prefork",
                )
        else:
            source = self._reusable_prefork(rec)
        children_cost = self.slot_cost_mib() * req.n
        cost = children_cost
        if source is None:
            cost += self.config.admission.capture_mib
            self._check_state_space("branch")
        self._admit("branch", cost)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_fork(rec)
            if source is None:
                source = self._reusable_prefork(rec)
            if source is None:
                lease = state_lease(self.config, CheckpointKind.prefork, None, None)
                source = await self._dump(
                    rec, CheckpointKind.prefork, lease.idle_timeout_s, lease.ttl_s
                )
            now = self.clock()
            lease = slot_lease(self.config, req.idle_timeout_s, req.ttl_s)
            children = []
            for _ in range(req.n):
                child = SlotRecord(
                    id=_new_id("s"),
                    created_at=now,
                    last_used_at=now,
                    idle_timeout_s=lease.idle_timeout_s,
                    ttl_s=lease.ttl_s,
                    checkpoint=source.id,
                    image=rec.image,
                    parent=rec.id,
                    profile=rec.profile,
                    labels=dict(rec.labels),
                    task_id=rec.task_id,
                    task=rec.task,
                )
                self._save_slot(child, "created")
                children.append(child)
            source.last_used_at = now
            self._save_checkpoint(source, "used")
            self._pending_mib += children_cost
            try:
                handles = await self.runtime.branch(
                    self._handle(rec), self._ref(source), [c.id for c in children], self._limits()
                )
            except BaseException as exc:
                with trio.CancelScope(shield=True):
                    why = (
                        f"{exc.code}: {exc.message}"
                        if isinstance(exc, RuntimeError_)
                        else "branch was cancelled"
                    )
                    for child in children:
                        await self._discard(child, why)
                if isinstance(exc, RuntimeError_):
                    self.metrics.failure(exc.code)
                    raise _runtime_error(exc, slot_id) from exc
                raise
            finally:
                self._pending_mib -= children_cost
        # The children start their episodes at once: each start reads its gate evidence (a hash
        # of its whole upper), and one after another the last child's episode began seconds
        # after its desktop was restored and running.
        async with trio.open_nursery() as nursery:
            for child, handle in zip(children, handles, strict=True):
                nursery.start_soon(self._begin_child_episode, child, handle)
        elapsed = time.monotonic() - started
        self._observe("fork", slot_id, elapsed)
        return {
            "parent": slot_id,
            "children": children,
            "checkpoint": source.id,
            "elapsed_s": elapsed,
        }

    async def _begin_child_episode(self, child: SlotRecord, handle: SlotHandle) -> None:
        async with self._lock(child.id):
            await self._begin_episode(child, handle, "ready")

    # --- quiescent / tasks / verify -------------------------------------------------------------

    async def quiescent(self, slot_id: str, req: QuiescentRequest) -> dict[str, Any]:
        self.get_slot(slot_id)
        q = self.config.quiesce
        window = req.window_s or q.window_s
        timeout = req.timeout_s or q.timeout_s
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_step(rec)
            started = time.monotonic()
            try:
                with trio.fail_after(timeout + 10):
                    quiet = await self.runtime.quiescent(
                        self._handle(rec), window, timeout, q.poll_ms
                    )
            except trio.TooSlowError:
                quiet = False
            except RuntimeError_ as exc:
                raise _runtime_error(exc, slot_id) from exc
            return {"slot": slot_id, "quiescent": quiet, "waited_s": time.monotonic() - started}

    async def load_task(self, slot_id: str, task: str | dict[str, Any]) -> dict[str, Any]:
        self._check_open()
        self.get_slot(slot_id)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_step(rec)
            started = time.monotonic()
            info = await self._load_task(rec, self._handle(rec), task)
            return {"slot": slot_id, "task": info, "setup_s": time.monotonic() - started}

    async def verify(self, slot_id: str, req: VerifyRequest) -> VerifyResult:
        self._check_open()
        self.get_slot(slot_id)
        per_run = req.timeout_s or self.config.tasks.eval_timeout_s
        # A verify that comes early (a fork verified at once) waits for alive_after_resume to be
        # judged rather than calling the episode invalid; outside the lock, which the judge takes.
        await self._wait_gates_judged(slot_id, budget_s=per_run)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            await self.refresh_gates(rec)
            if rec.status is SlotStatus.quarantined:
                statuses = self.gate_statuses(rec)
                raise DrumsdError(
                    "quarantined",
                    f"slot {slot_id} is quarantined ({rec.quarantine_reason}): no reward for "
                    "this episode; release and reset it, or destroy it",
                    slot=slot_id,
                    reason=rec.quarantine_reason,
                    failed_gates=G.failed_gates(statuses),
                    verdict="quarantined",
                )
            check_can_verify(rec)
            handle = self._handle(rec)
            # One checker run is bounded by timeout_s (or eval_timeout_s); verify runs it twice
            # plus the redundant checker, so the whole call gets three runs and a margin.
            timeout = per_run * 3 + 30
            started = time.monotonic()
            try:
                with trio.fail_after(timeout):
                    result = await self.verifier.verify(rec, handle)
            except trio.TooSlowError:
                self.metrics.failure("verify_timeout")
                raise DrumsdError(
                    "timeout", f"verify of slot {slot_id} took longer than {timeout:g}s"
                ) from None
            except RuntimeError_ as exc:
                self.metrics.failure(exc.code)
                raise _runtime_error(exc, slot_id) from exc
            self._observe("verify", slot_id, time.monotonic() - started)
            return self._judge_verify(rec, result)

    async def _wait_gates_judged(self, slot_id: str, *, budget_s: float) -> None:
        """Until no gate of the slot's episode is pending, bounded by what is left of
        alive_after_s (plus the time its judge takes to read facts) and by `budget_s`."""
        rec = self.slots.get(slot_id)
        if rec is None or rec.status is not SlotStatus.ready or rec.episode_started_at is None:
            return
        episode_id = rec.episode_id
        left = self.config.alive_after_s - (self.clock() - rec.episode_started_at)
        with trio.move_on_after(min(max(left, 0.0) + GATE_JUDGE_S, budget_s)):
            while True:
                rec = self.slots.get(slot_id)
                if rec is None or rec.episode_id != episode_id:
                    return
                statuses = self.gate_statuses(rec)
                if all(statuses.get(n, G.PENDING) != G.PENDING for n in G.GATES):
                    return
                await trio.sleep(0.1)

    def _judge_verify(self, rec: SlotRecord, result: VerifyResult) -> VerifyResult:
        statuses = self.gate_statuses(rec)
        valid_state = G.episode_valid(statuses)
        verdict = G.verdict(statuses, rec.status is SlotStatus.quarantined)
        failed = G.failed_gates(statuses)
        reasons = [f"gate {name} failed" for name in failed]
        if valid_state is None:
            pending = [n for n in G.GATES if statuses.get(n, G.PENDING) == G.PENDING]
            reasons.append(f"gates pending: {', '.join(pending)}")
        # scope_unchecked means "not looked at", not "wrong": it leaves trust unknown (null), as
        # does a pending gate; any other flag, an error or no score makes it false.
        bad_flags = [f for f in result.audit.flags if f != "scope_unchecked"]
        trusted: bool | None
        if valid_state is False or bad_flags:
            trusted = False
        elif result.score is None or result.checker_error is not None:
            trusted = False
        elif valid_state is None or "scope_unchecked" in result.audit.flags:
            trusted = None
        else:
            trusted = True
        if result.checker_error:
            self.metrics.failure("checker_error")
        if valid_state and result.score is not None and result.checker_error is None:
            self.metrics.reward_verified()
        return result.model_copy(
            update={
                "slot": rec.id,
                "episode": rec.episode,
                "valid": bool(valid_state),
                "verdict": verdict,
                "failed_gates": failed,
                "invalid_reasons": reasons + list(result.invalid_reasons),
                "trusted": trusted,
                "last_action": rec.last_action,
                "actions": rec.actions,
            }
        )

    # --- quarantine -----------------------------------------------------------------------------

    async def quarantine(self, slot_id: str, reason: str) -> SlotRecord:
        self.get_slot(slot_id)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_quarantine(rec)
            if rec.status is SlotStatus.quarantined:
                return rec
            self._quarantine(rec, f"by request: {reason}")
            return rec

    async def release(self, slot_id: str) -> SlotRecord:
        self.get_slot(slot_id)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            check_can_release(rec)
            # The episode stays invalid (its not_quarantined gate failed); a reset starts a
            # clean one.
            rec.status = SlotStatus.ready
            rec.quarantine_reason = None
            self._save_slot(rec, "released")
            return rec

    async def gate_report(self, slot_id: str) -> SlotRecord:
        self.get_slot(slot_id)
        async with self._lock(slot_id):
            rec = self.get_slot(slot_id)
            await self.refresh_gates(rec)
            return rec

    async def slot_metrics(self, slot_id: str) -> dict[str, Any]:
        rec = self.get_slot(slot_id)
        out: dict[str, Any] = {
            "slot": slot_id,
            "episode": rec.episode,
            "actions": rec.actions,
            "latencies": {op: h.summary() for op, h in self.slot_latency.get(slot_id, {}).items()},
        }
        if rec.handle is not None and rec.status in (SlotStatus.ready, SlotStatus.quarantined):
            facts = await self._facts(rec, self._handle(rec))
            if facts is not None:
                out["pids"] = len(facts["pids"])
                out["memory_mib"] = facts["extra"].get("memory_mib")
                out["cpu_s"] = facts["extra"].get("cpu_s")
        return out

    # --- checkpoints ----------------------------------------------------------------------------

    async def adopt_checkpoint(self, req: CheckpointAdopt) -> CheckpointRecord:
        path = Path(req.path)
        if not path.is_absolute():
            raise DrumsdError(
                "invalid_request", f"path {req.path!r} must be absolute", field="path"
            )
        is_dir = await trio.to_thread.run_sync(path.is_dir)
        if not is_dir:
            raise DrumsdError(
                "invalid_request",
                f"{req.path} is not a directory; give a checkpoint dir with images/, upper/ and "
                "meta.json",
                field="path",
            )
        meta: dict[str, Any] = {}
        try:
            meta = json.loads(await trio.to_thread.run_sync((path / "meta.json").read_text))
        except (OSError, json.JSONDecodeError) as exc:
            raise DrumsdError(
                "invalid_request", f"{path}/meta.json is missing or not JSON ({exc})", field="path"
            ) from None
        if not isinstance(meta, dict):
            raise DrumsdError("invalid_request", f"{path}/meta.json must be an object")
        kind = CheckpointKind(req.kind)
        now = self.clock()
        lease = state_lease(self.config, kind, None, None)
        cp = CheckpointRecord(
            id=_new_id("tpl" if kind is CheckpointKind.template else "st"),
            kind=kind,
            created_at=now,
            last_used_at=now,
            idle_timeout_s=lease.idle_timeout_s,
            ttl_s=lease.ttl_s,
            dir=str(path),
            lower=str(meta.get("lower", "")),
            image=req.image or meta.get("image"),
            image_sha256=str(meta.get("image_sha256", "")),
            upper_sha256=meta.get("upper_sha256"),
            profile=self.config.profile,
            ready=True,
        )
        self._save_checkpoint(cp, "adopted")
        return cp

    async def delete_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        cp = self.get_checkpoint(checkpoint_id)
        if cp.kind is CheckpointKind.template:
            raise DrumsdError(
                "conflict",
                f"{cp.id} is the template checkpoint of image {cp.image}; it is rebuilt from the "
                "image and cannot be deleted by API",
            )
        users = sorted(s.id for s in self.slots.values() if is_live(s) and s.checkpoint == cp.id)
        if users:
            raise DrumsdError(
                "conflict",
                f"checkpoint {cp.id} is restored by live slots {', '.join(users)}; destroy them "
                "first",
                slots=users,
            )
        await self._delete_checkpoint(cp, "api")
        return cp

    async def _delete_checkpoint(self, cp: CheckpointRecord, reason: str) -> None:
        self.checkpoints.pop(cp.id, None)
        await self._forget_spares(cp.id)
        self.journal.delete("checkpoint", cp.id, f"deleted ({reason})", self.clock())
        owned = self.config.state_dir / "checkpoints"
        if Path(cp.dir).parent == owned:  # never remove a directory we only adopted
            await trio.to_thread.run_sync(shutil.rmtree, cp.dir, True)
        log.info("checkpoint=%s deleted: %s", cp.id, reason)

    # --- reconcile ------------------------------------------------------------------------------

    async def reconcile(self) -> dict[str, list[str]]:
        """After a (re)start: adopt live slots, mark dead ones down and clean them, drop unfinished
        checkpoints, sweep what no record owns, compact the journal."""
        state = await trio.to_thread.run_sync(self.journal.load)
        self.slots, self.checkpoints = state.slots, state.checkpoints
        report: dict[str, list[str]] = {"adopted": [], "down": [], "swept": [], "dropped": []}
        for cp in list(self.checkpoints.values()):
            exists = await trio.to_thread.run_sync(Path(cp.dir).exists)
            if not cp.ready or not exists:
                await self._delete_checkpoint(cp, "unfinished or missing after restart")
                report["dropped"].append(cp.id)
        for rec in list(self.slots.values()):
            if rec.status is SlotStatus.destroyed:
                continue
            if rec.status is SlotStatus.failed:
                # Already down: make sure nothing of it remains (destroy is idempotent).
                with trio.CancelScope(shield=True):
                    try:
                        await self.runtime.destroy(rec.id)
                    except RuntimeError_ as exc:
                        log.error("slot=%s cleanup failed: %s", rec.id, exc.message)
                continue
            alive = False
            if rec.handle is not None:
                try:
                    alive = await self.runtime.adopt(handle_from_json(rec.handle))
                except RuntimeError_ as exc:
                    log.warning("slot=%s adopt failed: %s", rec.id, exc.message)
            if alive:
                if rec.status in (SlotStatus.busy, SlotStatus.creating):
                    rec.status = SlotStatus.ready
                self._save_slot(rec, "adopted")
                report["adopted"].append(rec.id)
                handle = handle_from_json(rec.handle or {})
                self._track(rec.id, handle)
                self._spawn(self._watch_exit, rec.id, rec.episode_id, handle)
                if self.gate_statuses(rec).get("alive_after_resume") == G.PENDING:
                    self._spawn(self._judge_alive_after, rec.id, rec.episode_id)
                continue
            with trio.CancelScope(shield=True):
                try:
                    await self.runtime.destroy(rec.id)
                except RuntimeError_ as exc:
                    log.error("slot=%s cleanup failed: %s", rec.id, exc.message)
            was = rec.status.value
            rec.failure = rec.failure or f"down after daemon restart (was {was})"
            if rec.status is SlotStatus.creating:
                rec.status = SlotStatus.destroyed
                rec.destroyed_at = self.clock()
                self._save_slot(rec, "rejected (daemon stopped during create)")
                await self._archive(rec)
            else:
                self._finish_episode(rec)
                rec.status = SlotStatus.failed
                self._save_slot(rec, "down")
            report["down"].append(rec.id)
        live = [r.id for r in self.slots.values() if is_live(r)]
        try:
            report["swept"] = list(await self.runtime.sweep(live))
        except RuntimeError_ as exc:
            log.error("sweep failed: %s", exc.message)
        now = self.clock()
        snapshot = JournalState(
            slots=self.slots, checkpoints=self.checkpoints, last_seq=self.journal.last_seq
        )
        await trio.to_thread.run_sync(self.journal.compact, snapshot_events(snapshot, now))
        self.reconciled = report
        log.info("reconciled: %s", {k: len(v) for k, v in report.items()})
        return report

    # --- templates ------------------------------------------------------------------------------

    def _start_template_builds(self) -> None:
        image = self._default_image()
        if image is None:
            name = self.config.default_image
            self.template_status[name] = (
                f"no image: set lower and image_sha256, or build one with `drumsd image build "
                f"--profile {name}` into {self.config.images_dir}"
            )
            return
        name, root, sha = image
        if self.config.image_sha256 and sha != self.config.image_sha256:
            self.template_status[name] = (
                f"refused: image {root} has sha256 {sha}, config image_sha256 is "
                f"{self.config.image_sha256}; rebuild the image or update the config"
            )
            log.error("image=%s %s", name, self.template_status[name])
            return
        cp_id = f"tpl-{name}-{sha[:12]}"
        existing = self.checkpoints.get(cp_id)
        if existing is not None and existing.ready:
            self.template_status[name] = "ready"
            self._enable_spares(existing)
            return
        self.template_status[name] = "building"
        self._spawn(self._build_template, name, root, sha, cp_id)

    def _default_image(self) -> tuple[str, Path, str] | None:
        name = self.config.default_image
        if self.config.lower is not None:
            return name, self.config.lower, self.config.image_sha256 or ""
        candidates = []
        # The builder points `<images_dir>/<profile>` at the current build; else the newest.
        current = self.config.images_dir / name / "image.json"
        paths = [current] if current.exists() else []
        paths = paths or list(self.config.images_dir.glob(f"{name}-*/image.json"))
        for meta_path in paths:
            try:
                meta = json.loads(meta_path.read_text())
                sha = str(meta.get("sha256") or meta.get("image_sha256"))
                root = Path(meta.get("root") or meta_path.parent / "root")
                candidates.append((meta_path.stat().st_mtime, root, sha))
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
        if not candidates:
            return None
        _, root, sha = max(candidates, key=lambda c: c[0])
        return name, root, sha

    async def _build_template(self, name: str, root: Path, sha: str, cp_id: str) -> None:
        dest = self.config.state_dir / "templates" / cp_id
        now = self.clock()
        log.info("image=%s building template checkpoint %s from %s", name, cp_id, root)
        try:
            ref = await self.runtime.make_template(root, sha, cp_id, dest)
        except RuntimeError_ as exc:
            self.template_status[name] = f"error: {exc.code}: {exc.message}"
            self.metrics.failure("template")
            log.error("image=%s template build failed: %s", name, exc.message)
            return
        cp = CheckpointRecord(
            id=cp_id,
            kind=CheckpointKind.template,
            created_at=now,
            last_used_at=now,
            dir=str(ref.dir),
            lower=str(ref.lower),
            image=name,
            image_sha256=ref.image_sha256 or sha,
            upper_sha256=ref.upper_sha256,
            profile=ref.profile,
            ready=True,
        )
        self._save_checkpoint(cp, "template_ready")
        self.template_status[name] = "ready"
        self._enable_spares(cp)

    # --- reaper ---------------------------------------------------------------------------------

    async def _reap_loop(self) -> None:
        while True:
            await trio.sleep(self.config.lease.reap_interval_s)
            try:
                await self.reap_once()
            except (OSError, RuntimeError_) as exc:
                log.error("reaper pass failed: %s", exc)

    async def reap_once(self) -> dict[str, list[str]]:
        """Destroy expired slots and states, drop old tombstones, flush renewals, apply caps."""
        now = self.clock()
        done: dict[str, list[str]] = {"slots": [], "checkpoints": [], "archives": []}
        for rec, reason in expired_slots(list(self.slots.values()), now):
            log.info("slot=%s lease over: %s", rec.id, reason)
            await self.destroy(rec.id, reason=f"lease: {reason}")
            done["slots"].append(rec.id)
        referenced = self._referenced_checkpoints()
        for cp, reason in expired_checkpoints(list(self.checkpoints.values()), referenced, now):
            await self._delete_checkpoint(cp, f"lease: {reason}")
            done["checkpoints"].append(cp.id)
        for rec in stale_tombstones(list(self.slots.values()), now):
            self.slots.pop(rec.id, None)
            self._locks.pop(rec.id, None)
            self.journal.delete("slot", rec.id, "forgotten", now)
        self._flush_dirty()
        self._compact_if_large()
        files = await trio.to_thread.run_sync(scan_forgotten, self.config.forgotten_dir)
        doomed = files_to_delete(files, self.config)
        if doomed:
            await trio.to_thread.run_sync(delete_archives, [f.path for f in doomed])
            done["archives"] = [f.path for f in doomed]
        self._forgotten_bytes = sum(f.size for f in files) - sum(f.size for f in doomed)
        return done

    def _compact_if_large(self) -> None:
        """Bound events.jsonl between restarts. Synchronous on purpose: no append may
        interleave with the rewrite."""
        try:
            size = self.journal.events_path.stat().st_size
        except OSError:
            return
        if size > EVENTS_COMPACT_BYTES:
            snapshot = JournalState(
                slots=self.slots, checkpoints=self.checkpoints, last_seq=self.journal.last_seq
            )
            self.journal.compact(snapshot_events(snapshot, self.clock()))
            log.info("journal compacted (events.jsonl was %d bytes)", size)

    # --- warm spares ----------------------------------------------------------------------------

    def _spares_on(self) -> bool:
        return self.config.spares.enabled and isinstance(self.runtime, SpareControl)

    def _enable_spares(self, cp: CheckpointRecord) -> None:
        """Keep frozen restores of `cp` ready so create/reset/branch from it are a thaw."""
        if not self._spares_on() or not cp.ready:
            return
        assert isinstance(self.runtime, SpareControl)
        self.runtime.enable_spares(self._ref(cp), self._limits())
        self._pool_since.setdefault(cp.id, time.monotonic())
        self.pool_stats.setdefault(cp.id, PoolStats())
        log.info("checkpoint=%s warm spares enabled", cp.id)

    async def _forget_spares(self, checkpoint_id: str) -> None:
        """A deleted or replaced checkpoint: its spares and cached image copies go."""
        self._pool_since.pop(checkpoint_id, None)
        self._pool_targets.pop(checkpoint_id, None)
        self.pool_stats.pop(checkpoint_id, None)
        if not isinstance(self.runtime, SpareControl):
            return
        with trio.CancelScope(shield=True):
            try:
                await self.runtime.forget_checkpoint(checkpoint_id)
            except RuntimeError_ as exc:
                log.error("checkpoint=%s dropping spares failed: %s", checkpoint_id, exc.message)

    def _note_claim(self, checkpoint_id: str, handle: SlotHandle) -> None:
        """A create/reset/branch child of a pooled checkpoint: a hit (thaw) or a miss (restore)."""
        stats = self.pool_stats.get(checkpoint_id)
        if stats is None:
            return
        spare = bool(handle.extra.get("spare"))
        stats.record(time.monotonic(), spare, handle.restore_s)
        self.metrics.observe("spare_claim" if spare else "spare_miss_restore", handle.restore_s)
        self.metrics.count("spare_hits" if spare else "spare_misses")

    def _refill_allowed(self) -> bool:
        """A refill is a new desktop: only when admission would admit a create right now."""
        if self.draining:
            return False
        return decide(
            self.sample,
            self.config.admission,
            self.slot_cost_mib(),
            pending_mib=self._pending_mib,
        ).admit

    def size_pools(self) -> dict[str, int]:
        """Targets from each pool's claim rate and restore time, fitted into spares.per_host."""
        now = time.monotonic()
        wanted = {
            cid: spare_target(
                self.pool_stats[cid].claims_per_s(now, since),
                self.pool_stats[cid].typical_restore_s(),
                self.config.spares.per_checkpoint,
            )
            for cid, since in self._pool_since.items()
            if cid in self.pool_stats
        }
        targets = share_host(wanted, self.config.spares.per_host)
        if isinstance(self.runtime, SpareControl):
            for cid, n in targets.items():
                self.runtime.set_spare_target(cid, n)
        self._pool_targets = targets
        return targets

    async def _spare_sizing_loop(self) -> None:
        while True:
            self.size_pools()
            await trio.sleep(SPARE_SIZING_S)

    def pools_state(self) -> dict[str, Any]:
        """Per pooled checkpoint: spares parked now, target, hits, misses, claim latency."""
        counts: dict[str, int] = (
            dict(self.runtime.spare_counts()) if isinstance(self.runtime, SpareControl) else {}
        )
        return {
            "enabled": self._spares_on(),
            "per_checkpoint": self.config.spares.per_checkpoint,
            "per_host": self.config.spares.per_host,
            "max_age_s": self.config.spares.max_age_s,
            "refill_allowed": self._refill_allowed() if self._spares_on() else False,
            "parked": sum(counts.values()),
            "checkpoints": {
                cid: {
                    "size": counts.get(cid, 0),
                    "target": self._pool_targets.get(cid),
                    **stats.summary(),
                }
                for cid, stats in self.pool_stats.items()
            },
        }

    def pool_gauges(self) -> list[tuple[str, str, dict[str, str], float]]:
        """Prometheus gauges of the pools and KSM (for the /metrics route's `gauges`)."""
        out: list[tuple[str, str, dict[str, str], float]] = []
        for cid, p in self.pools_state()["checkpoints"].items():
            labels = {"checkpoint": cid}
            out.append(("drums_spares", "Warm spares parked per checkpoint.", labels, p["size"]))
            if p["target"] is not None:
                out.append(
                    (
                        "drums_spares_target",
                        "Warm spare target per checkpoint.",
                        labels,
                        p["target"],
                    )
                )
            out.append(("drums_spare_hits", "Claims served by a warm spare.", labels, p["hits"]))
            out.append(
                ("drums_spare_misses", "Claims that fell back to a restore.", labels, p["misses"])
            )
        if isinstance(self.runtime, KsmControl):
            try:
                saved = float(dict(self.runtime.ksm_stats()).get("saved_bytes", 0))
            except Exception:  # optional figures must never break /metrics
                saved = None
            if saved is not None:
                out.append(("drums_ksm_saved_bytes", "Memory KSM saves now.", {}, saved))
        return out

    # --- health / metrics -----------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        by_state: dict[str, int] = {s.value: 0 for s in SlotStatus}
        for rec in self.slots.values():
            by_state[rec.status.value] += 1
        files = await trio.to_thread.run_sync(scan_forgotten, self.config.forgotten_dir)
        self._forgotten_bytes = sum(f.size for f in files)
        warnings = []
        decision = decide(
            self.sample,
            self.config.admission,
            self.slot_cost_mib(),
            pending_mib=self._pending_mib,
        )
        if not decision.admit:
            warnings.append(f"admission refusing: {decision.reason}")
        warnings += state_space_warnings(
            self.sample, self.config.state_min_free_mib, self.config.state_warn_free_pct
        )
        warnings += forgotten_warnings(files, self.config)
        for image, status in self.template_status.items():
            if status not in ("ready", "building"):
                warnings.append(f"image {image}: {status}")
        if by_state["quarantined"]:
            warnings.append(f"{by_state['quarantined']} slot(s) quarantined")
        if self.crash_watch is not None and not self.crash_watch.available:
            warnings.append(f"crash watch not running: {self.crash_watch.error}")
        journal_space = await trio.to_thread.run_sync(_space, self.config.journal_dir)
        state_space = await trio.to_thread.run_sync(_space, self.config.state_dir)
        return {
            "status": "ok" if not warnings else "degraded",
            "version": self.version,
            "profile": self.config.profile,
            "slots_by_state": by_state,
            "checkpoints": self.list_checkpoints(),
            "admission": self.admission_state(decision),
            "crash_watch": {
                "enabled": self.config.crash_watch,
                **(self.crash_watch.health() if self.crash_watch is not None else {}),
            },
            "state_dir": state_space,
            "journal_dir": journal_space,
            "forgotten_gib": self._forgotten_bytes / 1024**3,
            "ksm": await self._runtime_ksm(),
            "pools": {
                "templates": dict(self.template_status),
                "reconciled": {k: len(v) for k, v in self.reconciled.items()},
                "spares": self.pools_state(),
            },
            "warnings": warnings,
        }

    async def _runtime_ksm(self) -> dict[str, Any]:
        """KSM figures when the runtime offers them (an optional extra of the Linux runtime)."""
        if not isinstance(self.runtime, KsmControl):
            return {}
        try:
            out: dict[str, Any] = dict(self.runtime.ksm_stats() or {})
            if "saved_bytes" in out:
                out["saved_mib"] = out["saved_bytes"] / (1024 * 1024)
            return out
        except Exception as exc:  # optional figures must never break /v1/health
            return {"error": f"{type(exc).__name__}: {exc}"}

    def admission_state(self, decision: Decision | None = None) -> dict[str, Any]:
        s = self.sample
        cost = self.slot_cost_mib()
        decision = decision or decide(s, self.config.admission, cost)
        return {
            "enabled": self.config.admission.enabled,
            "admitting": decision.admit,
            "reason": decision.reason,
            "slot_cost_mib": cost,
            "mem_available_mib": s.mem_available_mib if s else None,
            "mem_total_mib": s.mem_total_mib if s else None,
            "psi_memory_some_avg10": s.psi_memory_some_avg10 if s else None,
            "state_free_mib": s.state_free_mib if s else None,
            "sampled_at": s.taken_at if s else None,
        }

    def metrics_json(self) -> dict[str, Any]:
        now = self.clock()
        data = self.metrics.as_json(now, self.config.host_usd_per_hour)
        data["window_started_at"] = self.metrics.started_at
        # Gauges of this instant beside the window's counters (JSON has no gauge section).
        pools = self.pools_state()
        data["counters"]["spares_parked"] = float(pools["parked"])
        if isinstance(self.runtime, KsmControl):
            with contextlib.suppress(Exception):
                data["counters"]["ksm_saved_bytes"] = float(
                    dict(self.runtime.ksm_stats()).get("saved_bytes", 0)
                )
        return data

    def reset_metrics(self) -> dict[str, Any]:
        old = self.metrics_json()
        self.metrics = MetricsWindow(started_at=self.clock())
        return old


def _dir_size_mib(path: Path) -> float:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file():
                total += p.stat().st_size
        except OSError:
            continue
    return total / (1024 * 1024)


def _space(path: Path) -> dict[str, Any] | None:
    free, total = read_space(path)
    if free is None or total is None:
        return None
    return {
        "path": str(path),
        "free_mib": free,
        "total_mib": total,
        "free_pct": 100.0 * free / total if total else 0.0,
    }


@asynccontextmanager
async def open_supervisor(
    config: Config, runtime: SlotRuntime, journal: Journal | None = None, **kwargs: Any
) -> AsyncIterator[Supervisor]:
    """Run a supervisor for the body's duration (tests, tools); `serve` uses `Supervisor.run`."""
    journal = journal or Journal(config.journal_dir)
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(config, runtime, journal, **kwargs)
        await nursery.start(supervisor.run)
        try:
            yield supervisor
        finally:
            nursery.cancel_scope.cancel()


__all__ = ["Supervisor", "handle_from_json", "handle_to_json", "open_supervisor"]
