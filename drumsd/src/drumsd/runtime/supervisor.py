"""The slot supervisor: the facade the API calls. It owns the records and the state shared by the
operations; each operation lives in its own module (ops_create, ops_reset, ops_episode, ops_fork,
ops_checkpoints), each background service in runtime/services/.

Each operation is refresh -> check -> effect -> save: the record is written to the journal before
the runtime starts work, so a daemon killed at any moment leaves a record that the next start
reconciles (adopt the live, clean the dead). Background work (services, gate timers, exit
watchers, template builds) runs in the supervisor's own nursery, never the web app's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio
from drums.models import (
    AccessibilityTree,
    CaptureRequest,
    CheckpointAdopt,
    ForkRequest,
    PreforkRequest,
    QuiescentRequest,
    QuiescentResult,
    SlotCreate,
    SlotMetrics,
    StepRequest,
    TaskLoaded,
    TerminalOutput,
    VerifyRequest,
    VerifyResult,
)

from drumsd.core.admission import (
    Decision,
    HostSample,
)
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.metrics import Histogram, MetricsWindow
from drumsd.core.records import (
    CheckpointRecord,
    SlotRecord,
    SlotStatus,
    check_can_observe,
)
from drumsd.core.results import (
    AdmissionReport,
    Forked,
    HealthReport,
    MetricsReport,
    SparesReport,
    StepDone,
)
from drumsd.core.seams import (
    CrashWatchControl,
    Screenshot,
    SlotRuntime,
)
from drumsd.guest.protocol import PNG_FULL, ShotSpec
from drumsd.linux.host_sampler import read_host_namespaces, sample_host
from drumsd.linux.journal_io import Journal
from drumsd.runtime import (
    episodes,
    health,
    ops_checkpoints,
    ops_create,
    ops_dialect,
    ops_episode,
    ops_fork,
    ops_reset,
)
from drumsd.runtime.admission_book import AdmissionBook
from drumsd.runtime.console_state import ConsoleState
from drumsd.runtime.gate_evidence import GateEvidence
from drumsd.runtime.handles import handle_from_json, handle_of, handle_to_json
from drumsd.runtime.ports import PortForwards
from drumsd.runtime.services import (
    ServiceHealth,
    admission,
    gate_refresh,
    history,
    reaper,
    spares,
    templates,
)
from drumsd.runtime.slot_table import SlotTable
from drumsd.runtime.store import RecordStore
from drumsd.runtime.verifier import NoTaskCatalog, NoTaskVerifier, TaskCatalog, Verifier
from drumsd.version import VERSION

log = logging.getLogger("drumsd.supervisor")
T = TypeVar("T")


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
        version: str = VERSION,
        crash_watch: CrashWatchControl | None = None,
        evidence: GateEvidence | None = None,
    ) -> None:
        self.config = config
        self.runtime = runtime
        self.journal = journal
        self.store = RecordStore(journal)  # every journal write goes through it
        self.verifier: Verifier = verifier or NoTaskVerifier()
        self.tasks: TaskCatalog = tasks or NoTaskCatalog()
        self.sampler = sampler
        self.host_namespaces = dict(
            host_namespaces if host_namespaces is not None else read_host_namespaces()
        )
        self.clock = clock
        self.version = version
        # A started `CrashWatch` (track/untrack/facts/health) when config.crash_watch is on.
        self.crash_watch: CrashWatchControl | None = crash_watch
        self.unwatched: dict[str, str] = {}  # slot id -> why the crash watch cannot follow it
        # slots whose tree is gone (init exited) or being torn down or replaced
        self.retiring: set[str] = set()
        # Evidence from /proc and the upper layer (the Linux runtime; None for fake desktops).
        self.evidence = evidence
        # The records, each slot's lock and every record save (runtime/slot_table.py).
        self.table = SlotTable(self.store, clock, on_slot_saved=self._slot_saved)
        self.metrics = MetricsWindow(started_at=clock())
        self.slot_latency: dict[str, dict[str, Histogram]] = {}
        self.console = ConsoleState()  # last screenshots and verifies, steps, host history
        # The host sample, the reservations of admitted work, the slots' charge (admission).
        self.admission_book = AdmissionBook(
            config, self.metrics, checker_reserved_mib=self.checker_reserved_mib
        )
        self.group_memory_limit_mib: int | None = None  # the slots' group limit (admission)
        self.template_status: dict[str, str] = {}  # image -> building | ready | error: ...
        self.warnings: list[str] = []
        self.draining = False
        self.reconciled: dict[str, list[str]] = {}
        self.nursery: trio.Nursery | None = None
        self.ports = PortForwards(self)
        self.forgotten_bytes = 0
        # Warm spares (a Linux runtime extra): checkpoints with a pool, what claims looked like.
        self.pools = spares.SparePools()
        # Task checkpoint keys whose capture was refused (not quiet, no space): trio time, so
        # the next episodes replay without waiting for a quiet tree again for a while.
        self.task_capture_refused: dict[str, float] = {}
        # Task checkpoint keys whose new checkpoint is proven on a probe restore before it
        # serves episodes (done when the verdict is in; ops_task_checkpoints.run_probe).
        self.task_checkpoint_probes: dict[str, trio.Event] = {}
        # Background services by name: liveness and last error, for /v1/health.
        self.services: dict[str, ServiceHealth] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Reconcile, then start the background services and template builds; run until cancelled.
        Slots outlive the daemon (the next start adopts them), so stopping destroys nothing."""
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await nursery.start(self.store.run)
            await self.reconcile()
            await self.ports.reopen()
            await self.sample_now()
            await nursery.start(partial(admission.run, self))
            await nursery.start(partial(reaper.run, self))
            await nursery.start(partial(gate_refresh.run, self))
            await nursery.start(partial(history.run, self))
            if spares.spares_on(self):
                await nursery.start(partial(spares.run, self))
            await templates.start_template_builds(self)
            task_status.started(self)
            try:
                await trio.sleep_forever()
            finally:
                self.table.flush_dirty()  # synchronous: runs even while cancelled
                self.store.flush_sync()

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """A per-slot background task (episode timers, exit watchers, template builds)."""
        if self.nursery is not None:
            self.nursery.start_soon(self._guarded, fn, *args)

    async def _guarded(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """A background task's failure is logged with what it was for and counted; it must never
        take the supervisor down. Cancellation is not caught."""
        try:
            await fn(*args)
        except Exception:
            self.metrics.failure("background_task")
            name = getattr(getattr(fn, "func", fn), "__name__", repr(fn))  # a partial too
            about = [a for a in args if isinstance(a, str)][:2]  # slot id, episode id
            log.exception("background task %s %s failed", name, " ".join(about))

    async def _durable(self, result: T) -> T:
        """An operation that changed records answers once its journal writes are on disk (off
        the trio thread); step and the observations do not wait."""
        await self.store.durable()
        return result

    # --- records (owned by the slot table) ------------------------------------------------------

    @property
    def slots(self) -> dict[str, SlotRecord]:
        return self.table.slots

    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]:
        return self.table.checkpoints

    def _slot_saved(self, rec: SlotRecord) -> None:
        self.ports.saved(rec)  # a slot no longer live closes its port listeners

    def get_slot(self, slot_id: str, *, renew: bool = True) -> SlotRecord:
        return self.table.get_slot(slot_id, renew=renew)

    def list_slots(self, include_all: bool = False) -> list[SlotRecord]:
        return self.table.list_slots(include_all)

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        return self.table.get_checkpoint(checkpoint_id)

    def list_checkpoints(self) -> list[CheckpointRecord]:
        return self.table.list_checkpoints()

    def observe(self, operation: str, slot_id: str | None, seconds: float) -> None:
        self.metrics.observe(operation, seconds)
        if slot_id is not None:
            self.slot_latency.setdefault(slot_id, {}).setdefault(operation, Histogram()).observe(
                seconds
            )

    def check_open(self) -> None:
        if self.draining:
            raise DrumsdError(
                "shutting_down", "drumsd is shutting down; retry against the restarted daemon"
            )

    # --- admission ------------------------------------------------------------------------------

    @property
    def sample(self) -> HostSample | None:
        return self.admission_book.sample

    async def sample_now(self) -> HostSample | None:
        try:
            sample = await trio.to_thread.run_sync(self.sampler, self.config.state_dir)
        except OSError as exc:
            log.warning("admission sample failed: %s", exc)
        else:
            self.admission_book.sample = sample
        return self.admission_book.sample

    def slot_cost_mib(self) -> float:
        """Admission's cost of one more slot: the real, KSM-merged charge of the live slots."""
        live = (
            i
            for i, r in self.slots.items()
            if r.status in (SlotStatus.ready, SlotStatus.quarantined)
        )
        return self.admission_book.slot_cost_mib(live)

    def checker_reserved_mib(self) -> float:
        """The memory of the checker calls running now (issue 39, D5: a checker took 1.5 GiB
        outside every limit); the task bridge bounds them and says how much."""
        reserved = getattr(self.verifier, "checker_reserved_mib", None)
        return float(reserved()) if reserved is not None else 0.0

    def gate_statuses(self, rec: SlotRecord) -> dict[str, str]:
        return {g.name: g.status for g in rec.gates}

    # --- operations: one module each (refresh -> check -> effect -> save) -----------------------

    async def create(self, req: SlotCreate) -> SlotRecord:
        return await self._durable(await ops_create.create(self, req))

    async def reset(self, slot_id: str) -> SlotRecord:
        return await self._durable(await ops_reset.reset(self, slot_id))

    async def destroy(self, slot_id: str, reason: str = "api") -> tuple[SlotRecord, bool]:
        """Idempotent: (record, already_destroyed)."""
        return await self._durable(await ops_reset.destroy(self, slot_id, reason))

    async def step(self, slot_id: str, req: StepRequest) -> StepDone:
        started = self.clock()
        try:
            if req.dialect is not None or req.actions is not None:
                out = await ops_dialect.step(self, slot_id, req)
            else:
                out = await ops_episode.step(self, slot_id, req)
        except DrumsdError as exc:
            if (rec := self.slots.get(slot_id)) is not None:
                self.console.log_step(rec, req, started, self.clock() - started, error=exc.code)
            raise
        returncode = out.output.returncode if out.output is not None else None
        if (rec := self.slots.get(slot_id)) is not None:
            self.console.log_step(rec, req, started, out.elapsed_s, returncode=returncode)
        return out

    async def screenshot(self, slot_id: str, spec: ShotSpec = PNG_FULL) -> Screenshot:
        return await ops_episode.screenshot(self, slot_id, spec)

    async def terminal(self, slot_id: str) -> TerminalOutput:
        return await ops_episode.terminal(self, slot_id)

    async def accessibility_tree(self, slot_id: str) -> AccessibilityTree:
        return await ops_episode.accessibility_tree(self, slot_id)

    async def quiescent(self, slot_id: str, req: QuiescentRequest) -> QuiescentResult:
        return await ops_episode.quiescent(self, slot_id, req)

    async def load_task(self, slot_id: str, task: str | dict[str, Any]) -> TaskLoaded:
        return await self._durable(await ops_episode.load_task(self, slot_id, task))

    async def verify(self, slot_id: str, req: VerifyRequest) -> VerifyResult:
        result = await ops_episode.verify(self, slot_id, req)
        self.console.last_verify[slot_id] = result
        return result

    async def glance(self, slot_id: str) -> bytes | None:
        """The desktop for an onlooker (the console): never renews the lease, never counts as a
        screenshot in the metrics and never waits behind a step (then the last screenshot taken,
        or None)."""
        rec = self.get_slot(slot_id, renew=False)
        check_can_observe(rec)
        lock = self.table.lock(slot_id)
        if lock.locked():
            return self.console.last_screenshot.get(slot_id)
        async with lock:
            rec = self.get_slot(slot_id, renew=False)
            check_can_observe(rec)
            png = await self.runtime.screenshot(handle_of(rec))
            self.console.last_screenshot[slot_id] = png
            return png

    async def quarantine(self, slot_id: str, reason: str) -> SlotRecord:
        return await self._durable(await ops_episode.quarantine(self, slot_id, reason))

    async def release(self, slot_id: str) -> SlotRecord:
        return await self._durable(await ops_episode.release(self, slot_id))

    async def gate_report(self, slot_id: str) -> SlotRecord:
        return await ops_episode.gate_report(self, slot_id)

    async def slot_metrics(self, slot_id: str) -> SlotMetrics:
        return await ops_episode.slot_metrics(self, slot_id)

    async def refresh_gates(self, rec: SlotRecord) -> None:
        await episodes.refresh_gates(self, rec)

    async def capture(self, slot_id: str, req: CaptureRequest) -> CheckpointRecord:
        return await self._durable(await ops_fork.capture(self, slot_id, req))

    async def prefork(self, slot_id: str, req: PreforkRequest) -> CheckpointRecord:
        return await self._durable(await ops_fork.prefork(self, slot_id, req))

    async def fork(self, slot_id: str, req: ForkRequest) -> Forked:
        return await self._durable(await ops_fork.fork(self, slot_id, req))

    async def adopt_checkpoint(self, req: CheckpointAdopt) -> CheckpointRecord:
        return await self._durable(await ops_checkpoints.adopt_checkpoint(self, req))

    async def delete_checkpoint(
        self, checkpoint_id: str, when_unused: bool = False
    ) -> CheckpointRecord:
        return await self._durable(
            await ops_checkpoints.delete_checkpoint(self, checkpoint_id, when_unused)
        )

    # --- services and reports -------------------------------------------------------------------

    async def reconcile(self) -> dict[str, list[str]]:
        return await templates.reconcile(self)

    async def reap_once(self) -> dict[str, list[str]]:
        return await reaper.reap_once(self)

    def size_pools(self) -> dict[str, int]:
        return spares.size_pools(self)

    def pools_state(self) -> SparesReport:
        return spares.pools_state(self)

    def pool_gauges(self) -> list[tuple[str, str, dict[str, str], float]]:
        return spares.pool_gauges(self)

    async def health(self) -> HealthReport:
        return await health.health(self)

    def admission_state(self, decision: Decision | None = None) -> AdmissionReport:
        return health.admission_state(self, decision)

    def metrics_report(self) -> MetricsReport:
        return health.metrics_report(self)

    def reset_metrics(self) -> MetricsReport:
        return health.reset_metrics(self)


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
