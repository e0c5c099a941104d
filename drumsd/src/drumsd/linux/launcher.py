"""Forking criu from a process that outlives the daemon.

With `--restore-sibling` a restored init is a child of whatever forked criu. The launcher runs
every criu through its own process (linux/reaper.py, started once per runtime in its own
session): that process is the inits' parent, reaps each the moment it exits, even after a kill -9
of drumsd, and reports how it ended. Results come back to trio through the run's token, read by
one thread from the launcher's socket.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from drumsd.linux import procfs

log = logging.getLogger("drumsd.launcher")
REAPER = Path(__file__).with_name("reaper.py")
KEEP_STATUSES = 4096  # exit statuses of inits nobody asked for yet (the newest kept)


@dataclass(frozen=True)
class Finished:
    returncode: int
    elapsed_s: float
    cpu_s: float = 0.0  # user + system time of the child (and the children it waited for)
    timed_out: bool = False  # killed after its time limit


@dataclass
class _Job:
    done: trio.Event
    token: trio.lowlevel.TrioToken
    result: Finished | BaseException | None = None


class LauncherError(RuntimeError):
    """The launcher's process is gone or refused a job (the message says which)."""


class Launcher:
    """`await launcher.run(argv, log)` forks argv in the launcher's process (at most `size` at
    once), waits for it to exit and returns how; stdout and stderr go to `log`.
    `await launcher.exit_status(pid, timeout_s)` is the wait status of an init it reaped."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._jobs: dict[int, _Job] = {}
        self._next = 0
        self._statuses: OrderedDict[int, int] = OrderedDict()
        self._status_waiters: dict[int, tuple[trio.Event, trio.lowlevel.TrioToken]] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._start()

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        with theirs:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", str(REAPER), str(theirs.fileno()), str(self._size)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # it may outlive the daemon: never hold its pipes
                stderr=subprocess.DEVNULL,  # (its own failure comes back as {"fatal": ...})
                start_new_session=True,  # a signal to the daemon's process group is not for it
            )
        self._sock = ours
        threading.Thread(
            target=self._read, args=(ours,), name="drums-launcher", daemon=True
        ).start()

    def _read(self, sock: socket.socket) -> None:
        buffer = b""
        while True:
            try:
                data = sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                break
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                self._deliver(json.loads(line))
        self._fail_all(LauncherError("the launcher's process exited; restart drumsd"))

    def _deliver(self, msg: dict[str, Any]) -> None:
        if "fatal" in msg:
            log.error("the launcher's process failed:\n%s", msg["fatal"])
            self._fail_all(LauncherError(f"the launcher's process failed: {msg['fatal'][-300:]}"))
            return
        with self._lock:
            if "reaped" in msg:
                pid = int(msg["reaped"])
                self._statuses[pid] = int(msg["status"])
                while len(self._statuses) > KEEP_STATUSES:
                    self._statuses.popitem(last=False)
                waiter = self._status_waiters.get(pid)
                if waiter is not None:
                    _wake(*waiter)
                return
            job = self._jobs.pop(int(msg["id"]), None)
        if job is None:
            return
        if "error" in msg:
            job.result = LauncherError(f"could not start the command: {msg['error']}")
        else:
            job.result = Finished(
                int(msg["returncode"]),
                float(msg["elapsed_s"]),
                float(msg["cpu_s"]),
                bool(msg["timed_out"]),
            )
        _wake(job.done, job.token)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            jobs, self._jobs = self._jobs, {}
        for job in jobs.values():
            job.result = exc
            _wake(job.done, job.token)

    def _send(self, job_id: int, request: dict[str, Any]) -> None:
        """Under the lock. A launcher process that died (killed by hand, OOM) is started anew:
        the inits it held are pid 1's from then on, as they were before it existed."""
        assert self._proc is not None and self._sock is not None
        if self._proc.poll() is not None:
            self._sock.close()
            self._start()
        assert self._sock is not None
        self._sock.sendall(json.dumps({"id": job_id, **request}).encode() + b"\n")

    async def run(
        self,
        argv: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Finished:
        job = _Job(trio.Event(), trio.lowlevel.current_trio_token())
        request = {"argv": list(argv), "log": str(log), "env": env, "timeout_s": timeout_s}
        with self._lock:
            self._next += 1
            job_id = self._next
            self._jobs[job_id] = job
            try:
                self._send(job_id, request)
            except OSError as exc:
                self._jobs.pop(job_id, None)
                raise LauncherError(f"the launcher's process did not take the job: {exc}") from exc
        # Not cancellable: the child is waited for in any case; its result must not be lost.
        with trio.CancelScope(shield=True):
            await job.done.wait()
        if isinstance(job.result, BaseException):
            raise job.result
        assert job.result is not None
        return job.result

    def is_parent_of(self, pid: int) -> bool:
        """Whether `pid` is this launcher's child (an init it restored, not an adopted one)."""
        st = procfs.read_stat(pid)
        return st is not None and self._proc is not None and st.ppid == self._proc.pid

    async def exit_status(self, pid: int, timeout_s: float) -> int | None:
        """The wait status of `pid`, reaped by the launcher's process, waiting up to
        `timeout_s` for its report; None when it was not the launcher's child."""
        event = trio.Event()
        with self._lock:
            if pid in self._statuses:
                return self._statuses.pop(pid)
            self._status_waiters[pid] = (event, trio.lowlevel.current_trio_token())
        with trio.move_on_after(timeout_s):
            await event.wait()
        with self._lock:
            self._status_waiters.pop(pid, None)
            return self._statuses.pop(pid, None)

    def close(self) -> None:
        """Stop sending jobs. The launcher's process stays while it has children (the inits
        left running for the next daemon to adopt) and reaps them as they exit."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)  # ends the reader's recv
            self._sock.close()
            self._sock = None


def _wake(event: trio.Event, token: trio.lowlevel.TrioToken) -> None:
    try:
        token.run_sync_soon(event.set)
    except trio.RunFinishedError:
        pass
