"""The record store: every journal write goes through here, off the event loop, in order.

A save updates memory at once and queues the journal write (the record is serialised at that
moment, so the queue holds each version as it was). One writer task runs the queue in a worker
thread, so no request waits on an fsync on the trio thread; a trio lock serialises it with
compaction and loading, and a thread lock keeps the synchronous shutdown flush from interleaving
with a batch still in its thread. `durable()` waits until everything queued so far is on disk:
operations call it where the journal must be ahead of the runtime (a record before a restore or a
dump) and before they answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import trio

from drumsd.core.journal import Event, JournalState, RecordKind, snapshot_events
from drumsd.linux.journal_io import Journal

if TYPE_CHECKING:
    from drumsd.core.records import CheckpointRecord, SlotRecord

log = logging.getLogger("drumsd.supervisor")

Write = Callable[[], None]


class Records(Protocol):
    """The records a snapshot is taken of (the supervisor's, as they are in memory)."""

    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def checkpoints(self) -> dict[str, CheckpointRecord]: ...
    @property
    def clock(self) -> Callable[[], float]: ...


def snapshot_of(sup: Records, last_seq: int) -> list[Event]:
    """The compacted journal of the supervisor's records as they are in memory now."""
    state = JournalState(slots=sup.slots, checkpoints=sup.checkpoints, last_seq=last_seq)
    return snapshot_events(state, sup.clock())


class RecordStore:
    """Journal writes queued in order and run by one writer task; compaction under the same lock."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self._queue: list[Write] = []
        self._queued = 0  # writes ever queued
        self._written = 0  # writes ever finished (in queue order)
        self._lock = trio.Lock()  # writer batches, compaction, load: one at a time
        self._io = threading.RLock()  # the journal's file I/O itself
        self._work = trio.Event()
        self._progress = trio.Event()
        self._running = False
        self.failures = 0
        self.last_error: str | None = None

    # --- writes (called synchronously from the operations) -------------------------------------

    def save(
        self, kind: RecordKind, record: dict[str, Any], event: str, now: float, *, file: bool
    ) -> None:
        self._submit(partial(self.journal.save, kind, record, event, now, file=file))

    def delete(self, kind: RecordKind, record_id: str, event: str, now: float) -> None:
        self._submit(partial(self.journal.delete, kind, record_id, event, now))

    def _submit(self, write: Write) -> None:
        if not self._running:  # no writer (not started yet, or stopped): write now, in order
            self._run_batch([write])
            self._queued += 1
            self._written += 1
            return
        self._queue.append(write)
        self._queued += 1
        self._work.set()

    # --- the writer ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task (in the supervisor's nursery), until cancelled."""
        self._running = True
        task_status.started()
        try:
            while True:
                await self._work.wait()
                self._work = trio.Event()
                async with self._lock:
                    await self._write_queued()
        finally:
            # Stopping (shutdown): what is still queued is written here, so a shielded task
            # waiting in durable() (a destroy still archiving) wakes to it on disk, and every
            # later save is written at once.
            self._running = False
            self.flush_sync()

    async def _write_queued(self) -> None:
        batch, self._queue = self._queue, []
        if batch:
            await self._in_thread(batch, partial(self._run_batch, batch))
            self._done(len(batch))

    async def _in_thread(self, batch: list[Write], fn: Callable[[], None]) -> None:
        """Run a taken batch's writes in a worker thread. trio checks for cancellation before the
        thread starts: cancelled there, the batch was not written and goes back to the queue's
        front (a thread once started is never abandoned)."""
        try:
            await trio.to_thread.run_sync(fn)
        except trio.Cancelled:
            self._queue[:0] = batch
            if self._running:
                self._work.set()
            else:
                self.flush_sync()
            raise

    def _run_batch(self, batch: list[Write]) -> None:
        with self._io:
            for write in batch:
                try:
                    write()
                except OSError as exc:
                    # The record stays in memory; the next save or compaction writes it again.
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.error("journal write failed: %s", exc)

    def _done(self, n: int) -> None:
        self._written += n
        self._wake()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def durable(self) -> None:
        """Wait until every write queued before this call is on disk."""
        target = self._queued
        while self._written < target:
            await self._progress.wait()

    def flush_sync(self) -> None:
        """Shutdown: write what is still queued, on this thread (runs even while cancelled)."""
        batch, self._queue = self._queue, []
        if batch:
            self._run_batch(batch)
            self._done(len(batch))

    @property
    def pending(self) -> int:
        return self._queued - self._written

    # --- whole-journal operations ---------------------------------------------------------------

    async def load(self) -> JournalState:
        async with self._lock:
            return await trio.to_thread.run_sync(self._locked, self.journal.load)

    async def compact(self, snapshot: Callable[[int], list[Event]]) -> None:
        """Replace events.jsonl by a snapshot of memory. The queue is taken in the same instant
        the snapshot is made and written before it, so no older version is appended after it."""
        async with self._lock:
            batch, self._queue = self._queue, []
            events = snapshot(self.journal.last_seq + len(batch))

            def write() -> None:
                with self._io:  # no flush between the batch and the snapshot replacing it
                    self._run_batch(batch)
                    self.journal.compact(events)

            await self._in_thread(batch, write)
            self._done(len(batch))

    async def events_of(self, record_id: str) -> list[str]:
        await self.durable()
        return await trio.to_thread.run_sync(
            self._locked, partial(self.journal.events_of, record_id)
        )

    async def events_size(self) -> int | None:
        return await trio.to_thread.run_sync(self.journal.events_size)

    def _locked(self, fn: Callable[[], Any]) -> Any:
        with self._io:
            return fn()
