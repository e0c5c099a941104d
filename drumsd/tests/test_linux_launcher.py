"""The launcher's process (linux/launcher.py, linux/reaper.py) with real processes: jobs run and
report their code, time limit and output; an orphan below it (what `--restore-sibling` makes of a
restored init) is its child, reaped the moment it exits with its status reported; and after the
owner is gone it stays while it has children, reaps them, then exits."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import trio
from drumsd.linux import procfs
from drumsd.linux.launcher import Launcher, LauncherError

# A job that leaves an orphan (as criu --restore-sibling leaves an init) and prints its pid.
ORPHAN = "sleep {s} & echo $!"


def wait_until(predicate, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def state(pid: int) -> str | None:
    st = procfs.read_stat(pid)
    return None if st is None else st.state


async def test_a_job_reports_code_output_and_cpu(tmp_path: Path) -> None:
    launcher = Launcher(2)
    try:
        log = tmp_path / "out.log"
        done = await launcher.run(["sh", "-c", "echo hi; echo err >&2; exit 3"], log)
        assert done.returncode == 3 and not done.timed_out
        assert log.read_text() == "hi\nerr\n"
        env_done = await launcher.run(["sh", "-c", 'test "$X" = y'], log, env={"X": "y"})
        assert env_done.returncode == 0
    finally:
        launcher.close()


async def test_a_job_over_its_limit_is_killed(tmp_path: Path) -> None:
    launcher = Launcher(2)
    try:
        t0 = time.monotonic()
        done = await launcher.run(["sleep", "30"], tmp_path / "log", timeout_s=0.3)
        assert done.timed_out and done.returncode == -signal.SIGKILL
        assert time.monotonic() - t0 < 10
    finally:
        launcher.close()


async def test_a_command_that_cannot_start_is_a_clear_error(tmp_path: Path) -> None:
    launcher = Launcher(1)
    try:
        with pytest.raises(LauncherError, match="could not start the command"):
            await launcher.run(["/nonexistent/criu", "restore"], tmp_path / "log")
    finally:
        launcher.close()


async def test_jobs_beyond_size_wait_their_turn(tmp_path: Path) -> None:
    launcher = Launcher(1)
    try:
        t0 = time.monotonic()
        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(launcher.run, ["sleep", "0.2"], tmp_path / f"{i}.log")
        assert time.monotonic() - t0 >= 0.55  # one at a time
    finally:
        launcher.close()


async def test_an_orphan_is_its_child_and_reaped_at_once(tmp_path: Path) -> None:
    launcher = Launcher(2)
    try:
        log = tmp_path / "log"
        await launcher.run(["sh", "-c", ORPHAN.format(s=0.5)], log)
        orphan = int(log.read_text().split()[-1])
        assert launcher.is_parent_of(orphan)
        status = await launcher.exit_status(orphan, timeout_s=10)
        assert status is not None and os.waitstatus_to_exitcode(status) == 0
        assert state(orphan) is None  # reaped, not a zombie
        # Not its child: no status, after the wait asked for.
        assert await launcher.exit_status(os.getpid(), timeout_s=0.05) is None
    finally:
        launcher.close()


def test_it_outlives_its_owner_while_it_has_children(tmp_path: Path) -> None:
    launcher = Launcher(2)
    log = tmp_path / "log"
    trio.run(launcher.run, ["sh", "-c", ORPHAN.format(s=30)], log)
    orphan = int(log.read_text().split()[-1])
    reaper = launcher.pid
    launcher.close()  # the daemon gone (a kill -9 closes the socket the same way)
    time.sleep(0.3)
    assert state(reaper) not in (None, "Z"), "the launcher's process left with a child"
    os.kill(orphan, signal.SIGKILL)
    assert wait_until(lambda: state(orphan) is None, 5), "the orphan was not reaped at once"
    # With no child left it exits (a zombie of this test process until reaped here).
    assert wait_until(lambda: state(reaper) in (None, "Z"), 5)
    os.waitpid(reaper, 0)


def test_it_does_not_hold_its_owners_pipes(tmp_path: Path) -> None:
    """A daemon run in a pipeline (`drumsd serve | tee`) ends the pipe when it exits, even while
    the launcher's process lives on for the desktops it holds."""
    import subprocess
    import sys

    owner = (
        "import sys, trio\n"
        "from pathlib import Path\n"
        "from drumsd.linux.launcher import Launcher\n"
        "l = Launcher(1)\n"
        f"trio.run(l.run, ['sh', '-c', {ORPHAN.format(s=30)!r}], Path({str(tmp_path / 'log')!r}))\n"
        "print('ran', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=10)  # EOF only once no process holds the pipe
        assert out == b"ran\n"
    finally:
        proc.kill()
        proc.wait(timeout=30)
        orphan = int((tmp_path / "log").read_text().split()[-1])
        os.kill(orphan, signal.SIGKILL)
