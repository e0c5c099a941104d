"""Cleanup deadlines that can fire: a destroy whose teardown wedges (a cgroup kill that blocks)
returns at the runtime's teardown_timeout_s (config linux.teardown_timeout_s), and the abandoned
thread still finishes the cleanup; exits are waited for with a bounded pidfd wait, never an
unbounded waitpid."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import trio
from drumsd.linux import mounts, procfs
from drumsd.runtime.linux import Instance, LinuxRuntime, LinuxRuntimeConfig


class WedgedDriver:
    """A cgroup driver whose kill blocks until released (a D-state tree, a stuck cgroupfs)."""

    version = 2

    def __init__(self) -> None:
        self.release = threading.Event()
        self.removed: list[Mapping[str, str]] = []

    def kill(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None:
        self.release.wait(30)

    def remove(self, dirs: Mapping[str, str], timeout_s: float = 5.0) -> None:
        self.removed.append(dict(dirs))

    def slot_names(self) -> list[str]:
        return []

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected driver call {name}")


def _runtime(tmp_path: Path, teardown_timeout_s: float) -> tuple[LinuxRuntime, WedgedDriver]:
    driver = WedgedDriver()
    cfg = LinuxRuntimeConfig(state_dir=tmp_path, teardown_timeout_s=teardown_timeout_s)
    return LinuxRuntime(cfg, driver), driver  # type: ignore[arg-type]


def _slot(rt: LinuxRuntime, tmp_path: Path, slot_id: str) -> Instance:
    paths = mounts.SlotPaths.of(tmp_path, f"slot-{slot_id}-abc")
    paths.dir.mkdir(parents=True)
    (paths.dir / "owner.json").write_text(f'{{"owner": "slot:{slot_id}"}}')
    inst = Instance(paths.dir.name, paths, {"pids": "/nonexistent"}, "ck", (tmp_path,))
    rt.instances.serve(slot_id, inst)
    return inst


def test_destroy_returns_at_its_cleanup_deadline_and_the_cleanup_still_finishes(
    tmp_path: Path,
) -> None:
    rt, driver = _runtime(tmp_path, teardown_timeout_s=0.5)
    inst = _slot(rt, tmp_path, "s1")

    async def main() -> float:
        t0 = time.monotonic()
        await rt.destroy("s1")
        return time.monotonic() - t0

    took = trio.run(main)
    assert 0.4 <= took < 2.0, took  # the deadline fired; the kill is still blocked
    assert "s1" not in rt.instances
    assert inst.paths.dir.exists() and not driver.removed  # the thread has not finished yet
    driver.release.set()
    deadline = time.monotonic() + 10
    while inst.paths.dir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not inst.paths.dir.exists(), "the abandoned teardown must still finish"
    assert driver.removed == [{"pids": "/nonexistent"}]


def test_a_callers_cancel_does_not_skip_the_teardown(tmp_path: Path) -> None:
    """Shielded from the caller (a client that went away) but within its own bound."""
    rt, driver = _runtime(tmp_path, teardown_timeout_s=5.0)
    inst = _slot(rt, tmp_path, "s2")
    threading.Timer(0.3, driver.release.set).start()

    async def main() -> None:
        with trio.move_on_after(0.05):
            await rt.destroy("s2")

    trio.run(main)
    assert not inst.paths.dir.exists() and driver.removed


def test_reap_is_bounded_and_reaps_our_child() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        t0 = time.monotonic()
        assert procfs.reap(proc.pid, 0.2) is False
        assert 0.15 <= time.monotonic() - t0 < 1.5
        proc.kill()
        assert procfs.reap(proc.pid, 5.0) is True
        # Reaped by reap(): no zombie left for Popen to collect.
        assert procfs.read_stat(proc.pid) is None
    finally:
        proc.kill()
        proc.poll()
    assert procfs.reap(proc.pid, 0.1) is True  # gone: nothing to wait for


def test_reap_by_pidfd_waits_on_that_process_never_on_a_pid_reused_since() -> None:
    """A teardown reaps its init by the pidfd it holds: the init's number may name another
    process by then (pids recycle), which a lookup by number waited on until the timeout."""
    init = subprocess.Popen(["sleep", "30"])
    fd = os.pidfd_open(init.pid)
    try:
        init.kill()
        t0 = time.monotonic()
        # The number given now names a live process (this one): only the pidfd may decide.
        assert procfs.reap(os.getpid(), 2.0, fd) is True
        assert time.monotonic() - t0 < 1.0
        assert procfs.read_stat(init.pid) is None  # reaped through the pidfd: no zombie left
    finally:
        os.close(fd)
        init.kill()
        init.poll()


def test_a_cleanup_still_runs_when_the_supervisor_nursery_is_closing() -> None:
    """A create cancelled by the daemon's stop discards its slot after the supervisor's nursery
    has closed to new tasks: the cleanup runs inline (bounded) instead of failing the request."""
    from drumsd.runtime.failures import bounded_cleanup

    ran: list[str] = []

    async def cleanup(slot_id: str) -> None:
        await trio.lowlevel.checkpoint()
        ran.append(slot_id)

    async def main() -> bool:
        async with trio.open_nursery() as nursery:
            pass  # closed from here on: start_soon raises RuntimeError
        return await bounded_cleanup(nursery, "discard", "s-1", 5.0, cleanup, "s-1")

    assert trio.run(main) is True
    assert ran == ["s-1"]
