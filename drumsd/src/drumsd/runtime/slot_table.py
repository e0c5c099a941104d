"""The slot table: the slot and checkpoint records, each slot's lock, and every record save.

The operations refresh, check and save through it: `locked(slot_id, check)` takes the slot's
lock, looks the record up again and runs the pure check in one line; `save_slot` and
`save_checkpoint` change memory at once and queue the journal write on the record store.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from drumsd.core.errors import DrumsdError
from drumsd.core.records import (
    CheckpointRecord,
    SlotRecord,
    check_is_known,
    check_not_destroyed,
    is_live,
)
from drumsd.runtime.slot_locks import SlotLock, caller_name
from drumsd.runtime.store import RecordStore

log = logging.getLogger("drumsd.supervisor")


def _no_hook(rec: SlotRecord) -> None:
    return None


class SlotTable:
    """Owns the records and the per-slot locks; the supervisor and the operations share one."""

    def __init__(
        self,
        store: RecordStore,
        clock: Callable[[], float],
        *,
        on_slot_saved: Callable[[SlotRecord], None] = _no_hook,
    ) -> None:
        self.store = store
        self.clock = clock
        self.on_slot_saved = on_slot_saved  # every slot save (the port listeners follow it)
        self.slots: dict[str, SlotRecord] = {}
        self.checkpoints: dict[str, CheckpointRecord] = {}
        self.locks: dict[str, SlotLock] = {}  # a slot's lock names its holder (health)
        self._dirty: set[str] = set()  # renewed or stepped since their last save

    def load(self, slots: dict[str, SlotRecord], checkpoints: dict[str, CheckpointRecord]) -> None:
        """The records as the journal left them (a start's reconcile)."""
        self.slots, self.checkpoints = slots, checkpoints

    # --- locks ----------------------------------------------------------------------------------

    def lock(self, slot_id: str) -> SlotLock:
        return self.locks.setdefault(slot_id, SlotLock())

    def locked(
        self,
        slot_id: str,
        check: Callable[[SlotRecord], object],
        *,
        op: str | None = None,
        deadline_s: float | None = None,
    ) -> AbstractAsyncContextManager[SlotRecord]:
        """`async with table.locked(slot_id, check_can_x) as rec:` takes the slot's lock (held
        in the name of `op`, by default the calling function), looks the record up again
        (refresh) and runs the pure check on it, which raises the operation's typed error."""
        op = op or caller_name()
        return self._locked(slot_id, check, op, deadline_s)

    @asynccontextmanager
    async def _locked(
        self,
        slot_id: str,
        check: Callable[[SlotRecord], object],
        op: str,
        deadline_s: float | None,
    ) -> AsyncIterator[SlotRecord]:
        async with self.lock(slot_id).hold(op, deadline_s):
            rec = self.get_slot(slot_id)
            check(rec)
            yield rec

    # --- lookups --------------------------------------------------------------------------------

    def get_slot(self, slot_id: str, *, renew: bool = True) -> SlotRecord:
        rec = check_is_known(self.slots.get(slot_id), slot_id)
        check_not_destroyed(rec)
        if renew and is_live(rec):
            rec.last_used_at = self.clock()
            self._dirty.add(rec.id)
        return rec

    def list_slots(self, include_all: bool = False) -> list[SlotRecord]:
        recs = sorted(self.slots.values(), key=lambda r: r.created_at)
        return recs if include_all else [r for r in recs if is_live(r)]

    def get_checkpoint(self, checkpoint_id: str) -> CheckpointRecord:
        cp = self.checkpoints.get(checkpoint_id)
        if cp is None:
            raise DrumsdError(
                "not_found",
                f"no checkpoint {checkpoint_id!r}; list them with GET /v1/checkpoints",
            )
        return cp

    def list_checkpoints(self) -> list[CheckpointRecord]:
        return sorted(self.checkpoints.values(), key=lambda c: c.created_at)

    # --- saves ----------------------------------------------------------------------------------

    def save_slot(self, rec: SlotRecord, event: str, *, file: bool = True) -> None:
        self.on_slot_saved(rec)
        rec.rev += 1
        self.slots[rec.id] = rec
        self.store.save("slot", rec.model_dump(mode="json"), event, self.clock(), file=file)
        self._dirty.discard(rec.id)
        log.info(
            "slot=%s episode=%s status=%s event=%s", rec.id, rec.episode, rec.status.value, event
        )

    def save_checkpoint(self, cp: CheckpointRecord, event: str) -> None:
        cp.rev += 1
        self.checkpoints[cp.id] = cp
        self.store.save("checkpoint", cp.model_dump(mode="json"), event, self.clock(), file=True)
        log.info("checkpoint=%s kind=%s event=%s", cp.id, cp.kind.value, event)

    def touch(self, slot_id: str) -> None:
        """A renewal or a step counter: saved lazily, at the next `flush_dirty`."""
        self._dirty.add(slot_id)

    def flush_dirty(self) -> None:
        """Renewals and step counters are saved lazily (not on every step, for latency)."""
        for slot_id in list(self._dirty):
            rec = self.slots.get(slot_id)
            if rec is not None:
                self.save_slot(rec, "touched", file=False)
        self._dirty.clear()

    def settled(self, slot_id: str) -> None:
        """A destroyed slot: nothing of it is left to save lazily."""
        self._dirty.discard(slot_id)

    def forget(self, slot_id: str) -> None:
        """A tombstone dropped: its record and its lock go (the journal delete is the caller's)."""
        self.slots.pop(slot_id, None)
        self.locks.pop(slot_id, None)
        self._dirty.discard(slot_id)
