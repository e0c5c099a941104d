"""Warm spares: which checkpoints keep frozen restores, how many (sized from the claim rate), and
what claims looked like. Only for a runtime that implements SpareControl."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.records import (
    CheckpointRecord,
)
from drumsd.core.results import SparePoolReport, SparesReport
from drumsd.core.seams import (
    KsmControl,
    RuntimeError_,
    SlotHandle,
    SpareControl,
)
from drumsd.core.spare_pool import PoolStats, share_host, spare_target
from drumsd.runtime.handles import checkpoint_ref, slot_limits
from drumsd.runtime.services import ServiceHost, guarded_loop

if TYPE_CHECKING:
    from drumsd.core.seams import SlotRuntime
    from drumsd.runtime.admission_book import AdmissionBook

log = logging.getLogger("drumsd.supervisor")


class SparePools:
    """The pools' state: since when each pooled checkpoint has one (trio time), what its
    claims looked like, the target last set for it."""

    def __init__(self) -> None:
        self.stats: dict[str, PoolStats] = {}
        self.since: dict[str, float] = {}
        self.targets: dict[str, int] = {}

    def add(self, checkpoint_id: str, now: float) -> None:
        self.since.setdefault(checkpoint_id, now)
        self.stats.setdefault(checkpoint_id, PoolStats())

    def forget(self, checkpoint_id: str) -> None:
        self.since.pop(checkpoint_id, None)
        self.targets.pop(checkpoint_id, None)
        self.stats.pop(checkpoint_id, None)

    def wanted(self, now: float, per_checkpoint: int) -> dict[str, int]:
        """Each pool's target from its claim rate and restore time, before the host's share."""
        return {
            cid: spare_target(
                self.stats[cid].claims_per_s(now, since),
                self.stats[cid].typical_restore_s(),
                per_checkpoint,
            )
            for cid, since in self.since.items()
            if cid in self.stats
        }


class SparesHost(ServiceHost, Protocol):
    """What the spare pools use of the supervisor: the runtime, the pools, admission (a refill
    is admitted like a slot), whether it drains, and its pool sizing and state."""

    @property
    def runtime(self) -> SlotRuntime: ...
    @property
    def pools(self) -> SparePools: ...
    @property
    def admission_book(self) -> AdmissionBook: ...
    @property
    def draining(self) -> bool: ...
    def slot_cost_mib(self) -> float: ...
    def size_pools(self) -> dict[str, int]: ...
    def pools_state(self) -> SparesReport: ...


def spares_on(sup: SparesHost) -> bool:
    return sup.config.spares.enabled and isinstance(sup.runtime, SpareControl)


def enable_spares(sup: SparesHost, cp: CheckpointRecord) -> None:
    """Keep frozen restores of `cp` ready so create/reset/fork from it are a thaw."""
    if not spares_on(sup) or not cp.ready:
        return
    assert isinstance(sup.runtime, SpareControl)
    sup.runtime.enable_spares(checkpoint_ref(cp), slot_limits(sup.config))
    sup.pools.add(cp.id, trio.current_time())
    log.info("checkpoint=%s warm spares enabled", cp.id)


async def forget_spares(sup: SparesHost, checkpoint_id: str) -> None:
    """A deleted or replaced checkpoint: its spares and cached image copies go."""
    sup.pools.forget(checkpoint_id)
    if not isinstance(sup.runtime, SpareControl):
        return
    with trio.CancelScope(shield=True):
        try:
            await sup.runtime.forget_checkpoint(checkpoint_id)
        except RuntimeError_ as exc:
            log.error("checkpoint=%s dropping spares failed: %s", checkpoint_id, exc.message)


def note_claim(sup: SparesHost, checkpoint_id: str, handle: SlotHandle) -> None:
    """A create/reset/fork child of a pooled checkpoint: a hit (thaw) or a miss (restore)."""
    stats = sup.pools.stats.get(checkpoint_id)
    if stats is None:
        return
    spare = bool(handle.extra.get("spare"))
    stats.record(trio.current_time(), spare, handle.restore_s)
    sup.metrics.observe("spare_claim" if spare else "spare_miss_restore", handle.restore_s)
    sup.metrics.count("spare_hits" if spare else "spare_misses")


def refill_allowed(sup: SparesHost) -> bool:
    """A refill is a new desktop: only when admission would admit a create right now."""
    if sup.draining:
        return False
    return sup.admission_book.decision(sup.slot_cost_mib(), checkers=False).admit


def size_pools(sup: SparesHost) -> dict[str, int]:
    """Targets from each pool's claim rate and restore time, fitted into spares.per_host."""
    wanted = sup.pools.wanted(trio.current_time(), sup.config.spares.per_checkpoint)
    targets = share_host(wanted, sup.config.spares.per_host)
    if isinstance(sup.runtime, SpareControl):
        for cid, n in targets.items():
            sup.runtime.set_spare_target(cid, n)
    sup.pools.targets = targets
    return targets


