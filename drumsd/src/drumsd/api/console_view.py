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
