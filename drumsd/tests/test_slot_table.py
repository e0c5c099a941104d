"""The slot table on its own (a list stands in for the record store): `locked` refreshes and checks
under the slot's lock in the calling operation's name, saves bump the revision and reach the
store, lazy renewals are flushed once, a forgotten slot leaves nothing behind."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from drumsd.core.errors import DrumsdError
from drumsd.core.records import CheckpointKind, CheckpointRecord, SlotRecord, SlotStatus
from drumsd.core.records import check_can_step as can_step
from drumsd.runtime.slot_table import SlotTable

pytestmark = pytest.mark.unit


class ListStore:
    def __init__(self) -> None:
        self.saved: list[tuple[str, str, str, bool]] = []

    def save(self, kind: str, record: dict[str, Any], event: str, now: float, *, file: bool):
        self.saved.append((kind, record["id"], event, file))


def table_with(*recs: SlotRecord) -> tuple[SlotTable, ListStore, list[str]]:
    store, seen = ListStore(), []
    table = SlotTable(store, lambda: 100.0, on_slot_saved=lambda rec: seen.append(rec.id))  # type: ignore[arg-type]
    for rec in recs:
        table.slots[rec.id] = rec
    return table, store, seen


def slot(slot_id: str, status: SlotStatus = SlotStatus.ready) -> SlotRecord:
    return SlotRecord(id=slot_id, created_at=1.0, last_used_at=1.0, checkpoint="c", status=status)


async def test_locked_refreshes_checks_and_names_the_calling_operation() -> None:
    table, _, _ = table_with(slot("s1"))
    seen: list[str | None] = []

    async def step_like() -> None:
        async with table.locked("s1", can_step) as rec:
            assert rec is table.slots["s1"]
            assert rec.last_used_at == 100.0  # refreshed: the lease renewed
            holder = table.lock("s1").holder
            seen.append(holder.op if holder else None)

    await step_like()
    assert seen == ["step_like"]
    assert not table.lock("s1").locked()


async def test_locked_refuses_by_the_check_and_frees_the_lock() -> None:
    table, _, _ = table_with(slot("s1", SlotStatus.quarantined))
    with pytest.raises(DrumsdError) as err:
        async with table.locked("s1", can_step):
            raise AssertionError("the body must not run when the check refuses")
    assert err.value.code == "quarantined"
    assert not table.lock("s1").locked()


async def test_locked_waits_for_the_holder_and_sees_its_change() -> None:
    table, _, _ = table_with(slot("s1"))
    order: list[str] = []

    async def holder() -> None:
        async with table.locked("s1", can_step, op="reset", deadline_s=5.0) as rec:
            order.append("reset")
            await trio.sleep(1)
            rec.status = SlotStatus.quarantined  # what a failed gate would do meanwhile

    async def waiter() -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert table.lock("s1").holder is not None
        assert table.lock("s1").holder.deadline_s == 5.0
        with pytest.raises(DrumsdError):
            async with table.locked("s1", can_step):
                order.append("step")
        order.append("refused")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        nursery.start_soon(waiter)
    assert order == ["reset", "refused"]


def test_unknown_and_destroyed_slots_are_refused() -> None:
    table, _, _ = table_with(slot("gone", SlotStatus.destroyed))
    with pytest.raises(DrumsdError) as err:
        table.get_slot("nope")
    assert err.value.code == "not_found"
    with pytest.raises(DrumsdError) as err:
        table.get_slot("gone")
    assert err.value.code == "env_gone"
    with pytest.raises(DrumsdError) as err:
        table.get_checkpoint("nope")
    assert err.value.code == "not_found"


def test_saves_bump_the_revision_reach_the_store_and_the_hook() -> None:
    rec = slot("s1")
    table, store, seen = table_with()
    table.save_slot(rec, "created")
    table.save_slot(rec, "ready", file=False)
    cp = CheckpointRecord(
        id="c", kind=CheckpointKind.saved, created_at=1.0, last_used_at=1.0, dir="/x"
    )
    table.save_checkpoint(cp, "dumping")
    assert rec.rev == 2 and cp.rev == 1
    assert store.saved == [
        ("slot", "s1", "created", True),
        ("slot", "s1", "ready", False),
        ("checkpoint", "c", "dumping", True),
    ]
    assert seen == ["s1", "s1"]
    assert table.get_checkpoint("c") is cp and table.list_checkpoints() == [cp]


def test_renewals_are_saved_once_at_the_flush_and_not_after_a_save() -> None:
    table, store, _ = table_with(slot("s1"), slot("s2"))
    table.get_slot("s1")  # renews: saved lazily
    table.touch("s2")
    table.flush_dirty()
    table.flush_dirty()
    assert sorted(e[1] for e in store.saved) == ["s1", "s2"]
    store.saved.clear()
    table.get_slot("s1")
    table.save_slot(table.slots["s1"], "stepped")  # the save covers the renewal
    table.touch("s2")
    table.settled("s2")  # destroyed meanwhile: nothing left to save
    table.flush_dirty()
    assert [e[2] for e in store.saved] == ["stepped"]


def test_forget_drops_the_record_and_its_lock() -> None:
    table, store, _ = table_with(slot("s1"))
    table.lock("s1")
    table.touch("s1")
    table.forget("s1")
    table.flush_dirty()
    assert "s1" not in table.slots and "s1" not in table.locks and store.saved == []
