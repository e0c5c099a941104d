"""Teardown shared by the operations: destroy a slot's tree with a deadline, archive its record."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.records import (
    SlotRecord,
    SlotStatus,
)
from drumsd.core.retention import keep_kind
from drumsd.runtime.episodes import EpisodesHost, finish_episode, retiring, untrack
from drumsd.runtime.failures import bounded_cleanup
from drumsd.runtime.forgotten import write_forgotten
from drumsd.runtime.ops_checkpoints import CheckpointsHost, delete_unused_checkpoints

if TYPE_CHECKING:
    from drumsd.core.metrics import Histogram
    from drumsd.core.seams import SlotRuntime
    from drumsd.runtime.admission_book import AdmissionBook
    from drumsd.runtime.console_state import ConsoleState
    from drumsd.runtime.verifier import TaskCatalog

log = logging.getLogger("drumsd.supervisor")


class TeardownHost(EpisodesHost, CheckpointsHost, Protocol):
    """What a slot's teardown and archive use of the supervisor."""

    @property
    def admission_book(self) -> AdmissionBook: ...
    @property
    def console(self) -> ConsoleState: ...
    @property
    def nursery(self) -> trio.Nursery | None: ...
    @property
    def runtime(self) -> SlotRuntime: ...
    @property
    def slot_latency(self) -> dict[str, dict[str, Histogram]]: ...
    @property
    def tasks(self) -> TaskCatalog: ...


async def discard(sup: TeardownHost, rec: SlotRecord, failure: str) -> None:
    """A slot that never became ready: clean the runtime side, keep a full archive."""
    rec.failure = failure
    await _tear_down(sup, rec, "cleanup after failure", "rejected")


async def destroy_locked(
    sup: TeardownHost, rec: SlotRecord, reason: str, rejected: bool = False
) -> None:
    if rec.status is not SlotStatus.failed:
        finish_episode(sup, rec)
    if rejected:
        rec.failure = rec.failure or reason
    await _tear_down(sup, rec, "destroy", f"destroyed ({reason})")
    await trio.to_thread.run_sync(sup.tasks.forget_slot, rec.id)
    sup.console.forget(rec.id)
    sup.slot_latency.pop(rec.id, None)
    sup.admission_book.forget(rec.id)
    sup.table.settled(rec.id)
    # Preforks of a gone slot, and states deleted "when unused", go with their last child.
    await delete_unused_checkpoints(sup)


async def _tear_down(sup: TeardownHost, rec: SlotRecord, what: str, event: str) -> None:
    """The runtime side cleaned (bounded, named `what` in its log), the record destroyed, saved
    with `event` and archived. Retiring meanwhile: the tree's namespaces are being freed."""
    with retiring(sup, rec.id):
        await bounded_cleanup(
            sup.nursery, what, rec.id, sup.config.cleanup_timeout_s, sup.runtime.destroy, rec.id
        )
        untrack(sup, rec.id)
        rec.status = SlotStatus.destroyed
    rec.destroyed_at = sup.clock()
    sup.table.save_slot(rec, event)
    await archive(sup, rec)


async def archive(sup: TeardownHost, rec: SlotRecord) -> None:
    kind = keep_kind(rec, sup.config.retention.mode)
    record = rec.model_dump(mode="json")
    gate_report = {
        "episode": rec.episode,
        "gates": [g.model_dump(mode="json") for g in rec.gates],
    }
    screenshot = sup.console.last_screenshot.get(rec.id)
    logs = [str(p) for p in (rec.handle or {}).get("extra", {}).get("log_files", [])]
    events = await sup.store.events_of(rec.id)
    try:
        await trio.to_thread.run_sync(
            write_forgotten,
            sup.config.forgotten_dir,
            kind,
            record,
            events,
            gate_report,
            screenshot,
            logs,
        )
    except (OSError, RuntimeError) as exc:
        log.error("slot=%s could not write its archive to forgotten_dir: %s", rec.id, exc)
