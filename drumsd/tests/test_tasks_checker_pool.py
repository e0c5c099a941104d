"""The resident checker worker: its pure decisions, and real calls through it in the checker venv.

The real-venv tests compare each call with the plain path (a fresh process per call) and check
that the forked child keeps a fresh process's containment: unprivileged uid, scratch directory,
stdout apart, its own session killed at the deadline, no state carried from call to call.
"""

# Processes have no event to wait on: polls with a deadline; tiny sync file work in tests.
# ruff: noqa: ASYNC110, ASYNC240

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import trio
from drumsd.tasks import checker_pool
from drumsd.tasks.checker import metric_call, run_checker, verifier_call
from drumsd.tasks.checker_pool import (
    RETRY_START_AFTER_S,
    CheckerPool,
    WorkerFigures,
    may_start,
    parse_pid,
    parse_ready,
    replacement_reason,
)
from drumsd.tasks.getters import FileArg
from drumsd.tasks.model import TaskContext
from drumsd.tasks.testing import checker_context

# ---- pure parts ----------------------------------------------------------------------------


def test_replacement_reason_names_death_signal_and_memory() -> None:
    assert replacement_reason(True, 200.0, 1024) is None
    assert replacement_reason(True, None, 1024) is None
    assert "SIGKILL" in (replacement_reason(False, None, 1024, -signal.SIGKILL) or "")
    assert "exit 3" in (replacement_reason(False, None, 1024, 3) or "")
    assert "unknown" in (replacement_reason(False, None, 1024) or "")
    why = replacement_reason(True, 1500.0, 1024)
    assert why is not None and "1500 MiB" in why and "1024 MiB" in why


def test_a_failed_start_is_retried_only_after_the_window() -> None:
    assert may_start(100.0, None)
    assert not may_start(100.0, 99.0)
    assert may_start(100.0 + RETRY_START_AFTER_S, 100.0)


def test_ready_line_must_say_ready() -> None:
    assert parse_ready(b'{"ready": true, "pid": 7}\n')["pid"] == 7
    with pytest.raises(RuntimeError, match="instead of its ready line"):
        parse_ready(b"Traceback (most recent call last)")
    with pytest.raises(RuntimeError, match="ready line is"):
        parse_ready(b'{"ready": false}')
    with pytest.raises(RuntimeError, match="ready line is"):
        parse_ready(b"[1]")


def test_pid_line_is_a_real_pid_or_none() -> None:
    assert parse_pid(b'{"pid": 4242}') == 4242
    for bad in (b'{"pid": 1}', b'{"pid": -3}', b'{"pid": "9"}', b"[]", b"garbage", b""):
        assert parse_pid(bad) is None, bad


def test_replacements_keep_the_last_ten_reasons() -> None:
    figures = WorkerFigures()
    for n in range(12):
        figures.note_replacement(f"why {n}")
    assert figures.replaced == 12 and figures.last_error == "why 11"
    assert figures.history == [f"why {n}" for n in range(2, 12)]


# ---- real calls through a worker of the checker venv -------------------------------------


@pytest.fixture(scope="session")
def ctx() -> TaskContext:
    return checker_context()


@pytest.fixture
async def pool(ctx: TaskContext):
    assert ctx.checker is not None
    pool = CheckerPool(ctx.checker)
    try:
        yield pool
    finally:
        await pool.aclose()


def write_verifier(directory: Path, body: str, name: str = "drums_verifier_pool") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.py").write_text(body)
    return directory


CALLS = [
    ("exact_match", ["a", {"expected": "b"}], None),
    ("compare_text_file", [FileArg("r/a.txt", b"x\ny\n"), FileArg("g/a.txt", b"x\ny\n")], None),
    ("compare_text_file", [FileArg("r/a.txt", None), FileArg("g/a.txt", b"z\n")], None),
    ("no_such_metric", [], None),
]


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_worker_scores_as_fresh_processes_do(ctx: TaskContext, pool: CheckerPool) -> None:
    assert ctx.checker is not None
    for func, args, options in CALLS:
        call = metric_call(func, args, options)
        plain = await run_checker(call, ctx.checker, 60)
        resident = await pool.run(call, 60)
        assert (resident.score, resident.error_class) == (plain.score, plain.error_class), func
    health = pool.health()
    assert health["calls"] == len(CALLS) and health["fallback_calls"] == 0
    assert health["ready"] and health["rss_mib"] > 50


