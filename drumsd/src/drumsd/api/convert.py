"""Core records -> wire models. The only place internal state is shaped for the API."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

from drums import models as wire

from drumsd.core import gates as G
from drumsd.core.leases import record_expires_at
from drumsd.core.records import CheckpointRecord, SlotRecord, SlotStatus
from drumsd.core.results import (
    AdmissionReport,
    Forked,
    HealthReport,
    MetricsReport,
    SpaceReport,
    StepDone,
)


def ts(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=UTC)


def at(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=UTC)


def slot(rec: SlotRecord) -> wire.Slot:
    statuses = {g.name: g.status for g in rec.gates}
    valid = G.episode_valid(statuses) if rec.gates else None
    return wire.Slot(
        id=rec.id,
        state=wire.SlotState(rec.status.value),
        checkpoint=rec.checkpoint,
        image=rec.image,
        episode=rec.episode,
        episode_id=rec.episode_id or None,
        parent=rec.parent,
        task_id=rec.task_id,
        task_setup=rec.task_setup,
        created_at=at(rec.created_at),
        last_used_at=at(rec.last_used_at),
        expires_at=ts(record_expires_at(rec)) if rec.status is not SlotStatus.destroyed else None,
        idle_timeout_s=rec.idle_timeout_s or 0.0,
        ttl_s=rec.ttl_s,
        quarantine_reason=rec.quarantine_reason,
        valid=valid,
        profile=rec.profile,
        labels=rec.labels,
        number=rec.number if rec.status is not SlotStatus.destroyed else None,
        ports=rec.ports if rec.status is not SlotStatus.destroyed else {},
    )


def checkpoint(cp: CheckpointRecord) -> wire.Checkpoint:
    return wire.Checkpoint(
        id=cp.id,
        kind=wire.CheckpointKind(cp.kind.value),
        image=cp.image,
        image_sha256=cp.image_sha256 or None,
        source_slot=cp.source_slot,
        created_at=at(cp.created_at),
        last_used_at=ts(cp.last_used_at),
        expires_at=ts(record_expires_at(cp)),
        size_mib=cp.size_mib,
        apparent_mib=cp.apparent_mib,
        upper_sha256=cp.upper_sha256,
        task_id=cp.task_id,
        profile=cp.profile,
    )


def gate_report(rec: SlotRecord) -> wire.GateReport:
    statuses = {g.name: g.status for g in rec.gates}
    return wire.GateReport(
        slot=rec.id,
        episode=rec.episode,
        episode_id=rec.episode_id,
        profile=rec.profile,
        gates=[
            wire.GateResult(
                name=g.name,
                status=wire.GateStatus(g.status),
                evidence=g.evidence,
                checked_at=ts(g.checked_at),
            )
            for g in rec.gates
        ],
        valid=G.episode_valid(statuses) if rec.gates else None,
        failed=G.failed_gates(statuses),
    )


def step(done: StepDone) -> wire.StepResult:
    """The screenshot goes as base64: under screenshot_png_b64 for a PNG (the default), else
    screenshot_b64 with its content type."""
    out = done.output
    shot = done.screenshot
    b64 = base64.b64encode(shot.data).decode() if shot is not None else None
    png = shot is not None and shot.content_type == "image/png"
    return wire.StepResult(
        slot=done.slot,
        episode=done.episode,
        action_type=done.action_type,
        elapsed_s=done.elapsed_s,
        actions=done.actions,
        terminal=done.terminal,
        output=wire.CommandOutput(returncode=out.returncode, stdout=out.stdout, stderr=out.stderr)
        if out is not None
        else None,
        screenshot_png_b64=b64 if png else None,
        screenshot_b64=None if png else b64,
        screenshot_content_type=shot.content_type if shot is not None else None,
        screenshot_width=shot.width if shot is not None else None,
        screenshot_height=shot.height if shot is not None else None,
        screenshot_cached=shot.cached if shot is not None else None,
        results=done.results,
    )


def fork(forked: Forked) -> wire.ForkResult:
    return wire.ForkResult(
        parent=forked.parent,
        children=[slot(c) for c in forked.children],
        checkpoint=forked.checkpoint,
        elapsed_s=forked.elapsed_s,
    )


def admission(report: AdmissionReport) -> wire.AdmissionState:
    return wire.AdmissionState(
        enabled=report.enabled,
        admitting=report.admitting,
        reason=report.reason,
        mem_available_mib=report.mem_available_mib,
        mem_total_mib=report.mem_total_mib,
        psi_memory_some_avg10=report.psi_memory_some_avg10,
        state_free_mib=report.state_free_mib,
        slot_cost_mib=report.slot_cost_mib,
        group_memory_limit_mib=report.group_memory_limit_mib,
        sampled_at=ts(report.sampled_at),
    )


def space(report: SpaceReport | None) -> wire.SpaceState | None:
    if report is None:
        return None
    return wire.SpaceState(
        path=report.path,
        free_mib=report.free_mib,
        total_mib=report.total_mib,
        free_pct=report.free_pct,
    )


def health(report: HealthReport) -> wire.Health:
    return wire.Health(
        status="ok" if report.status == "ok" else "degraded",
        version=report.version,
        profile=report.profile,
        slots_by_state=report.slots_by_state,
        checkpoints=[checkpoint(cp) for cp in report.checkpoints],
        admission=admission(report.admission),
        crash_watch=dict(report.crash_watch),
        state_dir=space(report.state_dir),
        journal_dir=space(report.journal_dir),
        forgotten_gib=report.forgotten_gib,
        pools=dict(report.pools),
        ksm=dict(report.ksm),
        services=dict(report.services),
        tasks=dict(report.tasks),
        warnings=report.warnings,
    )


def metrics(report: MetricsReport) -> wire.Metrics:
    return wire.Metrics(
        window_started_at=at(report.window_started_at),
        window_s=report.window_s,
        latencies={k: wire.LatencySummary.model_validate(v) for k, v in report.latencies.items()},
        episodes_by_verdict=report.episodes_by_verdict,
        failures_by_class=report.failures_by_class,
        counters=report.counters,
        cost=report.cost,
    )
