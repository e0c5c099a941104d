"""Core records -> wire models. The only place internal state is shaped for the API."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

from drums import models as wire

from drumsd.core import gates as G
from drumsd.core.leases import record_expires_at
from drumsd.core.records import CheckpointRecord, SlotRecord, SlotStatus
from drumsd.core.results import Forked, StepDone


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


def health(data: dict[str, Any]) -> wire.Health:
    admission = dict(data["admission"])
    admission["sampled_at"] = ts(admission.get("sampled_at"))
    return wire.Health(
        status=data["status"],
        version=data["version"],
        profile=data["profile"],
        slots_by_state=data["slots_by_state"],
        checkpoints=[checkpoint(cp) for cp in data["checkpoints"]],
        admission=wire.AdmissionState(**admission),
        crash_watch=data["crash_watch"],
        state_dir=wire.SpaceState(**data["state_dir"]) if data["state_dir"] else None,
        journal_dir=wire.SpaceState(**data["journal_dir"]) if data["journal_dir"] else None,
        forgotten_gib=data["forgotten_gib"],
        pools=data["pools"],
        ksm=data.get("ksm", {}),
        services=data.get("services", {}),
        tasks=data.get("tasks", {}),
        warnings=data["warnings"],
    )


def metrics(data: dict[str, Any]) -> wire.Metrics:
    return wire.Metrics(
        window_started_at=at(data["window_started_at"]),
        window_s=data["window_s"],
        latencies={k: wire.LatencySummary(**v) for k, v in data["latencies"].items()},
        episodes_by_verdict=data["episodes_by_verdict"],
        failures_by_class=data["failures_by_class"],
        counters=data["counters"],
        cost=data["cost"],
    )
