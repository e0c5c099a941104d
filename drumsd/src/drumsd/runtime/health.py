"""/v1/health and the metrics the API reports: slots by state, admission, space, services."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core.admission import (
    Decision,
    decide,
    state_space_warnings,
)
from drumsd.core.metrics import MetricsWindow
from drumsd.core.records import (
    SlotStatus,
)
from drumsd.core.results import AdmissionReport, HealthReport, MetricsReport, SparesReport
from drumsd.core.retention import forgotten_warnings
from drumsd.core.seams import (
    KsmControl,
)
from drumsd.linux import state_files
from drumsd.runtime.forgotten import scan_forgotten
from drumsd.runtime.services import health_json as services_health
from drumsd.runtime.slot_locks import abandoned, held_too_long

if TYPE_CHECKING:
    from collections.abc import Callable

    from drumsd.core.admission import HostSample
    from drumsd.core.config import Config
    from drumsd.core.records import CheckpointRecord, SlotRecord
    from drumsd.core.seams import CrashWatchControl, SlotRuntime
    from drumsd.runtime.admission_book import AdmissionBook
    from drumsd.runtime.services import ServiceHealth
    from drumsd.runtime.slot_table import SlotTable
    from drumsd.runtime.verifier import TaskCatalog, Verifier

log = logging.getLogger("drumsd.supervisor")


class HealthHost(Protocol):
    """What /v1/health and the metrics read of the supervisor. Health reports on the whole
    daemon, so this is most of its state, read-only but for the metrics window (a reset starts a
    new one) and the forgotten_dir total (a health call rescans it)."""

    metrics: MetricsWindow
    forgotten_bytes: int

    @property
    def config(self) -> Config: ...
    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def version(self) -> str: ...
    @property
    def runtime(self) -> SlotRuntime: ...
    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def table(self) -> SlotTable: ...
    @property
    def services(self) -> dict[str, ServiceHealth]: ...
    @property
    def admission_book(self) -> AdmissionBook: ...
    @property
    def sample(self) -> HostSample | None: ...
    @property
    def group_memory_limit_mib(self) -> int | None: ...
    @property
    def crash_watch(self) -> CrashWatchControl | None: ...
    @property
    def template_status(self) -> dict[str, str]: ...
    @property
    def reconciled(self) -> dict[str, list[str]]: ...
    @property
    def tasks(self) -> TaskCatalog: ...
    @property
    def verifier(self) -> Verifier: ...
    def slot_cost_mib(self) -> float: ...
    def list_checkpoints(self) -> list[CheckpointRecord]: ...
    def pools_state(self) -> SparesReport: ...
    def admission_state(self, decision: Decision | None = None) -> AdmissionReport: ...
    def metrics_report(self) -> MetricsReport: ...


async def health(sup: HealthHost) -> HealthReport:
    by_state: dict[str, int] = {s.value: 0 for s in SlotStatus}
    for rec in sup.slots.values():
        by_state[rec.status.value] += 1
    files = await trio.to_thread.run_sync(scan_forgotten, sup.config.forgotten_dir)
    sup.forgotten_bytes = sum(f.size for f in files)
    warnings = []
    decision = sup.admission_book.decision(sup.slot_cost_mib())
    if not decision.admit:
        warnings.append(f"admission refusing: {decision.reason}")
    warnings += state_space_warnings(
        sup.sample, sup.config.state_min_free_mib, sup.config.state_warn_free_pct
    )
    warnings += forgotten_warnings(files, sup.config)
    for image, status in sup.template_status.items():
        if status not in ("ready", "building"):
            warnings.append(f"image {image}: {status}")
    if by_state["quarantined"]:
        warnings.append(f"{by_state['quarantined']} slot(s) quarantined")
    if sup.crash_watch is not None and not sup.crash_watch.available:
        warnings.append(f"crash watch not running: {sup.crash_watch.error}")
    tasks = dict(getattr(sup.tasks, "status", None) or {})
    warnings += [f"tasks: {w}" for w in tasks.get("warnings", [])]
    services, service_warnings = services_health(sup)
    warnings += service_warnings
    warnings += stuck_operations(sup)
    # The kernel limits the runtime could not raise at start (LinuxRuntime.size_host_limits).
    warnings += [
        f"kernel limit {n.name}={n.current} is below the {n.needed} the admitted slots need: "
        f"forks and creates fail on it past that; {n.how}"
        for n in getattr(sup.runtime, "host_limits", ())
        if n.short
    ]
    journal_space = await trio.to_thread.run_sync(state_files.space, sup.config.journal_dir)
    state_space = await trio.to_thread.run_sync(state_files.space, sup.config.state_dir)
    return HealthReport(
        status="ok" if not warnings else "degraded",
        version=sup.version,
        profile=sup.config.profile,
        slots_by_state=by_state,
        checkpoints=sup.list_checkpoints(),
        admission=sup.admission_state(decision),
        crash_watch={
            "enabled": sup.config.crash_watch,
            **(sup.crash_watch.health() if sup.crash_watch is not None else {}),
        },
        state_dir=state_space,
        journal_dir=journal_space,
        forgotten_gib=sup.forgotten_bytes / 1024**3,
        ksm=await runtime_ksm(sup),
        pools={
            "templates": dict(sup.template_status),
            "reconciled": {k: len(v) for k, v in sup.reconciled.items()},
            "spares": dataclasses.asdict(sup.pools_state()),
            "checkers": checker_health(sup),
        },
        services=services,
        tasks=tasks,
        warnings=warnings,
    )


def stuck_operations(sup: HealthHost) -> list[str]:
    """A slot lock held past its operation's deadline (or stuck_operation_s), and worker threads
    still running after their operation gave up on them: each a warning naming what and since
    when (issue 39: a capture hashing an 8 TiB hole held its slot for good while health said ok)."""
    now = trio.current_time()
    out = [
        f"slot {slot_id}: {holder.op} has held the slot for {held:.0f} s"
        + (f", past its deadline of {holder.deadline_s:g} s" if holder.deadline_s else "")
        + "; requests on the slot wait for it"
        for slot_id, holder, held in held_too_long(
            sup.table.locks, now, sup.config.stuck_operation_s
        )
    ]
    out += [
        f"a worker thread ({what}) still runs {since:.0f} s after its operation gave up on it"
        for what, since in abandoned()
    ]
    return out


def checker_health(sup: HealthHost) -> dict[str, Any]:
    """How checker calls run (the resident worker's pid, RSS and bound), when tasks are served."""
    report = getattr(sup.verifier, "checker_health", None)
    if report is None:
        return {}
    try:
        return dict(report())
    except Exception as exc:  # optional figures must never break /v1/health
        return {"error": f"{type(exc).__name__}: {exc}"}


async def runtime_ksm(sup: HealthHost) -> dict[str, Any]:
    """KSM figures when the runtime offers them (an optional extra of the Linux runtime)."""
    if not isinstance(sup.runtime, KsmControl):
        return {}
    try:
        out: dict[str, Any] = dict(sup.runtime.ksm_stats() or {})
        if "saved_bytes" in out:
            out["saved_mib"] = out["saved_bytes"] / (1024 * 1024)
        return out
    except Exception as exc:  # optional figures must never break /v1/health
        return {"error": f"{type(exc).__name__}: {exc}"}


def admission_state(sup: HealthHost, decision: Decision | None = None) -> AdmissionReport:
    s = sup.sample
    cost = sup.slot_cost_mib()
    decision = decision or decide(s, sup.config.admission, cost)
    return AdmissionReport(
        enabled=sup.config.admission.enabled,
        admitting=decision.admit,
        reason=decision.reason,
        slot_cost_mib=cost,
        mem_available_mib=s.mem_available_mib if s else None,
        mem_total_mib=s.mem_total_mib if s else None,
        psi_memory_some_avg10=s.psi_memory_some_avg10 if s else None,
        state_free_mib=s.state_free_mib if s else None,
        group_memory_limit_mib=sup.group_memory_limit_mib,
        sampled_at=s.taken_at if s else None,
    )


def metrics_report(sup: HealthHost) -> MetricsReport:
    report = sup.metrics.report(sup.clock(), sup.config.host_usd_per_hour)
    # Gauges of this instant beside the window's counters (JSON has no gauge section).
    report.counters["spares_parked"] = float(sup.pools_state().parked)
    if isinstance(sup.runtime, KsmControl):
        with contextlib.suppress(Exception):
            report.counters["ksm_saved_bytes"] = float(
                dict(sup.runtime.ksm_stats()).get("saved_bytes", 0)
            )
    return report


def reset_metrics(sup: HealthHost) -> MetricsReport:
    old = sup.metrics_report()
    sup.metrics = MetricsWindow(started_at=sup.clock())
    return old
