"""Resident checker workers: checker calls forked from a process that has imported the metrics.

A fresh checker process spends most of a one-line check importing desktop-env's metric modules
and pandas (issue 18: verify 1.9 s wall, 2.2 s CPU for its three checker runs). The pool keeps
one worker per checker venv (checker_worker.py) that has imported them once; each call connects
to it and gets a forked child with the isolation of a fresh process (see checker_worker.py).
drumsd still owns the deadline: the child reports its pid first, and at the deadline drumsd kills
the child's session, as it kills a fresh process's. A dead worker is replaced (watched, and again
at call time); a worker above its memory bound is replaced after the call that found it so; a
worker that cannot start leaves calls on the plain path (a fresh process each) until a retry.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import trio

from .checker import (
    CheckerCall,
    CheckerOutcome,
    call_limits,
    checker_env,
    named_limit,
    outcome_from_answer,
    prepare_scratch,
    run_checker,
    timeout_outcome,
)
from .model import CheckerEnv

log = logging.getLogger("drumsd.tasks.checker_pool")

START_TIMEOUT_S = 300.0  # imports of every metric module, cold page cache, loaded host
RETRY_START_AFTER_S = 60.0  # after a failed start, calls take the plain path this long
MAX_LINE = 1 << 16


def worker_script() -> Path:
    return Path(str(resources.files("drumsd.tasks").joinpath("checker_worker.py")))


# ---- pure parts: what a worker's figures mean ---------------------------------------------


@dataclass
class WorkerFigures:
    """What the pool knows of one worker, as /v1/health reports it."""

    pid: int | None = None
    started_at: float | None = None
    preload_s: float | None = None
    rss_mib: float | None = None
    calls: int = 0
    replaced: int = 0  # workers that died or outgrew their bound and were replaced
    fallback_calls: int = 0  # calls run as a fresh process because no worker was ready
    last_error: str | None = None
    history: list[str] = field(default_factory=list)  # why each replacement happened (last 10)

    def note_replacement(self, why: str) -> None:
        self.replaced += 1
        self.last_error = why
        self.history = [*self.history[-9:], why]


def replacement_reason(
    alive: bool, rss_mib: float | None, max_rss_mib: float, exit_code: int | None = None
) -> str | None:
    """Why a worker must be replaced now, or None while it may serve calls."""
    if not alive:
        how = f"exit {exit_code}" if exit_code is not None and exit_code >= 0 else None
        if exit_code is not None and exit_code < 0:
            how = f"killed by {signal.Signals(-exit_code).name}"
        return f"the checker worker died ({how or 'unknown'})"
    if rss_mib is not None and rss_mib > max_rss_mib:
        return f"the checker worker uses {rss_mib:.0f} MiB, above its bound of {max_rss_mib} MiB"
    return None


def may_start(now: float, last_failed_start: float | None) -> bool:
    """A worker start is tried unless one failed within RETRY_START_AFTER_S."""
    return last_failed_start is None or now - last_failed_start >= RETRY_START_AFTER_S


def parse_ready(line: bytes) -> dict[str, Any]:
    """The worker's first stdout line; anything else is a failed start (a clear error)."""
    try:
        info = json.loads(line)
    except ValueError:
        raise RuntimeError(
            f"the checker worker said {line[:200]!r} instead of its ready line"
        ) from None
    if not isinstance(info, dict) or info.get("ready") is not True:
        raise RuntimeError(f"the checker worker's ready line is {info!r}")
    return info


def parse_pid(line: bytes) -> int | None:
    """The child's first line on a call's socket: {"pid": N}, or None if it said something else."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    pid = data.get("pid") if isinstance(data, dict) else None
    return pid if isinstance(pid, int) and pid > 1 else None


def rss_mib(pid: int) -> float | None:
    """VmRSS of a process from /proc, None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


# ---- the worker and the pool --------------------------------------------------------------


class _Worker:
    def __init__(self, process: trio.Process, directory: Path, info: dict[str, Any]) -> None:
        self.process = process
        self.directory = directory
        self.socket = directory / "sock"
        self.info = info

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and self.process.poll() is None

    async def stop(self) -> None:
        """Close its stdin (it exits) and make sure; calls in flight are their own processes."""
        try:
            await self._stop()
        except Exception:  # a system task must not raise; the worker is gone or killed
            log.exception("stopping checker worker %s", self.process.pid)

    async def _stop(self) -> None:
        with trio.CancelScope(shield=True):
            if self.process.stdin is not None:
                with trio.move_on_after(1):
                    await self.process.stdin.aclose()
            with trio.move_on_after(2):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                with trio.move_on_after(5):
                    await self.process.wait()
            await trio.to_thread.run_sync(shutil.rmtree, self.directory, True)


