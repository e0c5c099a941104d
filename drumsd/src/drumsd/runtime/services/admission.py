"""The admission sampler: the host figures that create, capture and fork are admitted by,
and the memory limit of all slots together, which follows MemAvailable so admission's floor
holds for memory used outside slots too (issue 39, D7)."""

from __future__ import annotations

import logging
from functools import partial
from typing import TYPE_CHECKING, Protocol

import trio

from drumsd.core.admission import memory_floor_mib
from drumsd.core.seams import GroupMemoryControl
from drumsd.runtime.services import ServiceHost, guarded_loop

if TYPE_CHECKING:
    from drumsd.core.admission import HostSample
    from drumsd.core.seams import SlotRuntime


class SamplerHost(ServiceHost, Protocol):
    """What the admission sampler uses of the supervisor: its sample, the runtime and the
    slots' group memory limit it keeps."""

    group_memory_limit_mib: int | None

    @property
    def runtime(self) -> SlotRuntime: ...
    async def sample_now(self) -> HostSample | None: ...


log = logging.getLogger("drumsd.supervisor")


async def run(sup: SamplerHost, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
    """Sample host memory, PSI and state_dir space every admission.sample_interval_s, then move
    the slots' group memory limit with the sample."""
    await guarded_loop(
        sup,
        "admission",
        partial(sample_and_hold_floor, sup),
        sup.config.admission.sample_interval_s,
        sleep_first=True,
        task_status=task_status,
    )


async def sample_and_hold_floor(sup: SamplerHost) -> None:
    sample = await sup.sample_now()
    if sample is None or sample.mem_available_mib is None:
        return
    if not isinstance(sup.runtime, GroupMemoryControl):
        return
    floor = memory_floor_mib(sup.config.admission, sample.mem_total_mib)
    sup.group_memory_limit_mib = await sup.runtime.hold_memory_floor(
        sample.mem_available_mib, floor
    )
