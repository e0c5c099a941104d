"""Retention decisions: what a destroyed slot, a deleted saved state and a rejected dump leave
in `forgotten_dir`, and what caps delete.

Failed, invalid, quarantined and rejected slots keep a full archive (records, events, logs, gate
report, last screenshot); valid ones, and ones destroyed while a gate was still pending (a fork
child gone before `alive_after_resume` was judged), a small summary (all full with mode
keep_all). A deleted saved state and a rejected dump leave a small JSON record, capped with the
summaries. Caps delete oldest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from drumsd.core.config import Config
from drumsd.core.records import CheckpointKind, CheckpointRecord, SlotRecord

GIB = 1024**3

Keep = Literal["full", "summary"]
# What a checkpoint leaves when it goes: a saved state deleted (by API, lease or cap), or a dump
# that never became a state (refused, failed, timed out). Each in its own subdirectory.
CheckpointGone = Literal["state", "dump"]
CHECKPOINT_DIRS: dict[CheckpointGone, str] = {"state": "states", "dump": "dumps"}
# Neither a failure nor a success: the episode ended before every gate was judged.
NOT_FAILURES = {"valid", "pending"}


def keep_kind(slot: SlotRecord, mode: str) -> Keep:
    if mode == "keep_all":
        return "full"
    if slot.failure or slot.quarantine_reason or any(v not in NOT_FAILURES for v in slot.verdicts):
        return "full"
    if any(g.status == "fail" for g in slot.gates):
        return "full"
    return "summary"


def slot_outcome(slot: SlotRecord) -> str:
    """What a summary says of a slot: `valid`, or `pending_at_destroy` (with its last episode's
    gates unjudged, e.g. a fork child destroyed before `alive_after_resume` was judged)."""
    if slot.verdicts and slot.verdicts[-1] == "pending":
        return "pending_at_destroy"
    return "valid"


def checkpoint_gone(cp: CheckpointRecord) -> CheckpointGone | None:
    """Which record a checkpoint's deletion leaves: a dump never made ready is a rejected dump;
    a saved state or task checkpoint a deleted state; preforks (made and dropped by forks, many
    a minute) and templates (rebuilt from their image) none."""
    if not cp.ready:
        return "dump"
    if cp.kind in (CheckpointKind.saved, CheckpointKind.task):
        return "state"
    return None


def checkpoint_summary(
    cp: CheckpointRecord, gone: CheckpointGone, why: str, now: float
) -> dict[str, object]:
    """The JSON record of a deleted state or a rejected dump: what, why, when, ids, sizes."""
    return {
        "what": {"state": "saved state deleted", "dump": "dump rejected"}[gone],
        "why": why,
        "at": now,
        "id": cp.id,
        "kind": cp.kind.value,
        "source_slot": cp.source_slot,
        "source_episode": cp.source_episode,
        "task_id": cp.task_id,
        "task_key": cp.task_key,
        "image": cp.image,
        "image_sha256": cp.image_sha256,
        "upper_sha256": cp.upper_sha256,
        "created_at": cp.created_at,
        "last_used_at": cp.last_used_at,
        "idle_timeout_s": cp.idle_timeout_s,
        "ttl_s": cp.ttl_s,
        "size_mib": cp.size_mib,
        "apparent_mib": cp.apparent_mib,
        "dir": cp.dir,
    }


@dataclass(frozen=True)
class Archived:
    path: str
    kind: Keep
    size: int
    mtime: float


def over_cap(files: Sequence[Archived], cap_bytes: float | None) -> list[Archived]:
    """The oldest files to delete so the rest fit under `cap_bytes` (None: no cap)."""
    if cap_bytes is None:
        return []
    total = sum(f.size for f in files)
    doomed: list[Archived] = []
    for f in sorted(files, key=lambda f: (f.mtime, f.path)):
        if total <= cap_bytes:
            break
        doomed.append(f)
        total -= f.size
    return doomed


def gib(cap: float | None) -> float | None:
    return None if cap is None else cap * GIB


def files_to_delete(files: Sequence[Archived], config: Config) -> list[Archived]:
    """Apply the per-kind caps, then the overall forgotten_max_gib cap; a null cap deletes
    nothing, so by default full archives (failures) are kept however many there are."""
    summaries = [f for f in files if f.kind == "summary"]
    fulls = [f for f in files if f.kind == "full"]
    doomed = over_cap(summaries, config.retention.summary_max_gib * GIB)
    doomed += over_cap(fulls, gib(config.retention.full_max_gib))
    gone = {f.path for f in doomed}
    rest = [f for f in files if f.path not in gone]
    doomed += over_cap(rest, gib(config.forgotten_max_gib))
    return doomed


def forgotten_warnings(files: Sequence[Archived], config: Config) -> list[str]:
    total_gib = sum(f.size for f in files) / GIB
    if total_gib > config.retention.forgotten_warn_gib:
        return [
            f"forgotten_dir holds {total_gib:.2f} GiB, past retention.forgotten_warn_gib="
            f"{config.retention.forgotten_warn_gib:g}; lower the caps or move the archives"
        ]
    return []
