"""The host history: a sample of slots, restores, steps and memory every few seconds into the
supervisor's ring buffer (core/host_history.py), for the console's charts. Reads only what the
daemon already holds (slot records, the metrics window, the admission sampler's last sample)."""

from __future__ import annotations

import contextlib
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.host_history import EVERY_S
from drumsd.core.results import SparesReport
from drumsd.runtime.services import ServiceHost, guarded_loop

if TYPE_CHECKING:
    from drumsd.core.admission import HostSample
    from drumsd.core.records import SlotRecord
    from drumsd.core.seams import SlotRuntime
    from drumsd.runtime.console_state import ConsoleState


class HistoryHost(ServiceHost, Protocol):
    """What the history samples of the supervisor."""

    @property
    def slots(self) -> dict[str, SlotRecord]: ...
    @property
    def sample(self) -> HostSample | None: ...
    @property
    def runtime(self) -> SlotRuntime: ...
    @property
    def console(self) -> ConsoleState: ...
    def pools_state(self) -> SparesReport: ...


async def run(sup: HistoryHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
    await guarded_loop(
        sup,
        "history",
        partial(sample_once, sup),
        EVERY_S,
        sleep_first=False,
        task_status=task_status,
    )


async def sample_once(sup: HistoryHost) -> None:
    states = Counter(r.status.value for r in sup.slots.values())
    counts = {op: h.count for op, h in sup.metrics.latencies.items()}
    host = sup.sample
    ksm = None
    ksm_stats = getattr(sup.runtime, "ksm_stats", None)
    if ksm_stats is not None:
        with contextlib.suppress(Exception):
            stats = await trio.to_thread.run_sync(ksm_stats)  # reads sysfs
            ksm = round(float(dict(stats).get("saved_bytes", 0)) / 2**20, 1)
    sup.console.history.add(
        sup.clock(),
        slots_by_state=states,
        op_counts=counts,
        mem_available_mib=host.mem_available_mib if host else None,
        mem_total_mib=host.mem_total_mib if host else None,
        ksm_saved_mib=ksm,
        spares_parked=sup.pools_state().parked,
    )
