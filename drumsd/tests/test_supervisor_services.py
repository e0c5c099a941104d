"""The supervisor's background services under trio's MockClock: a service whose iteration raises
keeps running, /v1/health says so while it fails and stops saying so once it recovers, gate refresh
quarantines on its own, and a destroy that hangs is abandoned at its deadline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from drumsd.core.admission import HostSample
from drumsd.core.seams import SlotFacts, SlotHandle
from drumsd.runtime.memory_runtime import MemoryRuntime
from harness import create, open_api, virtual_clock, wait_for


class FlakySampler:
    """The admission sampler: raises (an unexpected error, not OSError) while `broken`."""

    def __init__(self) -> None:
        self.broken = False
        self.calls = 0

    def __call__(self, _: Path) -> HostSample:
        self.calls += 1
        if self.broken:
            raise ValueError("meminfo parse went wrong")
        return HostSample(time.time(), 20_000, 24_000, 0.0, 50_000, 100_000)


async def test_a_failing_service_keeps_running_and_health_reports_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sampler = FlakySampler()
    async with open_api(
        tmp_path, sampler=sampler, clock=virtual_clock, admission={"sample_interval_s": 1.0}
    ) as api:
        health = (await api.client.get("/v1/health")).json()
        assert health["services"]["admission"]["failures"] == 0
        assert set(health["services"]) >= {"admission", "reaper", "gate_refresh"}

        sampler.broken = True
        calls = sampler.calls
        await wait_for(lambda: sampler.calls >= calls + 3, 600, every_s=0.5)
        assert sampler.calls >= calls + 3, "the loop stopped after its first failure"
        health = (await api.client.get("/v1/health")).json()
        admission = health["services"]["admission"]
        assert admission["failing"] is True and admission["failures"] >= 3
        assert "ValueError: meminfo parse went wrong" in admission["last_error"]
        assert health["status"] == "degraded"
        assert any(w.startswith("service admission failing") for w in health["warnings"])
        metrics = (await api.client.get("/v1/metrics")).json()
        assert metrics["failures_by_class"]["service_admission"] >= 3

        sampler.broken = False
        admission_health = api.sup.services["admission"]
        await wait_for(lambda: not admission_health.failing(), 600, every_s=0.5)
        health = (await api.client.get("/v1/health")).json()
        admission = health["services"]["admission"]
        assert admission["failing"] is False and admission["iterations"] >= 1
        assert not any(w.startswith("service admission failing") for w in health["warnings"])
        # The other services were never disturbed.
        assert health["services"]["gate_refresh"]["failures"] == 0


class FactsBreak(MemoryRuntime):
    """The memory runtime whose facts() raises an unexpected error while `broken`."""

    broken = False

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        if self.broken:
            raise KeyError("cgroup vanished")
        return await super().facts(handle)


async def test_gate_refresh_survives_a_slot_whose_refresh_raises(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_api(
        tmp_path, clock=virtual_clock, runtime_cls=FactsBreak, gate_refresh_s=3.0
    ) as api:
        sid = (await create(api))["id"]
        runtime: Any = api.runtime
        await trio.sleep(10)
        gate = api.sup.services["gate_refresh"]
        assert gate.failures == 0 and gate.iterations >= 2

        runtime.broken = True
        gate = api.sup.services["gate_refresh"]
        await wait_for(lambda: gate.failures >= 2, 600, every_s=0.5)
        assert gate.failing() and gate.failures >= 2
        assert sid in (gate.last_error or "")
        health = (await api.client.get("/v1/health")).json()
        assert any(w.startswith("service gate_refresh failing") for w in health["warnings"])

        runtime.broken = False
        done = gate.iterations
        await wait_for(lambda: gate.iterations > done, 600, every_s=0.5)
        assert gate.iterations > done and not gate.failing()
        assert api.sup.slots[sid].status.value == "ready"


@pytest.mark.parametrize("interval", [0.5, 3.0])
async def test_gate_refresh_quarantines_on_its_interval(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, interval: float
) -> None:
    """An OOM kill seen by the facts quarantines the slot from the refresh loop, with no request.
    (Virtual time also runs while a thread works, so the wait is bounded loosely.)"""
    async with open_api(tmp_path, clock=virtual_clock, gate_refresh_s=interval) as api:
        sid = (await create(api))["id"]
        await trio.sleep(interval * 2)
        rec = api.sup.slots[sid]
        assert rec.status.value == "ready"
        api.runtime.inject(sid, oom_kills=1)
        await wait_for(lambda: rec.status.value == "quarantined", 600, every_s=0.5)
        assert rec.status.value == "quarantined"
        assert "no_oom_kill" in (rec.quarantine_reason or "")


class HangingDestroy(MemoryRuntime):
    """A runtime whose destroy shields itself for an hour (a wedged kill, a stuck wait)."""

    hang = False

    async def destroy(self, slot_id: str) -> None:
        if self.hang:
            with trio.CancelScope(shield=True):
                await trio.sleep(3600)  # virtual; it ends so the test's nursery can close
        await super().destroy(slot_id)


async def test_a_destroy_that_hangs_is_abandoned_at_the_cleanup_deadline(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_api(
        tmp_path, clock=virtual_clock, runtime_cls=HangingDestroy, cleanup_timeout_s=20
    ) as api:
        sid = (await create(api))["id"]
        runtime: Any = api.runtime
        runtime.hang = True
        started = trio.current_time()
        r = await api.client.delete(f"/v1/slots/{sid}")
        waited = trio.current_time() - started
        assert r.status_code == 200, r.text
        # The deadline applied although the runtime shielded itself: the record is written and
        # the answer came after cleanup_timeout_s, not after the runtime's hour. (Virtual time
        # also runs on while requests wait on worker threads, so no tighter upper bound.)
        assert 20 <= waited < 3600
        assert api.sup.slots[sid].status.value == "destroyed"


async def test_a_failed_template_build_is_tried_again(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = MemoryRuntime(tmp_path / "state")
    runtime.fail_template_builds = 1
    async with open_api(tmp_path, runtime=runtime, clock=virtual_clock) as api:
        status = api.sup.template_status
        assert status["base"].startswith("building (attempt 2 of 3"), status
        assert "timeout" in status["base"]
        await wait_for(lambda: status["base"] == "ready", 120, every_s=0.5)
        assert status["base"] == "ready"
        assert runtime.template_builds == 2
        assert (await create(api))["id"]


async def test_a_template_that_never_builds_says_why_after_the_last_attempt(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = MemoryRuntime(tmp_path / "state")
    runtime.fail_template_builds = 10
    async with open_api(tmp_path, runtime=runtime, clock=virtual_clock) as api:
        status = api.sup.template_status
        await wait_for(lambda: status["base"].startswith("error"), 300, every_s=0.5)
        assert runtime.template_builds == 3
        assert status["base"].startswith("error: timeout:"), status
        assert "after 3 attempts" in status["base"]


async def test_the_reaper_ends_an_idle_lease_on_its_own_in_virtual_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The reaper loop, not a direct reap_once: a 60 s idle lease ends within one reap interval
    of running out, never before; a slot whose lease is still good is left alone."""
    async with open_api(tmp_path, clock=virtual_clock, lease={"reap_interval_s": 5.0}) as api:
        t0 = trio.current_time()
        idle = (await create(api, idle_timeout_s=60))["id"]
        kept = (await create(api, idle_timeout_s=3600))["id"]
        await trio.sleep(50)  # ten reap intervals; the lease has 10 s left
        assert ("destroy", idle) not in api.runtime.calls, "reaped before its lease ran out"
        await wait_for(lambda: api.sup.slots[idle].status.value == "destroyed", 60, every_s=2.5)
        assert 60 <= trio.current_time() - t0 <= 60 + 5.0 + 10.0  # + one interval + margin
        assert api.sup.slots[kept].status.value == "ready"
        assert ("destroy", kept) not in api.runtime.calls


