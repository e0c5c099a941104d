"""Retention decisions: what a destroyed slot leaves in `forgotten_dir`, and what caps delete.

Failed, invalid, quarantined and rejected slots keep a full archive (records, events, logs, gate
report, last screenshot); valid ones a small summary (all full with mode keep_all). Caps delete
oldest first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from drumsd.core.config import Config
from drumsd.core.records import SlotRecord

GIB = 1024**3

Keep = Literal["full", "summary"]


def keep_kind(slot: SlotRecord, mode: str) -> Keep:
    if mode == "keep_all":
        return "full"
    if slot.failure or slot.quarantine_reason or any(v != "valid" for v in slot.verdicts):
        return "full"
    if any(g.status == "fail" for g in slot.gates):
        return "full"
    return "summary"


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
