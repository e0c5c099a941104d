"""Running one checker call: a throw-away process in the checker venv, as an unprivileged uid.

Each call gets a fresh scratch directory with copies of its inputs (metrics write next to their
inputs or into the working directory), a deadline after which its whole process group is killed,
and its stdout kept apart from the answer (checker_runner.py writes the answer to the original
stdout and sends every print to stderr).
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
from pathlib import Path
from typing import Any

import trio

from .getters import FileArg, XlsxLastRow
from .model import NOBODY, CheckerEnv

log = logging.getLogger("drumsd.tasks.checker")

__all__ = ["NOBODY", "CheckerCall", "CheckerEnv", "CheckerOutcome", "run_checker"]


@dataclass
class CheckerOutcome:
    score: float | None
    # crash | timeout | unsupported | bad_request | runner | memory_limit | cpu_limit
    error_class: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    stderr_tail: str = ""

    @property
    def ok(self) -> bool:
        return self.error_class is None and self.score is not None


@dataclass
class CheckerCall:
    """One metric or drums_verifier call, with its inputs encoded for the runner."""

    request: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    module_dir: Path | None = None  # drums_verifier: copied into the scratch dir


def encode_value(value: Any, files: dict[str, bytes]) -> Any:
    """A getter value as JSON for the runner; file contents go to `files` (name -> bytes)."""
    if isinstance(value, FileArg):
        if value.data is None:
            return {"__drums_file__": None}
        files[value.name] = value.data
        return {"__drums_file__": value.name}
    if isinstance(value, XlsxLastRow):
        encode_value(value.file, files)
        return {"__drums_xlsx_last_row__": value.file.name}
    if isinstance(value, list | tuple):
        return [encode_value(item, files) for item in value]
    if isinstance(value, dict):
        return {str(k): encode_value(v, files) for k, v in value.items()}
    return value


def metric_call(func: str, args: list[Any], options: dict[str, Any] | None) -> CheckerCall:
    files: dict[str, bytes] = {}
    request = {
        "kind": "metric",
        "func": func,
        "args": [encode_value(arg, files) for arg in args],
        "kwargs": encode_value(options or {}, files),
    }
    return CheckerCall(request=request, files=files)


def verifier_call(
    module_dir: Path, module: str, check: str, args: list[Any], options: dict[str, Any] | None
) -> CheckerCall:
    files: dict[str, bytes] = {}
    request = {
        "kind": "drums_verifier",
        "module": module,
        "check": check,
        "args": [encode_value(arg, files) for arg in args],
        "kwargs": encode_value(options or {}, files),
    }
    return CheckerCall(request=request, files=files, module_dir=module_dir)


def copy_python_sources(module_dir: Path, dest: Path) -> None:
    """The importable part of a verifier directory: its top-level modules and packages.

    A verifier directory is often a whole built task set (the default build holds 75 MiB of
    seeded assets beside its one verifier module); every checker run copied all of it. Sibling
    modules and packages still come along, so a verifier may import its own helpers."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in module_dir.iterdir():
        if entry.suffix == ".py" and entry.is_file():
            shutil.copy2(entry, dest / entry.name)
        elif (entry / "__init__.py").is_file():
            shutil.copytree(entry, dest / entry.name, ignore=shutil.ignore_patterns("__pycache__"))


def prepare_scratch(call: CheckerCall, env: CheckerEnv) -> tuple[Path, dict[str, Any]]:
    env.scratch_root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="drums-check-", dir=env.scratch_root))
    request = dict(call.request)
    for name, data in call.files.items():
        target = (scratch / name).resolve()
        if scratch not in target.parents:
            raise ValueError(f"checker input name {name!r} escapes the scratch directory")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    if call.module_dir is not None:
        copy = scratch / "_verifier"
        copy_python_sources(call.module_dir, copy)
        request["module_dir"] = str(copy)
    if os.geteuid() == 0:
        for dirpath, _dirs, names in os.walk(scratch):
            os.chown(dirpath, env.uid, env.gid)
            for name in names:
                os.chown(os.path.join(dirpath, name), env.uid, env.gid)
    return scratch, request


def checker_env(scratch: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(scratch),
        "TMPDIR": str(scratch),
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        "PYTHONSAFEPATH": "1",  # the scratch dir (agent-made files) is never on the path
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYMUPDF_MESSAGE": "fd:2",
        "MPLCONFIGDIR": str(scratch),
    }


# A fresh checker process imports pandas (what the resident worker preloads with the metrics) and
# then limits itself as the worker limits its children: address space past what it holds now,
# CPU past what it has used (see checker_worker.apply_limits); then it runs the runner as
# `python runner` would.
_FRESH_BOOTSTRAP = r"""
import json, math, os, resource, runpy, sys
runner, limits = sys.argv[1], json.loads(sys.argv[2])
try:
    import pandas
except ImportError:
    pass
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
if limits.get("cpu_s"):
    used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
    s = max(1, math.ceil(used + limits["cpu_s"]))
    resource.setrlimit(resource.RLIMIT_CPU, (s, s + 1))
if limits.get("memory_mib"):
    with open("/proc/self/status") as f:
        vm = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
    n = vm + (limits["memory_mib"] << 20)
    resource.setrlimit(resource.RLIMIT_AS, (n, n))
sys.argv = [runner]
sys.path.insert(0, os.path.dirname(runner))
runpy.run_path(runner, run_name="__main__")
"""


