"""An episode's start runs its image's after-restore command before the start gates read the tree
(issue 32: GNOME Shell's clock), and the alive_after_resume judge always reaches a verdict, a read
of facts that hangs included (f3977615's first episode stayed pending)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from drums.models import SlotCreate
from drumsd.core import gates as G
from drumsd.core.records import SlotStatus
from drumsd.core.seams import CommandResult, RuntimeError_, SlotFacts, SlotHandle
from drumsd.linux import image_profiles
from drumsd.runtime import episodes
from drumsd.runtime.memory_runtime import MemoryRuntime
from drumsd.runtime.supervisor import open_supervisor
from harness import make_config, virtual_clock, wait_for

HOST_NS = {"pid": 1, "mnt": 2, "net": 3, "ipc": 4, "uts": 5}


class _Recording(MemoryRuntime):
    """Records the order of the commands run as the desktop user and of the reads of facts."""

    def __init__(self, *args: Any, fail_exec: bool = False, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.log: list[tuple[str, Any]] = []
        self.fail_exec = fail_exec

    async def exec_user(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        self.log.append(("exec", tuple(command)))
        if self.fail_exec:
            raise RuntimeError_("timeout", "the agent did not answer")
        return await super().exec_user(handle, command, timeout_s)

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        self.log.append(("facts", handle.slot_id))
        return await super().facts(handle)


@pytest.fixture
def poking_base(monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    argv = ("gdbus", "emit", "--session")
    base = image_profiles.PROFILES["base"]
    monkeypatch.setitem(
        image_profiles.PROFILES, "base", dataclasses.replace(base, after_restore=argv)
    )
    return argv


async def test_the_after_restore_command_runs_before_the_start_gates_read_the_tree(
    tmp_path: Path, poking_base: tuple[str, ...]
) -> None:
    config = make_config(tmp_path, admission={"enabled": False})
    runtime = _Recording(config.state_dir)
    async with open_supervisor(config, runtime, host_namespaces=HOST_NS) as sup:
        await wait_for(lambda: sup.template_status.get("base") == "ready")
        runtime.log.clear()
        slot = await sup.create(SlotCreate())
        assert runtime.log[:2] == [("exec", poking_base), ("facts", slot.id)]
        runtime.log.clear()
        await sup.reset(slot.id)  # a reset is a restore too
        assert runtime.log[:2] == [("exec", poking_base), ("facts", slot.id)]
        # An image no profile built declares no command.
        rec = sup.slots[slot.id]
        rec.image = "hand-made"
        runtime.log.clear()
        await episodes.after_restore(sup, rec, episodes.handle_of(rec))
        assert runtime.log == []


async def test_a_failing_after_restore_command_costs_the_episode_nothing(
    tmp_path: Path, poking_base: tuple[str, ...], caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(tmp_path, admission={"enabled": False}, alive_after_s=0.05)
    runtime = _Recording(config.state_dir, fail_exec=True)
    async with open_supervisor(config, runtime, host_namespaces=HOST_NS) as sup:
        await wait_for(lambda: sup.template_status.get("base") == "ready")
        slot = await sup.create(SlotCreate())
        rec = sup.slots[slot.id]
        await wait_for(lambda: sup.gate_statuses(rec)["alive_after_resume"] != G.PENDING)
        assert rec.status.value == "ready"
        assert G.failed_gates(sup.gate_statuses(rec)) == []
    assert "after-restore command gdbus failed: the agent did not answer" in caplog.text


class _HangingFacts(MemoryRuntime):
    """The start's read of facts answers; every later read of the slot never returns."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.reads = 0

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        self.reads += 1
        if self.reads > 1:
            await trio.sleep_forever()
        return await super().facts(handle)


@asynccontextmanager
async def _judging(tmp_path: Path, runtime_type: type[MemoryRuntime]) -> AsyncIterator[Any]:
    """A supervisor on `runtime_type` (a runtime counting its reads of facts) with its template
    ready and the count reset, so only the episode's reads are counted."""
    config = make_config(tmp_path, admission={"enabled": False}, alive_after_s=0.5)
    runtime: Any = runtime_type(config.state_dir)
    async with open_supervisor(
        config, runtime, host_namespaces=HOST_NS, clock=virtual_clock
    ) as sup:
        await wait_for(lambda: sup.template_status.get("base") == "ready", 60)
        runtime.reads = 0
        yield sup


async def _alive_judged(sup: Any, within_s: float) -> tuple[Any, Any]:
    """A new slot and its alive_after_resume gate once judged (no longer pending)."""
    slot = await sup.create(SlotCreate())
    rec = sup.slots[slot.id]
    await wait_for(lambda: sup.gate_statuses(rec)["alive_after_resume"] != G.PENDING, within_s)
    return rec, next(g for g in rec.gates if g.name == "alive_after_resume")


