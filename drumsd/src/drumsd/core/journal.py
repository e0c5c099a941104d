"""Journal events and folding: `events.jsonl` plus the record files -> the daemon's state.

An event carries the whole record after the change, so folding is "highest rev wins" per id and a
crash between writing a record file and appending its event (or the other way round) loses
nothing. Torn last lines (a kill -9 mid-append) are skipped and counted.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from drumsd.core.records import CheckpointRecord, SlotRecord

RecordKind = Literal["slot", "checkpoint"]


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore")

    seq: int
    ts: float
    kind: RecordKind
    id: str
    event: str  # created, ready, reset, quarantined, destroyed, deleted, ...
    record: dict[str, Any] | None = None  # None when the record was deleted


@dataclass
class JournalState:
    slots: dict[str, SlotRecord] = field(default_factory=dict)
    checkpoints: dict[str, CheckpointRecord] = field(default_factory=dict)
    deleted_checkpoints: set[str] = field(default_factory=set)
    last_seq: int = 0
    skipped_lines: int = 0


def parse_event_lines(lines: Iterable[str]) -> tuple[list[Event], int]:
    """Events in file order, and how many lines were unreadable (a torn tail)."""
    events: list[Event] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        try:
            events.append(Event.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError):
            skipped += 1
    return events, skipped


def fold(
    record_files: Iterable[tuple[RecordKind, dict[str, Any]]],
    events: Iterable[Event],
) -> JournalState:
    """Merge record files and events: per id, the highest rev; a delete event with a rev at
    least as high as any record removes it."""
    state = JournalState()
    deleted_rev: dict[tuple[str, str], int] = {}
    for kind, data in record_files:
        _offer(state, kind, data)
    for event in events:
        state.last_seq = max(state.last_seq, event.seq)
        if event.record is None:
            deleted_rev[(event.kind, event.id)] = max(
                deleted_rev.get((event.kind, event.id), -1), _rev_of_delete(event)
            )
            continue
        _offer(state, event.kind, event.record)
    for (deleted_kind, record_id), rev in deleted_rev.items():
        table: dict[str, Any] = state.slots if deleted_kind == "slot" else state.checkpoints
        current = table.get(record_id)
        if current is not None and current.rev <= rev:
            del table[record_id]
            if deleted_kind == "checkpoint":
                state.deleted_checkpoints.add(record_id)
    return state


def _rev_of_delete(event: Event) -> int:
    # A delete is logged after the last save, so it outranks every rev seen so far for the id.
    return 1 << 62


def _offer(state: JournalState, kind: str, data: dict[str, Any]) -> None:
    try:
        if kind == "slot":
            slot = SlotRecord.model_validate(data)
            if slot.id not in state.slots or state.slots[slot.id].rev <= slot.rev:
                state.slots[slot.id] = slot
        elif kind == "checkpoint":
            cp = CheckpointRecord.model_validate(data)
            if cp.id not in state.checkpoints or state.checkpoints[cp.id].rev <= cp.rev:
                state.checkpoints[cp.id] = cp
    except ValidationError:
        state.skipped_lines += 1


def snapshot_events(state: JournalState, now: float) -> list[Event]:
    """The compacted journal: one event per record, written on start to bound the file."""
    events: list[Event] = []
    seq = state.last_seq
    for slot in state.slots.values():
        seq += 1
        events.append(
            Event(
                seq=seq,
                ts=now,
                kind="slot",
                id=slot.id,
                event="snapshot",
                record=slot.model_dump(mode="json"),
            )
        )
    for cp in state.checkpoints.values():
        seq += 1
        events.append(
            Event(
                seq=seq,
                ts=now,
                kind="checkpoint",
                id=cp.id,
                event="snapshot",
                record=cp.model_dump(mode="json"),
            )
        )
    return events