async def _child_is_unprivileged_in_scratch_with_stdout_apart(
    ctx: TaskContext, pool: CheckerPool, tmp_path: Path
) -> None:
    assert ctx.checker is not None
    module_dir = write_verifier(
        tmp_path / "verifiers",
        "import os, tempfile\n"
        "def who(paths, options):\n"
        "    print('noise on stdout {')\n"
        "    here = os.getcwd()\n"
        "    ok = os.getuid() == options['uid'] and os.getgid() == options['uid']\n"
        "    ok = ok and os.getgroups() in ([], [options['uid']])\n"
        "    ok = ok and paths['f'].startswith(here) and os.environ['HOME'] == here\n"
        "    ok = ok and tempfile.gettempdir() == here and os.getsid(0) == os.getpid()\n"
        "    return 1.0 if ok and open(paths['f']).read() == 'hi' else 0.0\n",
    )
    args = [{"f": FileArg("r/f.txt", b"hi")}, {"uid": ctx.checker.uid}]
    if os.geteuid() != 0:
        args[1]["uid"] = os.getuid()
    call = verifier_call(module_dir, "drums_verifier_pool", "who", args, None)
    out = await pool.run(call, 60)
    assert out.score == 1.0, out
    assert "noise on stdout" in out.stderr_tail
    assert pool.figures.fallback_calls == 0


async def _a_call_does_not_see_the_last_calls_module_state(
    pool: CheckerPool, tmp_path: Path
) -> None:
    module_dir = write_verifier(
        tmp_path / "v",
        "import json\n"
        "def taint(paths, options):\n"
        "    json.TAINTED = True\n"
        "    return 1.0\n"
        "def clean(paths, options):\n"
        "    return 0.0 if hasattr(json, 'TAINTED') else 1.0\n",
    )
    for check in ("taint", "clean"):
        out = await pool.run(
            verifier_call(module_dir, "drums_verifier_pool", check, [{}, {}], None), 60
        )
        assert out.score == 1.0, (check, out)


def pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie awaiting its reaper is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


async def _deadline_kills_the_hung_childs_session(pool: CheckerPool, tmp_path: Path) -> None:
    out_dir = Path(tempfile.mkdtemp(prefix="drums-pool-test-"))  # the checker's uid writes here
    out_dir.chmod(0o777)
    module_dir = write_verifier(
        tmp_path / "v",
        "import os, subprocess, time\n"
        "def hang(paths, options):\n"
        "    helper = subprocess.Popen(['sleep', '600'])\n"
        "    open(options['out'] + '/pids', 'w').write(f'{os.getpid()} {helper.pid}')\n"
        "    time.sleep(600)\n",
    )
    call = verifier_call(
        module_dir, "drums_verifier_pool", "hang", [{}, {"out": str(out_dir)}], None
    )
    started = time.monotonic()
    out = await pool.run(call, 2.0)
    assert out.error_class == "timeout" and out.score is None, out
    assert time.monotonic() - started < 10
    pids = [int(p) for p in (out_dir / "pids").read_text().split()]
    shutil.rmtree(out_dir)
    with trio.fail_after(10):
        while any(pid_exists(p) for p in pids):
            await trio.sleep(0.05)
    # The worker itself lives on and serves the next call.
    again = await pool.run(metric_call("exact_match", ["a", {"expected": "a"}], None), 60)
    assert again.score == 1.0 and pool.figures.replaced == 0