async def run(sup: SparesHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
    """Pool targets follow the observed claim rate (only when the runtime keeps spares)."""
    assert isinstance(sup.runtime, SpareControl)
    sup.runtime.refill_allowed = partial(refill_allowed, sup)

    async def iteration() -> None:
        sup.size_pools()

    await guarded_loop(
        sup,
        "spares",
        iteration,
        sup.config.spares.sizing_interval_s,
        sleep_first=False,
        task_status=task_status,
    )


def pools_state(sup: SparesHost) -> SparesReport:
    """Per pooled checkpoint: spares parked now, target, hits, misses, claim latency."""
    counts: dict[str, int] = (
        dict(sup.runtime.spare_counts()) if isinstance(sup.runtime, SpareControl) else {}
    )
    return SparesReport(
        enabled=spares_on(sup),
        per_checkpoint=sup.config.spares.per_checkpoint,
        per_host=sup.config.spares.per_host,
        max_age_s=sup.config.spares.max_age_s,
        refill_allowed=refill_allowed(sup) if spares_on(sup) else False,
        parked=sum(counts.values()),
        checkpoints={
            cid: pool_report(counts.get(cid, 0), sup.pools.targets.get(cid), stats)
            for cid, stats in sup.pools.stats.items()
        },
    )


def pool_report(size: int, target: int | None, stats: PoolStats) -> SparePoolReport:
    total = stats.hits + stats.misses
    return SparePoolReport(
        size=size,
        target=target,
        hits=stats.hits,
        misses=stats.misses,
        hit_ratio=stats.hits / total if total else None,
        claim_p50_s=stats.claim_s.quantile(0.5),
        claim_p99_s=stats.claim_s.quantile(0.99),
        restore_p50_s=stats.restore_s.quantile(0.5),
    )


def pool_gauges(sup: SparesHost) -> list[tuple[str, str, dict[str, str], float]]:
    """Prometheus gauges of the pools and KSM (for the /metrics route's `gauges`)."""
    out: list[tuple[str, str, dict[str, str], float]] = []
    for cid, p in sup.pools_state().checkpoints.items():
        labels = {"checkpoint": cid}
        out.append(("drums_spares", "Warm spares parked per checkpoint.", labels, p.size))
        if p.target is not None:
            out.append(
                (
                    "drums_spares_target",
                    "Warm spare target per checkpoint.",
                    labels,
                    p.target,
                )
            )
        out.append(("drums_spare_hits", "Claims served by a warm spare.", labels, p.hits))
        out.append(("drums_spare_misses", "Claims that fell back to a restore.", labels, p.misses))
    if isinstance(sup.runtime, KsmControl):
        try:
            saved = float(dict(sup.runtime.ksm_stats()).get("saved_bytes", 0))
        except Exception:  # optional figures must never break /metrics
            saved = None
        if saved is not None:
            out.append(("drums_ksm_saved_bytes", "Memory KSM saves now.", {}, saved))
    return out
