"""The admission book: what admission knows between two host samples. The last sample and
decision, the memory and state_dir space reserved by admitted work still running (a restore,
a dump, a fork's children: not yet visible in the sample), each slot's last memory charge.

`reserve(op, mib)` holds a reservation for the body of a `with` and gives it back on every exit,
so no operation writes the bookkeeping by hand. `wait_for_room` asks again for a while instead of
refusing at once (background work that may wait a little). The decisions themselves are
`core/admission.decide` (pure).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import trio

from drumsd.core.admission import Decision, HostSample, decide, slot_cost_mib
from drumsd.core.config import Config
from drumsd.core.errors import DrumsdError
from drumsd.core.metrics import MetricsWindow

# How often `wait_for_room` asks again: room comes back when admitted work ends (its reservation
# is given back) or a new sample arrives; a decision is arithmetic, so asking is cheap.
ROOM_POLL_S = 0.25


def _nothing_reserved() -> float:
    return 0.0


class AdmissionBook:
    def __init__(
        self,
        config: Config,
        metrics: MetricsWindow,
        *,
        checker_reserved_mib: Callable[[], float] = _nothing_reserved,
    ) -> None:
        self.config = config
        self.metrics = metrics
        # Memory of the checker calls running now (the task bridge bounds them, issue 39 D5).
        self.checker_reserved_mib = checker_reserved_mib
        self.sample: HostSample | None = None
        self.last_decision: Decision | None = None
        self.pending_mib = 0.0  # memory of admitted work still running
        self.pending_state_mib = 0.0  # dumps admitted and still being written to state_dir
        self.reserved: dict[str, float] = {}  # operation -> memory it holds now (for health)
        self.charged_mib: dict[str, float] = {}  # slot -> memory charged to its cgroup, last read

    # --- reservations ---------------------------------------------------------------------------

    @contextmanager
    def reserve(self, op: str, mib: float, state_mib: float = 0.0) -> Iterator[None]:
        """Count `mib` of memory (and `state_mib` of state_dir) as taken while the body runs:
        the sample cannot see a restore or a dump until it is done."""
        self.pending_mib += mib
        self.pending_state_mib += state_mib
        self.reserved[op] = self.reserved.get(op, 0.0) + mib
        try:
            yield
        finally:
            self.pending_mib -= mib
            self.pending_state_mib -= state_mib
            left = self.reserved.pop(op) - mib
            if left > 1e-9:
                self.reserved[op] = left

    # --- the slots' charge ----------------------------------------------------------------------

    def charge(self, slot_id: str, mib: float) -> None:
        """A slot's memory charge as its facts read it last."""
        self.charged_mib[slot_id] = mib

    def forget(self, slot_id: str) -> None:
        self.charged_mib.pop(slot_id, None)

    def slot_cost_mib(self, live: Iterable[str]) -> float:
        """Admission's cost of one more slot: the real, KSM-merged charge of the `live` slots."""
        charged = [self.charged_mib[i] for i in live if i in self.charged_mib]
        return slot_cost_mib(self.config.admission.env_mib, charged)

    # --- decisions ------------------------------------------------------------------------------

    def decision(
        self, cost_mib: float, state_mib: float = 0.0, *, checkers: bool = True
    ) -> Decision:
        """Would work costing `cost_mib` be admitted now, on top of what is reserved?"""
        pending = self.pending_mib + (self.checker_reserved_mib() if checkers else 0.0)
        return decide(
            self.sample,
            self.config.admission,
            cost_mib,
            pending_mib=pending,
            state_mib=state_mib + self.pending_state_mib,
        )

    async def wait_for_room(
        self, cost_mib: Callable[[], float], within_s: float, *, checkers: bool = True
    ) -> Decision:
        """The decision on work costing `cost_mib()` (asked again each time: the slots' cost
        moves), asked every ROOM_POLL_S until it admits or `within_s` has passed: the last one."""
        deadline = trio.current_time() + within_s
        while True:
            decision = self.decision(cost_mib(), checkers=checkers)
            left = deadline - trio.current_time()
            if decision.admit or left <= 0:
                return decision
            await trio.sleep(min(ROOM_POLL_S, left))

    def admit(self, operation: str, cost_mib: float, state_mib: float = 0.0) -> None:
        """Refused (429 overloaded, with when to retry) when the host would go below a floor."""
        decision = self.decision(cost_mib, state_mib)
        self.last_decision = decision
        if not decision.admit:
            self.metrics.failure("overloaded")
            raise DrumsdError(
                "overloaded",
                f"{operation} refused: {decision.reason}",
                retry_after_s=decision.retry_after_s,
                limit=decision.limit,
            )

    def check_state_space(self, operation: str, need_mib: float = 0.0) -> None:
        """A dump or a restore needs room in state_dir: refused (507) when its free space, less
        the dumps still being written and this operation's `need_mib`, is below
        state_min_free_mib."""
        free = self.sample.state_free_mib if self.sample else None
        if free is None:
            return
        left = free - self.pending_state_mib - need_mib
        if left < self.config.state_min_free_mib:
            self.metrics.failure("state_dir_full")
            raise DrumsdError(
                "state_dir_full",
                f"{operation} refused: state_dir {self.config.state_dir} has {free:.0f} MiB free"
                f" and would keep {left:.0f} MiB after the admitted work, below "
                f"state_min_free_mib={self.config.state_min_free_mib}; delete saved states"
                " (DELETE /v1/checkpoints/{id}) or destroy slots",
                free_mib=free,
            )