def call_limits(env: CheckerEnv) -> dict[str, Any]:
    """The limits of one checker call (tasks.checker_memory_mib, tasks.checker_cpu_s)."""
    return {"memory_mib": env.memory_mib, "cpu_s": env.cpu_s}


def named_limit(outcome: CheckerOutcome, env: CheckerEnv) -> CheckerOutcome:
    """A crash that is the call's memory limit says so: under RLIMIT_AS a MemoryError is the
    limit reached, not the checker's bug."""
    if (
        outcome.error_class == "crash"
        and env.memory_mib
        and (outcome.error or "").startswith("MemoryError")
    ):
        outcome.error_class = "memory_limit"
        outcome.error = (
            f"the checker reached its memory limit (RLIMIT_AS, tasks.checker_memory_mib="
            f"{env.memory_mib} MiB past its start): {outcome.error}"
        )
    return outcome


async def run_checker(call: CheckerCall, env: CheckerEnv, timeout_s: float) -> CheckerOutcome:
    """Run one checker call with a deadline; never raises for the checker's own failures."""
    started = time.monotonic()
    scratch, request = await trio.to_thread.run_sync(prepare_scratch, call, env)
    as_other = os.geteuid() == 0
    result: Any = None
    timed_out = False

    async def kill_group(process: trio.Process) -> None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    try:
        with trio.move_on_after(timeout_s) as scope:
            limits = json.dumps(call_limits(env))
            result = await trio.run_process(
                [str(env.python), "-c", _FRESH_BOOTSTRAP, str(env.runner), limits],
                stdin=json.dumps(request).encode(),
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=str(scratch),
                env=checker_env(scratch),
                start_new_session=True,
                deliver_cancel=kill_group,
                **({"user": env.uid, "group": env.gid, "extra_groups": []} if as_other else {}),
            )
        timed_out = scope.cancelled_caught
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await trio.to_thread.run_sync(shutil.rmtree, scratch, True)
    duration = round(time.monotonic() - started, 3)
    if timed_out:
        return timeout_outcome(timeout_s, duration)
    if result.returncode == -signal.SIGXCPU:
        return CheckerOutcome(
            score=None,
            error_class="cpu_limit",
            error=f"the checker reached its CPU limit (RLIMIT_CPU, tasks.checker_cpu_s="
            f"{env.cpu_s}) and was killed",
            duration_s=duration,
            stderr_tail=result.stderr.decode(errors="replace")[-2000:],
        )
    outcome = outcome_from_answer(
        result.stdout,
        f"the checker process died without an answer (exit {result.returncode})",
        duration,
        result.stderr.decode(errors="replace")[-2000:],
    )
    return named_limit(outcome, env)


class CheckerSlots:
    """How many checker calls run at once (tasks.max_concurrent_checkers; the others wait), and
    the memory admission reserves for those running (tasks.checker_memory_mib each), so a
    create is refused rather than checkers taking the host (issue 39, D5)."""

    def __init__(self, max_concurrent: int, memory_mib: int | None) -> None:
        self.limiter = trio.CapacityLimiter(max_concurrent)
        self.memory_mib = memory_mib or 0
        self.waiting = 0

    def reserved_mib(self) -> float:
        return float(self.limiter.borrowed_tokens * self.memory_mib)

    def bounded(
        self, run: Callable[[CheckerCall], Awaitable[CheckerOutcome]]
    ) -> Callable[[CheckerCall], Awaitable[CheckerOutcome]]:
        async def run_bounded(call: CheckerCall) -> CheckerOutcome:
            self.waiting += 1
            try:
                await self.limiter.acquire()
            finally:
                self.waiting -= 1
            try:
                return await run(call)
            finally:
                self.limiter.release()

        return run_bounded

    def health(self) -> dict[str, Any]:
        return {
            "running": self.limiter.borrowed_tokens,
            "waiting": self.waiting,
            "max_concurrent": int(self.limiter.total_tokens),
            "memory_mib_each": self.memory_mib,
            "reserved_mib": self.reserved_mib(),
        }


def timeout_outcome(timeout_s: float, duration: float) -> CheckerOutcome:
    return CheckerOutcome(
        score=None,
        error_class="timeout",
        error=f"the checker did not answer within {timeout_s} s and was killed",
        duration_s=duration,
    )


def outcome_from_answer(raw: bytes, died: str, duration: float, stderr_tail: str) -> CheckerOutcome:
    """The runner's JSON answer as an outcome; no answer at all is a crash saying `died`."""
    try:
        answer = json.loads(raw)
    except ValueError:
        return CheckerOutcome(
            score=None,
            error_class="crash",
            error=died,
            duration_s=duration,
            stderr_tail=stderr_tail,
        )
    if answer.get("ok"):
        return CheckerOutcome(
            score=float(answer["score"]), duration_s=duration, stderr_tail=stderr_tail
        )
    return CheckerOutcome(
        score=None,
        error_class=answer.get("error_class", "crash"),
        error=answer.get("error"),
        duration_s=duration,
        stderr_tail=(answer.get("traceback") or "") + stderr_tail,
    )
