"""The admission sampler: the host figures that create, capture and branch are admitted by."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from drumsd.runtime.services import guarded_loop

if TYPE_CHECKING:
    from drumsd.runtime.supervisor import Supervisor

log = logging.getLogger("drumsd.supervisor")


async def run(sup: Supervisor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED):
    """Sample host memory, PSI and state_dir space every admission.sample_interval_s."""
    await guarded_loop(
        sup,
        "admission",
        sup.sample_now,
        sup.config.admission.sample_interval_s,
        sleep_first=True,
        task_status=task_status,
    )
