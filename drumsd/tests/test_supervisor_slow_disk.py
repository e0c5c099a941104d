"""A slow disk does not stall the control plane: with an fsync that blocks for 2 s, a step on
another slot still answers within 100 ms (journal writes run in the store's worker thread)."""

from __future__ import annotations

import os
import statistics
import threading
import time
from pathlib import Path

import trio
from drumsd.linux.journal_io import Journal
from harness import create, open_api

SLOW_S = 2.0


class SlowDisk:
    """An fsync that blocks for SLOW_S while `slow` is set (the injected fsync of the journal)."""

    def __init__(self) -> None:
        self.slow = False
        self.blocked = threading.Event()  # an fsync is blocking right now
        self.calls = 0

    def __call__(self, fd: int) -> None:
        if self.slow:
            self.calls += 1
            self.blocked.set()
            time.sleep(SLOW_S)
            self.blocked.clear()
        os.fsync(fd)


async def test_a_blocked_fsync_does_not_delay_a_step_on_another_slot(tmp_path: Path) -> None:
    disk = SlowDisk()
    config_dir = tmp_path / "journal"
    async with open_api(tmp_path, journal=Journal(config_dir, fsync=disk)) as api:
        stepper = (await create(api))["id"]
        other = (await create(api))["id"]
        disk.slow = True

        quarantined: dict[str, float] = {}

        async def quarantine_other() -> None:
            started = time.monotonic()
            r = await api.client.post(f"/v1/slots/{other}/quarantine", json={"reason": "t"})
            assert r.status_code == 200, r.text
            quarantined["s"] = time.monotonic() - started

        async with trio.open_nursery() as nursery:
            nursery.start_soon(quarantine_other)
            with trio.fail_after(5):
                while not disk.blocked.is_set():  # noqa: ASYNC110 (a thread sets it)
                    await trio.sleep(0.005)
            step_s = []
            for _ in range(5):
                assert disk.blocked.is_set() or api.sup.store.pending, "the slow write ended"
                started = time.monotonic()
                r = await api.client.post(
                    f"/v1/slots/{stepper}/step", json={"action": {"type": "click", "x": 5, "y": 5}}
                )
                step_s.append(time.monotonic() - started)
                assert r.status_code == 200, r.text
        # The quarantine answered only once its record was on the slow disk...
        assert quarantined["s"] >= SLOW_S and disk.calls >= 1
        disk.slow = False
        await api.sup.store.durable()
        on_disk = Journal(config_dir).read().slots
        assert on_disk[other].status.value == "quarantined"  # nothing lost on the way
        # ...while every step on the other slot answered at once.
        assert max(step_s) < 0.1, step_s
        print(
            f"step under a {SLOW_S:g} s fsync: median {statistics.median(step_s) * 1000:.1f} ms,"
            f" max {max(step_s) * 1000:.1f} ms; quarantine took {quarantined['s']:.2f} s"
        )
