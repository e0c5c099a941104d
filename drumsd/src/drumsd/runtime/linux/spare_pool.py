"""The spare pool's bookkeeping, without I/O: which checkpoints keep spares (and with which
limits), how many each should keep, the frozen instances parked per checkpoint, and the event
that wakes the refiller. `spares.py` does the restores, claims and disposals."""

from __future__ import annotations

from collections.abc import Callable

import trio

from drumsd.core.seams import CheckpointRef, SlotLimits
from drumsd.runtime.linux.base import Instance

REFILL_BACKOFF_MAX_S = 60.0  # a checkpoint whose refills keep failing is tried once a minute


class SparePool:
    def __init__(self, per_checkpoint: int, per_host: int) -> None:
        self.per_checkpoint = per_checkpoint
        self.per_host = per_host
        self._parked: dict[str, list[Instance]] = {}
        self._refs: dict[str, tuple[CheckpointRef, SlotLimits]] = {}
        # Control-plane sizing (drumsd.core.spare_pool): spares wanted per checkpoint, capped
        # by per_checkpoint.
        self._targets: dict[str, int] = {}
        self._wakeup = trio.Event()
        self.refilling = False  # a refill restore is under way (a claim's phases say so)
        # checkpoint -> (refills failed in a row, not retried before this monotonic time)
        self._failed: dict[str, tuple[int, float]] = {}

    def enable(self, checkpoint: CheckpointRef, limits: SlotLimits) -> None:
        if self.per_checkpoint > 0:
            self._refs[checkpoint.id] = (checkpoint, limits)
            self.wake()

    def set_target(self, checkpoint_id: str, n: int) -> None:
        if self._targets.get(checkpoint_id) != n:
            self._targets[checkpoint_id] = n
            self.wake()

    def target(self, checkpoint_id: str) -> int:
        wanted = self._targets.get(checkpoint_id, self.per_checkpoint)
        return max(0, min(wanted, self.per_checkpoint))

    def forget(self, checkpoint_id: str) -> list[Instance]:
        """The checkpoint keeps no spares any more: its parked ones, for the caller to dispose."""
        self._refs.pop(checkpoint_id, None)
        self._targets.pop(checkpoint_id, None)
        self._failed.pop(checkpoint_id, None)
        return self._parked.pop(checkpoint_id, [])

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in self._parked.items()}

    def iids(self) -> set[str]:
        return {i.iid for pool in self._parked.values() for i in pool}

    def keeps(self, checkpoint: CheckpointRef, limits: SlotLimits) -> bool:
        """Whether spares are kept for exactly this checkpoint (same dir) and these limits."""
        ref = self._refs.get(checkpoint.id)
        return ref is not None and ref[0].dir == checkpoint.dir and ref[1] == limits

    def take(self, checkpoint_id: str) -> Instance | None:
        """The oldest spare parked for the checkpoint, off the pool (the refiller is woken to
        replace it); None when there is none."""
        pool = self._parked.get(checkpoint_id)
        if not pool:
            return None
        self.wake()
        return pool.pop(0)

    def next_need(
        self, refill_allowed: Callable[[], bool], now: float = 0.0
    ) -> tuple[CheckpointRef, SlotLimits] | None:
        """The next checkpoint below its target, within the host's cap and not backing off
        after failed refills (at `now`); None when none is or admission holds refills back."""
        if sum(len(v) for v in self._parked.values()) >= self.per_host or not refill_allowed():
            return None
        for cid, (ref, limits) in self._refs.items():
            if self._failed.get(cid, (0, 0.0))[1] > now:
                continue
            if len(self._parked.get(cid, [])) < self.target(cid):
                return ref, limits
        return None

    def refill_failed(self, checkpoint_id: str, now: float) -> float:
        """A refill of the checkpoint failed: the seconds until it is tried again (1, 2, 4, ...
        up to REFILL_BACKOFF_MAX_S; a host short of a kernel limit is not retried every second)."""
        failures = self._failed.get(checkpoint_id, (0, 0.0))[0] + 1
        delay = min(REFILL_BACKOFF_MAX_S, 2.0 ** (failures - 1))
        self._failed[checkpoint_id] = (failures, now + delay)
        return delay

    def refill_done(self, checkpoint_id: str) -> None:
        self._failed.pop(checkpoint_id, None)

    def park(self, checkpoint_id: str, inst: Instance) -> bool:
        """Park a fresh spare; False (the caller disposes of it) when the checkpoint was
        forgotten while it was restored."""
        if checkpoint_id not in self._refs:
            return False
        self._parked.setdefault(checkpoint_id, []).append(inst)
        return True

    def take_expired(self, now: float, max_age_s: float) -> list[Instance]:
        """Spares older than `max_age_s`, and the oldest beyond each target (the claim rate
        fell: they are not renewed), off the pool for the caller to dispose."""
        taken: list[Instance] = []
        for cid, pool in self._parked.items():
            old = [i for i in pool if now - i.born > max_age_s]
            extra = len(pool) - len(old) - self.target(cid)
            if extra > 0:
                old += [i for i in pool if all(i is not o for o in old)][:extra]
            for inst in old:
                pool.remove(inst)
            taken += old
        if taken:
            self.wake()
        return taken

    def take_all(self) -> list[Instance]:
        taken = [i for pool in self._parked.values() for i in pool]
        self._parked.clear()
        return taken

    def wake(self) -> None:
        self._wakeup.set()

    async def wait_wakeup(self, timeout_s: float) -> None:
        """Until `wake` (since the last wait) or `timeout_s`."""
        with trio.move_on_after(timeout_s):
            await self._wakeup.wait()
        self._wakeup = trio.Event()
