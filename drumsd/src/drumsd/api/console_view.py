"""What the console shows of a slot: one row per live slot for the grid, with its gate lights,
verdict and last verify. Pure: records and results in, JSON-ready dicts out."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from drums.models import VerifyResult

from drumsd.core import gates as G
from drumsd.core.leases import record_expires_at
from drumsd.core.records import SlotRecord, SlotStatus

FACETS = ("state", "task", "image", "verdict")


def slot_row(rec: SlotRecord, now: float, last_verify: VerifyResult | None) -> dict[str, Any]:
    statuses = {g.name: g.status for g in rec.gates}
    lights = {name: statuses.get(name, G.PENDING) for name in G.GATES}
    expires = record_expires_at(rec) if rec.status is not SlotStatus.destroyed else None
    verify = None
    if last_verify is not None and last_verify.episode == rec.episode:
        verify = {
            "score": last_verify.score,
            "verdict": last_verify.verdict,
            "trusted": last_verify.trusted,
            "audit_flags": list(last_verify.audit.flags),
            "checker_error": last_verify.checker_error,
        }
    return {
        "id": rec.id,
        "state": rec.status.value,
        "image": rec.image or "",
        "task": rec.task_id or "",
        "episode": rec.episode,
        "episode_id": rec.episode_id,
        "profile": rec.profile,
        "parent": rec.parent,
        "age_s": round(now - rec.created_at, 1),
        "episode_age_s": (
            round(now - rec.episode_started_at, 1) if rec.episode_started_at is not None else None
        ),
        "idle_s": round(now - rec.last_used_at, 1),
        "lease_s": round(expires - now, 1) if expires is not None else None,
        "actions": rec.actions,
        "gates": lights,
        "failed_gates": G.failed_gates(statuses),
        "verdict": G.verdict(statuses, rec.status is SlotStatus.quarantined),
        "quarantine_reason": rec.quarantine_reason,
        "verify": verify,
        "audit_flags": verify["audit_flags"] if verify else [],
        "labels": dict(rec.labels),
    }


def facets(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """The values each filter can take, from the rows shown."""
    seen: dict[str, set[str]] = {name: set() for name in FACETS}
    for row in rows:
        for name in FACETS:
            if row[name]:
                seen[name].add(str(row[name]))
    return {name: sorted(values) for name, values in seen.items()}


def timeline(lines: Iterable[str], limit: int = 500) -> list[dict[str, Any]]:
    """A slot's journal events (create, ready, gates, touched, reset, quarantined, destroyed...)
    as time, event, state, episode and action count; the newest `limit`."""
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        record = event.get("record") or {}
        out.append(
            {
                "ts": event.get("ts"),
                "event": event.get("event", ""),
                "state": record.get("status"),
                "episode": record.get("episode"),
                "actions": record.get("actions"),
                "last_action": record.get("last_action"),
            }
        )
    return out[-limit:]


# Journal events the episode timeline leaves out: lazy saves of counters, and gate saves (their
# changes are shown as gate entries).
QUIET_EVENTS = frozenset({"touched", "gates"})


def episode_timeline(
    lines: Iterable[str],
    steps: Iterable[Mapping[str, Any]],
    episode_id: str | None,
    started_at: float | None,
) -> list[dict[str, Any]]:
    """The current episode as one list in time order: its journal events (reset, ready,
    quarantined, ...), each step (action, time, duration, how it ended) and each gate change
    (from the records the journal kept), a gate change naming the step it followed."""
    entries: list[dict[str, Any]] = []
    gates: dict[str, str] = {}
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        record = event.get("record") or {}
        if episode_id is None or record.get("episode_id") != episode_id:
            continue
        ts = event.get("ts")
        name = event.get("event", "")
        if name not in QUIET_EVENTS:
            entries.append(
                {"kind": "event", "ts": ts, "event": name, "state": record.get("status")}
            )
        for gate in record.get("gates") or []:
            status = gate.get("status", G.PENDING)
            if gates.get(gate.get("name"), G.PENDING) != status:
                entries.append(
                    {
                        "kind": "gate",
                        "ts": gate.get("checked_at") or ts,
                        "gate": gate.get("name"),
                        "status": status,
                        "evidence": gate.get("evidence") or {},
                    }
                )
            gates[gate.get("name")] = status
    for step in steps:
        entries.append({"kind": "step", "ts": step["started_at"], **step})
    entries.sort(key=lambda e: (e["ts"] is None, e["ts"] or 0.0))
    origin = started_at
    if origin is None:
        origin = next((e["ts"] for e in entries if e["ts"] is not None), None)
    last_step = None
    for entry in entries:
        if entry["kind"] == "step":
            last_step = entry["index"]
        elif entry["kind"] == "gate":
            entry["after_step"] = last_step
        entry["offset_s"] = (
            round(entry["ts"] - origin, 3) if entry["ts"] is not None and origin else None
        )
    return entries