async def test_the_alive_judge_gives_a_verdict_when_its_reads_hang(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with _judging(tmp_path, _HangingFacts) as sup:
        config = sup.config
        started = trio.current_time()
        rec, gate = await _alive_judged(sup, 120)
        took = trio.current_time() - started
        assert gate.status == G.FAIL
        assert gate.evidence["timed_out"] == episodes.JUDGE_READ_TRIES, gate.evidence
        assert "took over 10 s and were abandoned" in gate.evidence["reason"]
        # Judged within its bound: alive_after_s, then each try's limit and the pause between.
        bound = config.alive_after_s + episodes.JUDGE_READ_TRIES * (
            episodes.JUDGE_READ_TIMEOUT_S + 1.0
        )
        assert took <= bound + 1.0, took
        assert rec.status.value == "quarantined"  # a failed gate quarantines, as any failure


class _CaptureDuringRead(MemoryRuntime):
    """The judge's read of facts (the slot's second) overlaps a capture: the slot turns busy
    while the read runs and back to ready some time after it returned, as a task checkpoint's
    capture right after a create's setup does (f3977615: setup captured 3 s after ready)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.sup: Any = None
        self.reads = 0

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        self.reads += 1
        facts = await super().facts(handle)
        if self.reads == 2:
            rec = self.sup.slots[handle.slot_id]
            rec.status = SlotStatus.busy  # the capture starts while the read runs

            async def capture_ends() -> None:
                await trio.sleep(2.0)
                rec.status = SlotStatus.ready

            self.sup.spawn(capture_ends)
        return facts


async def test_a_capture_starting_while_the_judge_reads_does_not_leave_it_unjudged(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with _judging(tmp_path, _CaptureDuringRead) as sup:
        runtime = sup.runtime
        runtime.sup = sup
        _rec, gate = await _alive_judged(sup, 60)
        assert gate.status == G.PASS, gate.evidence
        assert runtime.reads >= 3  # read again once the capture was over


class _ReusedNamespaces(MemoryRuntime):
    """The kernel's reuse of a freed namespace's inode number: a tree torn down gives its
    namespace numbers to the next tree restored, while its teardown (or the reset replacing it)
    is held open until `release` is set."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.freed: dict[str, int] | None = None
        self.hold: str | None = None  # the slot whose teardown waits
        self.torn_down = trio.Event()
        self.release = trio.Event()

    async def destroy(self, slot_id: str) -> None:
        if slot_id == self.hold:
            self.freed = dict(self.slots[slot_id]["handle"].namespaces)
            await super().destroy(slot_id)
            self.torn_down.set()
            await self.release.wait()
            return
        await super().destroy(slot_id)

    def _start(self, slot_id: str, checkpoint: Any, actions: int = 0) -> SlotHandle:
        handle = super()._start(slot_id, checkpoint, actions)
        if self.freed is not None and slot_id != self.hold:
            handle = dataclasses.replace(handle, namespaces=self.freed)
            self.slots[slot_id]["handle"] = handle
            self.freed = None
        return handle


@pytest.mark.parametrize("how", ["destroy", "reset", "init exit"])
async def test_a_new_slot_given_the_numbers_of_a_tree_being_torn_down_is_isolated(
    tmp_path: Path, how: str
) -> None:
    config = make_config(tmp_path, admission={"enabled": False}, spares={"per_checkpoint": 0})
    runtime = _ReusedNamespaces(config.state_dir)
    async with open_supervisor(config, runtime, host_namespaces=HOST_NS) as sup:
        await wait_for(lambda: sup.template_status.get("base") == "ready")
        old = await sup.create(SlotCreate())
        runtime.hold = old.id
        async with trio.open_nursery() as nursery:
            if how == "destroy":
                nursery.start_soon(sup.destroy, old.id)
            elif how == "reset":
                nursery.start_soon(sup.reset, old.id)
            else:  # quarantined by its exit, kept (with its record) until destroyed
                runtime.freed = dict(sup.slots[old.id].handle["namespaces"])
                runtime.kill(old.id)
                await wait_for(lambda: sup.slots[old.id].status is SlotStatus.quarantined)
                runtime.torn_down.set()
            await runtime.torn_down.wait()
            new = await sup.create(SlotCreate())
            assert new.handle["namespaces"] == sup.slots[old.id].handle["namespaces"]
            isolation = next(g for g in sup.slots[new.id].gates if g.name == "isolation")
            assert isolation.status == G.PASS, isolation.evidence
            runtime.release.set()
        # A reset's new tree is compared again, a destroyed slot is gone, a dead one stays out.
        assert (old.id in sup.retiring) is (how == "init exit")
        assert (old.id in episodes.other_namespaces(sup, new.id)) is (how == "reset")
        if how == "init exit":
            await sup.destroy(old.id)
            assert old.id not in sup.retiring