class CheckerPool:
    """The resident worker of one checker venv, shared by every verify's checker runs."""

    def __init__(
        self,
        env: CheckerEnv,
        *,
        max_rss_mib: float = 1024,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.env = env
        self.max_rss_mib = max_rss_mib
        self.start_timeout_s = start_timeout_s
        self.figures = WorkerFigures()
        self._worker: _Worker | None = None
        self._lock = trio.Lock()
        self._last_failed_start: float | None = None

    # -- lifecycle

    async def _start(self) -> _Worker:
        directory = Path(tempfile.mkdtemp(prefix="drums-checker-worker-"))  # 0700, root's
        argv = [str(self.env.python), str(worker_script()), str(self.env.runner)]
        argv.append(str(directory / "sock"))
        started = time.monotonic()
        process = await trio.lowlevel.open_process(
            argv,
            stdin=-1,
            stdout=-1,
            cwd=str(directory),
            env=checker_env(directory),
            start_new_session=True,  # a signal to drumsd's group does not reach it
        )
        try:
            assert process.stdout is not None
            with trio.fail_after(self.start_timeout_s):
                line = b""
                while not line.endswith(b"\n") and len(line) < MAX_LINE:
                    chunk = await process.stdout.receive_some(4096)
                    if not chunk:
                        break
                    line += chunk
            info = parse_ready(line)
        except BaseException as exc:
            process.kill()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await process.wait()
            shutil.rmtree(directory, ignore_errors=True)
            if isinstance(exc, trio.TooSlowError):
                raise RuntimeError(
                    f"the checker worker of {self.env.python} was not ready within "
                    f"{self.start_timeout_s} s"
                ) from None
            if isinstance(exc, RuntimeError) and not line:
                raise RuntimeError(
                    f"the checker worker of {self.env.python} exited before it was ready "
                    f"(exit {process.returncode}); its stderr is in drumsd's log"
                ) from None
            raise
        worker = _Worker(process, directory, info)
        self.figures.pid = process.pid
        self.figures.started_at = time.time()
        self.figures.preload_s = info.get("preload_s")
        self.figures.rss_mib = rss_mib(process.pid)
        log.info(
            "checker worker %s ready in %.1f s (imports %.1f s, %.0f MiB)",
            process.pid,
            time.monotonic() - started,
            info.get("preload_s") or 0.0,
            self.figures.rss_mib or 0.0,
        )
        return worker

    async def _ready_worker(self) -> _Worker | None:
        """The live worker, started or replaced as needed; None: take the plain path."""
        async with self._lock:
            worker = self._worker
            if worker is not None:
                why = replacement_reason(
                    worker.alive, None, self.max_rss_mib, worker.process.returncode
                )
                if why is None:
                    return worker
                self._retire(worker, why)
            if not may_start(time.monotonic(), self._last_failed_start):
                return None
            try:
                self._worker = await self._start()
            except (OSError, RuntimeError) as exc:
                self._last_failed_start = time.monotonic()
                self.figures.last_error = f"start failed: {exc}"
                log.warning(
                    "checker worker cannot start (%s): checker calls run as fresh processes "
                    "for %.0f s",
                    exc,
                    RETRY_START_AFTER_S,
                )
                return None
            self._last_failed_start = None
            return self._worker

    def _retire(self, worker: _Worker, why: str) -> None:
        log.warning("checker worker %s replaced: %s", worker.process.pid, why)
        self.figures.note_replacement(why)
        if self._worker is worker:
            self._worker = None
        trio.lowlevel.spawn_system_task(worker.stop)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the worker ahead of the first verify, replace it when it dies; stop it at exit."""
        task_status.started()
        try:
            while True:
                worker = await self._ready_worker()
                if worker is None:
                    await trio.sleep(RETRY_START_AFTER_S)
                    continue
                await worker.process.wait()  # died, or retired by a call
                if self._worker is worker:
                    async with self._lock:
                        if self._worker is worker:
                            why = replacement_reason(
                                False, None, self.max_rss_mib, worker.process.returncode
                            )
                            self._retire(worker, why or "the checker worker died")
                    await trio.sleep(1)  # a worker that dies at once is not restarted in a spin
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None:
            await worker.stop()

    # -- calls

    async def run(self, call: CheckerCall, timeout_s: float) -> CheckerOutcome:
        """One checker call through the worker; the plain path when none is ready."""
        worker = await self._ready_worker()
        if worker is None:
            self.figures.fallback_calls += 1
            return await run_checker(call, self.env, timeout_s)
        try:
            outcome = await self._call(worker, call, timeout_s)
        except _WorkerGone as exc:
            # The worker died between its check and our connect: the call never started.
            async with self._lock:
                if self._worker is worker:
                    self._retire(worker, f"the checker worker refused a call: {exc}")
            self.figures.fallback_calls += 1
            return await run_checker(call, self.env, timeout_s)
        self.figures.calls += 1
        self.figures.rss_mib = rss_mib(worker.process.pid)
        why = replacement_reason(worker.alive, self.figures.rss_mib, self.max_rss_mib)
        if why is not None:
            async with self._lock:
                if self._worker is worker:
                    self._retire(worker, why)
        return outcome

    async def _call(self, worker: _Worker, call: CheckerCall, timeout_s: float) -> CheckerOutcome:
        started = time.monotonic()

        def prepare() -> tuple[Path, dict[str, Any], Path]:
            scratch, request = prepare_scratch(call, self.env)
            log_path = worker.directory / f"{scratch.name}.log"  # root's dir: the child opens
            log_path.touch(mode=0o600)  # it before it drops to the checker uid
            return scratch, request, log_path

        scratch, request, log_path = await trio.to_thread.run_sync(prepare)
        payload = {
            "request": request,
            "scratch": str(scratch),
            "log": str(log_path),
            "uid": self.env.uid,
            "gid": self.env.gid,
            "env": checker_env(scratch),
            "limits": call_limits(self.env),
        }
        pid: int | None = None
        answer = b""
        try:
            try:
                stream = await trio.open_unix_socket(str(worker.socket))
            except OSError as exc:
                raise _WorkerGone(str(exc)) from None
            async with stream:
                with trio.move_on_after(timeout_s) as scope:
                    await stream.send_all(json.dumps(payload).encode() + b"\n")
                    buffer = b""
                    while True:
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            break
                        buffer += chunk
                        if pid is None and b"\n" in buffer:
                            first, _, buffer = buffer.partition(b"\n")
                            pid = parse_pid(first)
                    answer = buffer
                if scope.cancelled_caught:
                    if pid is not None:
                        _kill_session(pid)
                    else:  # the worker never forked for us: it is stuck
                        async with self._lock:
                            if self._worker is worker:
                                self._retire(worker, "the checker worker did not fork a call")
                    return timeout_outcome(timeout_s, round(time.monotonic() - started, 3))
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(10):
                tail = await trio.to_thread.run_sync(_read_tail_and_clean, log_path, scratch)
        duration = round(time.monotonic() - started, 3)
        if pid is None and not answer:
            return outcome_from_answer(
                b"", "the checker worker closed the call before it started", duration, tail
            )
        return named_limit(
            outcome_from_answer(
                answer, "the checker process died without an answer", duration, tail
            ),
            self.env,
        )

    def runner(self, timeout_s: float) -> Callable[[CheckerCall], Awaitable[CheckerOutcome]]:
        async def run(call: CheckerCall) -> CheckerOutcome:
            return await self.run(call, timeout_s)

        return run

    def health(self) -> dict[str, Any]:
        f = self.figures
        worker = self._worker
        if worker is not None and worker.alive:
            f.rss_mib = rss_mib(worker.process.pid)
        return {
            "enabled": True,
            "venv": str(self.env.python.parent.parent),
            "ready": worker is not None and worker.alive,
            "pid": worker.process.pid if worker is not None else None,
            "rss_mib": round(f.rss_mib, 1) if f.rss_mib is not None else None,
            "max_rss_mib": self.max_rss_mib,
            "preload_s": f.preload_s,
            "calls": f.calls,
            "replaced": f.replaced,
            "fallback_calls": f.fallback_calls,
            "last_error": f.last_error,
        }


class _WorkerGone(Exception):
    pass


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_tail_and_clean(log_path: Path, scratch: Path) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 2000))
            tail = f.read().decode(errors="replace")
    except OSError:
        tail = ""
    log_path.unlink(missing_ok=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return tail