async def _a_crashing_child_is_a_crash_and_the_worker_serves_on(
    pool: CheckerPool, tmp_path: Path
) -> None:
    module_dir = write_verifier(
        tmp_path / "v", "import os\ndef die(paths, options):\n    os._exit(9)\n"
    )
    out = await pool.run(
        verifier_call(module_dir, "drums_verifier_pool", "die", [{}, {}], None), 60
    )
    assert out.error_class == "crash" and "without an answer" in (out.error or ""), out
    again = await pool.run(metric_call("exact_match", ["a", {"expected": "a"}], None), 60)
    assert again.score == 1.0 and pool.figures.replaced == 0


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_a_killed_worker_is_replaced_and_the_next_call_works(pool: CheckerPool) -> None:
    call = metric_call("exact_match", ["a", {"expected": "a"}], None)
    assert (await pool.run(call, 60)).score == 1.0
    first = pool.health()["pid"]
    os.kill(first, signal.SIGKILL)
    with trio.fail_after(10):
        while pid_exists(first):
            await trio.sleep(0.05)
    out = await pool.run(call, 60)
    assert out.score == 1.0, out
    health = pool.health()
    assert health["pid"] != first and health["replaced"] == 1 and health["fallback_calls"] == 0
    assert "SIGKILL" in health["last_error"]


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_a_worker_above_its_memory_bound_is_replaced(ctx: TaskContext) -> None:
    assert ctx.checker is not None
    pool = CheckerPool(ctx.checker, max_rss_mib=64)  # any worker with pandas loaded is above
    try:
        call = metric_call("exact_match", ["a", {"expected": "a"}], None)
        assert (await pool.run(call, 60)).score == 1.0
        first = pool.figures.pid
        assert pool.figures.replaced == 1 and "above its bound of 64 MiB" in (
            pool.figures.last_error or ""
        )
        assert (await pool.run(call, 60)).score == 1.0
        assert pool.figures.pid != first
    finally:
        await pool.aclose()


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_a_worker_that_cannot_start_leaves_calls_on_the_plain_path(
    ctx: TaskContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ctx.checker is not None
    broken = tmp_path / "worker.py"
    broken.write_text("import sys\nprint('no metrics here', file=sys.stderr)\nsys.exit(3)\n")
    monkeypatch.setattr(checker_pool, "worker_script", lambda: broken)
    pool = CheckerPool(ctx.checker)
    try:
        out = await pool.run(metric_call("exact_match", ["a", {"expected": "a"}], None), 60)
        assert out.score == 1.0, out
        health = pool.health()
        assert health["fallback_calls"] == 1 and not health["ready"]
        assert "exited before it was ready (exit 3)" in health["last_error"]
        # No second start attempt inside the retry window: the next call is plain at once.
        await pool.run(metric_call("exact_match", ["a", {"expected": "a"}], None), 60)
        assert pool.health()["fallback_calls"] == 2
    finally:
        await pool.aclose()


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_serve_starts_the_worker_and_replaces_it_when_killed(ctx: TaskContext) -> None:
    assert ctx.checker is not None
    pool = CheckerPool(ctx.checker)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.serve)
        with trio.fail_after(120):
            while not pool.health()["ready"]:
                await trio.sleep(0.1)
        first = pool.health()["pid"]
        os.kill(first, signal.SIGKILL)
        with trio.fail_after(120):
            while pool.health()["pid"] in (first, None) or not pool.health()["ready"]:
                await trio.sleep(0.1)
        assert pool.figures.replaced == 1
        nursery.cancel_scope.cancel()
    assert pool.health()["pid"] is None


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_one_worker_keeps_each_call_contained(
    ctx: TaskContext, pool: CheckerPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One worker (its start is most of the cost) through the containment checks in turn.

    Also: the worker outlives the thread that started it. trio starts processes from a worker
    thread that ends once idle; a worker tied to that thread's life (PR_SET_PDEATHSIG) was killed
    about every 10 s and paid its imports again."""
    from trio._core import _thread_cache

    monkeypatch.setattr(_thread_cache, "IDLE_TIMEOUT", 0.2)
    await _child_is_unprivileged_in_scratch_with_stdout_apart(ctx, pool, tmp_path / "a")
    first = pool.figures.pid
    await _a_call_does_not_see_the_last_calls_module_state(pool, tmp_path / "b")
    await _deadline_kills_the_hung_childs_session(pool, tmp_path / "c")  # >= 2 s: threads end
    await _a_crashing_child_is_a_crash_and_the_worker_serves_on(pool, tmp_path / "d")
    assert first is not None and pool.figures.pid == first and pid_exists(first)
    assert pool.figures.replaced == 0 and pool.figures.fallback_calls == 0
