"""Long-lived threads that fork criu.

With `--restore-sibling` a restored init is a child of the thread that forked criu; a
kill-on-parent-death signal inherited by a tree would fire when that thread exits, so criu is
never forked from a short-lived worker (trio's thread cache retires idle threads). These threads
live as long as the runtime. Results come back to trio through the run's token.
"""

from __future__ import annotations

import os
import queue
import select
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio


@dataclass(frozen=True)
class Finished:
    returncode: int
    elapsed_s: float
    cpu_s: float = 0.0  # user + system time of the child (and the children it waited for)
    timed_out: bool = False  # killed after its time limit


@dataclass
class _Job:
    argv: Sequence[str]
    log: Path
    env: dict[str, str] | None
    timeout_s: float | None
    done: trio.Event
    token: trio.lowlevel.TrioToken
    result: Finished | BaseException | None = None


class Launcher:
    """`await launcher.run(argv, log)` forks argv on one of `size` dedicated threads, waits for
    it to exit and returns its code; stdout and stderr go to `log`."""

    def __init__(self, size: int) -> None:
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._serve, name=f"drums-launcher-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def _serve(self) -> None:
        while True:
            job = self._queue.get()
            if job is None:
                return
            t0 = time.monotonic()
            try:
                with open(job.log, "ab") as log:
                    proc = subprocess.Popen(
                        list(job.argv),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=log,
                        close_fds=True,
                        env=job.env,
                    )
                # A criu fed a broken image can spin forever: bound it, then kill it (the
                # caller kills what it restored, through the slot's cgroups).
                timed_out = False
                pidfd = os.pidfd_open(proc.pid)
                try:
                    ready, _, _ = select.select([pidfd], [], [], job.timeout_s)
                finally:
                    os.close(pidfd)
                if not ready:
                    timed_out = True
                    proc.kill()
                # wait4 rather than Popen.wait: the CPU cost of a restore is the figure that
                # does not depend on what else the host runs.
                _, status, usage = os.wait4(proc.pid, 0)
                proc.returncode = os.waitstatus_to_exitcode(status)
                job.result = Finished(
                    proc.returncode,
                    time.monotonic() - t0,
                    usage.ru_utime + usage.ru_stime,
                    timed_out,
                )
            except BaseException as exc:  # delivered to the awaiting task
                job.result = exc
            try:
                job.token.run_sync_soon(job.done.set)
            except trio.RunFinishedError:
                pass

    async def run(
        self,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Finished:
        job = _Job(argv, log, env, timeout_s, trio.Event(), trio.lowlevel.current_trio_token())
        self._queue.put(job)
        # Not cancellable: the child must be waited for, or it would be left unreaped.
        with trio.CancelScope(shield=True):
            await job.done.wait()
        if isinstance(job.result, BaseException):
            raise job.result
        assert job.result is not None
        return job.result

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
