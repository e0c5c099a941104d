"""The record store's writer and `durable()` (a stand-in journal: this layer's own logic)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from drumsd.runtime.store import RecordStore

pytestmark = pytest.mark.unit


class ListJournal:
    def __init__(self) -> None:
        self.saved: list[tuple[str, str]] = []

    def save(self, kind, record, event, now, *, file) -> None:
        self.saved.append((record["id"], event))


@asynccontextmanager
async def writer_running(store: RecordStore) -> AsyncIterator[trio.CancelScope]:
    """The store's writer in a nursery, under a cancel scope of its own (its stop, when the body
    cancels it), blocked waiting for work when the body starts."""
    writer = trio.CancelScope()

    async def run_writer() -> None:
        with writer:
            await store.run()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_writer)
        await trio.testing.wait_all_tasks_blocked()
        yield writer


async def test_writes_reach_the_journal_in_order_before_durable_returns() -> None:
    journal = ListJournal()
    store = RecordStore(journal)
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        for n in range(3):
            store.save("slot", {"id": f"s{n}"}, "created", 0.0, file=True)
        with trio.fail_after(5):
            await store.durable()
        assert journal.saved == [("s0", "created"), ("s1", "created"), ("s2", "created")]
        assert store.pending == 0
        nursery.cancel_scope.cancel()


async def test_a_durable_wait_outlives_a_stopped_writer() -> None:
    """The daemon stopping while a shielded destroy waits for its record to be on disk (the
    reaper's destroy as a test's supervisor exits): the stopping writer writes what is queued,
    so the wait ends instead of lasting forever."""
    journal = ListJournal()
    store = RecordStore(journal)
    async with writer_running(store) as writer:
        store.save("slot", {"id": "s0"}, "destroyed", 0.0, file=True)
        writer.cancel()  # the writer stops before it takes the batch
        with trio.fail_after(5):
            await store.durable()
    assert journal.saved == [("s0", "destroyed")]
    assert store.pending == 0
    # With no writer, a save is written at once, in order.
    store.save("slot", {"id": "s1"}, "destroyed", 0.0, file=True)
    assert journal.saved[-1] == ("s1", "destroyed") and store.pending == 0


async def test_a_batch_cancelled_before_its_thread_starts_is_not_lost() -> None:
    """trio checks for cancellation before a worker thread starts: a writer cancelled right after
    it took a batch put it back and wrote it on its way out (the reaper's destroy hung on this
    lost batch as its supervisor stopped)."""
    journal = ListJournal()
    store = RecordStore(journal)
    async with writer_running(store) as writer:
        await store._lock.acquire()  # as a compaction would hold it
        store.save("slot", {"id": "s0"}, "destroyed", 0.0, file=True)
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for the lock
        store._lock.release()  # handed to the writer, which has not run yet
        writer.cancel()  # so it takes the batch and is cancelled at the thread's start
        with trio.fail_after(5):
            await store.durable()
    assert journal.saved == [("s0", "destroyed")]
    assert store.pending == 0
