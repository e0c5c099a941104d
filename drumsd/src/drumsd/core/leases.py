"""Lease decisions: when a slot or a saved state expires (idle timeout or time-to-live).

Every request naming a slot renews it (last_used_at = now); the reaper asks `expired_*` every
`reap_interval_s` and destroys what they return exactly like an explicit destroy.
"""

from __future__ import annotations

from dataclasses import dataclass

from drumsd.core.config import Config
from drumsd.core.records import CheckpointKind, CheckpointRecord, SlotRecord, SlotStatus

# Destroyed slots stay as tombstones (so their id answers 410 env_gone) for this long.
TOMBSTONE_KEEP_S = 7 * 86400.0


@dataclass(frozen=True)
class Lease:
    idle_timeout_s: float | None
    ttl_s: float | None


def slot_lease(config: Config, idle_timeout_s: float | None, ttl_s: float | None) -> Lease:
    """The lease of a new slot: per-request overrides, else the config's env defaults."""
    return Lease(
        idle_timeout_s=idle_timeout_s or config.lease.env_idle_timeout_s,
        ttl_s=ttl_s if ttl_s is not None else config.lease.env_ttl_s,
    )


def checkpoint_lease(
    config: Config, kind: CheckpointKind, idle_timeout_s: float | None, ttl_s: float | None
) -> Lease:
    if kind is CheckpointKind.template:
        return Lease(None, None)  # templates live as long as their image
    if kind is CheckpointKind.prefork:
        # A prefork is only worth reusing while young; it never outlives prefork_max_age_s.
        return Lease(idle_timeout_s or config.prefork_max_age_s, config.prefork_max_age_s)
    if kind is CheckpointKind.task:
        tc = config.task_checkpoints
        return Lease(
            idle_timeout_s=idle_timeout_s or tc.idle_timeout_s,
            ttl_s=ttl_s if ttl_s is not None else tc.ttl_s,
        )
    return Lease(
        idle_timeout_s=idle_timeout_s or config.lease.state_idle_timeout_s,
        ttl_s=ttl_s if ttl_s is not None else config.lease.state_ttl_s,
    )


def child_lease(
    config: Config, maker: SlotRecord, idle_timeout_s: float | None, ttl_s: float | None
) -> Lease:
    """The lease of a fork child: per-request overrides, else its maker's lease (not the
    config's env defaults: a client that asked for a 60 s idle timeout must not leave children
    that live for 1,800 s after it dies; issue 14, finding 8)."""
    return Lease(
        idle_timeout_s=idle_timeout_s or maker.idle_timeout_s or config.lease.env_idle_timeout_s,
        ttl_s=ttl_s if ttl_s is not None else maker.ttl_s,
    )


def saved_checkpoint_lease(
    config: Config, maker: SlotRecord, idle_timeout_s: float | None, ttl_s: float | None
) -> Lease:
    """The lease of a checkpoint saved from `maker`: per-request overrides, else the maker's
    idle timeout (the checkpoint is as abandoned as its slot when the client stops); the TTL
    counts from the checkpoint's own creation, so it stays the config's unless asked for."""
    base = checkpoint_lease(config, CheckpointKind.saved, idle_timeout_s, ttl_s)
    if idle_timeout_s is None and maker.idle_timeout_s is not None:
        return Lease(maker.idle_timeout_s, base.ttl_s)
    return base


def expires_at(
    created_at: float, last_used_at: float, idle_timeout_s: float | None, ttl_s: float | None
) -> float | None:
    candidates = []
    if idle_timeout_s is not None:
        candidates.append(last_used_at + idle_timeout_s)
    if ttl_s is not None:
        candidates.append(created_at + ttl_s)
    return min(candidates) if candidates else None


def record_expires_at(record: SlotRecord | CheckpointRecord) -> float | None:
    return expires_at(record.created_at, record.last_used_at, record.idle_timeout_s, record.ttl_s)


def expiry_reason(record: SlotRecord | CheckpointRecord, now: float) -> str | None:
    """Why this record's lease is over, or None while it holds."""
    if record.ttl_s is not None and now >= record.created_at + record.ttl_s:
        return f"ttl {record.ttl_s:g}s reached"
    if record.idle_timeout_s is not None and now >= record.last_used_at + record.idle_timeout_s:
        return (
            f"idle for {now - record.last_used_at:.0f}s (idle timeout {record.idle_timeout_s:g}s)"
        )
    return None


def expired_slots(slots: list[SlotRecord], now: float) -> list[tuple[SlotRecord, str]]:
    """Live or failed slots whose lease is over (failed ones too: they still hold resources)."""
    out = []
    for slot in slots:
        if slot.status is SlotStatus.destroyed:
            continue
        reason = expiry_reason(slot, now)
        if reason is not None:
            out.append((slot, reason))
    return out


def expired_checkpoints(
    checkpoints: list[CheckpointRecord], referenced: set[str], now: float
) -> list[tuple[CheckpointRecord, str]]:
    """Saved states and preforks past their lease that no live slot restores from."""
    out = []
    for cp in checkpoints:
        if cp.kind is CheckpointKind.template or cp.id in referenced:
            continue
        reason = expiry_reason(cp, now)
        if reason is not None:
            out.append((cp, reason))
    return out


def stale_tombstones(slots: list[SlotRecord], now: float) -> list[SlotRecord]:
    return [
        s
        for s in slots
        if s.status is SlotStatus.destroyed
        and s.destroyed_at is not None
        and now - s.destroyed_at > TOMBSTONE_KEEP_S
    ]


def prefork_reusable(cp: CheckpointRecord, slot: SlotRecord, now: float, max_age_s: float) -> bool:
    """A prefork can replace a fresh dump when it is of this slot's current state (same
    episode, no action since) and younger than prefork_max_age_s."""
    return (
        cp.kind is CheckpointKind.prefork
        and cp.ready
        and not cp.delete_when_unused
        and cp.source_slot == slot.id
        and cp.source_episode == slot.episode
        and cp.source_actions == slot.actions
        and now - cp.created_at < max_age_s
    )