class FloorRuntime(MemoryRuntime):
    """The memory runtime with a slots' group limit (`GroupMemoryControl`): records each call."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.floor_calls: list[tuple[float, float]] = []

    async def hold_memory_floor(self, mem_available_mib: float, floor_mib: float) -> int | None:
        self.floor_calls.append((mem_available_mib, floor_mib))
        return int(1_000 + mem_available_mib - floor_mib)


async def test_the_admission_service_moves_the_group_limit_with_each_sample(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Issue 39, D7: the limit follows MemAvailable; the floor is the larger of the two settings.
    available = [20_000.0]

    def sampler(_: Path) -> HostSample:
        return HostSample(time.time(), available[0], 24_000, 0.0, 50_000, 100_000)

    async with open_api(
        tmp_path,
        sampler=sampler,
        runtime_cls=FloorRuntime,
        clock=virtual_clock,
        admission={"sample_interval_s": 1.0, "min_available_mib": 4_096, "min_available_pct": 25},
    ) as api:
        runtime = api.runtime
        assert isinstance(runtime, FloorRuntime)
        await wait_for(lambda: runtime.floor_calls, 60, every_s=0.5)
        assert runtime.floor_calls[-1] == (20_000.0, 6_000.0)  # 25% of 24,000 > 4,096
        available[0] = 9_000.0  # memory taken outside the slots
        await wait_for(lambda: runtime.floor_calls[-1][0] == 9_000.0, 60, every_s=0.5)
        health = (await api.client.get("/v1/health")).json()
        assert health["admission"]["group_memory_limit_mib"] == 1_000 + 9_000 - 6_000


async def test_health_reports_a_kernel_limit_the_runtime_could_not_raise(tmp_path: Path) -> None:
    from drumsd.core import host_limits

    runtime = MemoryRuntime(tmp_path / "state")
    async with open_api(tmp_path, runtime=runtime) as api:
        assert (await api.client.get("/v1/health")).json()["warnings"] == []
        runtime.host_limits = host_limits.needs(  # type: ignore[attr-defined]
            200, inotify_instances=128, inotify_watches=10**7, nofile=10**6
        )
        health = (await api.client.get("/v1/health")).json()
        assert health["status"] == "degraded"
        (warning,) = health["warnings"]
        assert warning.startswith("kernel limit fs.inotify.max_user_instances=128 is below the")
        assert "sysctl -w fs.inotify.max_user_instances" in warning
