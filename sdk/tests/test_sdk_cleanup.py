"""Nothing leaks: exceptions, Ctrl-C and cancellation still destroy every env the client made,
cleanup has its own deadline, and leaks that could not be avoided are reported with their ids."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Callable

import anyio
import pytest
from sdk_harness import Daemon

import drums
from drums._shield import sigint_held

Run = Callable[..., Any]
SLOT = r"/v1/slots/[^/]+"


class Boom(Exception):
    pass


def test_an_exception_inside_a_fork_block_removes_children_and_state(daemon: Daemon) -> None:
    with pytest.raises(Boom):
        with daemon.client() as client:
            env = client.create(task="task-ok")
            with pytest.raises(Boom):
                with env.fork(4) as children:
                    children[2].step("pyautogui.press('x')")
                    raise Boom
            envs, states = daemon.leftovers()
            assert envs == [env.id] and states == []  # only the parent is left ...
            raise Boom
    assert daemon.leftovers() == ([], [])  # ... until the client exits


def test_async_exception_inside_a_fork_block(daemon: Daemon, run_async: Run) -> None:
    async def body() -> None:
        async with daemon.aclient() as client:
            env = await client.create()
            async with env.fork(3):
                await env.save(keep=False)
                raise Boom

    with pytest.raises(Boom):
        run_async(body)
    assert daemon.leftovers() == ([], [])


def test_ctrl_c_mid_episode_leaks_nothing_sync(daemon: Daemon) -> None:
    with pytest.raises(KeyboardInterrupt):
        with daemon.client() as client:
            env = client.create(task="task-ok")
            env.save(keep=False)
            with env.fork(2):
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered right here
                time.sleep(5)  # not reached: the signal interrupts the sleep
    assert daemon.leftovers() == ([], [])


def test_ctrl_c_mid_episode_leaks_nothing_async(daemon: Daemon, run_async: Run) -> None:
    async def body() -> None:
        async with daemon.aclient() as client:
            env = await client.create(task="task-ok")
            async with env.fork(2):
                await env.save(keep=False)
                os.kill(os.getpid(), signal.SIGINT)
                await anyio.sleep(5)

    # Before 3.11 asyncio cannot turn its SIGINT cancellation back into KeyboardInterrupt.
    stopped = (KeyboardInterrupt,) if sys.version_info >= (3, 11) else (BaseException,)
    started = time.monotonic()
    with pytest.raises(stopped):
        run_async(body)
    assert time.monotonic() - started < 4
    assert daemon.leftovers() == ([], [])


# The cancel lands mid-create, mid-prefork, mid-branch or in the wedged step (0.01 s left the
# created env behind before creates were shielded).
@pytest.mark.parametrize("deadline_s", [0.01, 0.05, 0.15, 0.5])
def test_cancellation_mid_call_leaks_nothing(
    daemon: Daemon, run_async: Run, deadline_s: float
) -> None:
    async def body() -> None:
        with anyio.move_on_after(deadline_s) as scope:
            async with daemon.aclient() as client:
                env = await client.create()
                async with env.fork(2) as children:
                    daemon.faults.hang("POST", f"/v1/slots/{children[0].id}/step")
                    await children[0].step("pyautogui.press('a')")  # wedged, then cancelled
        assert scope.cancelled_caught

    run_async(body)
    assert daemon.leftovers() == ([], [])


def test_cleanup_runs_even_when_the_scope_is_already_cancelled(
    daemon: Daemon, run_async: Run
) -> None:
    async def body() -> None:
        with anyio.CancelScope() as scope:
            async with daemon.aclient() as client:
                async with client.create():
                    await client.create()
                    scope.cancel()
                    await anyio.sleep(5)

    run_async(body)
    assert daemon.leftovers() == ([], [])


def test_leaks_are_reported_with_their_ids(daemon: Daemon, run_async: Run) -> None:
    faults = daemon.faults
    client = daemon.client()
    ids = {client.create().id for _ in range(2)}
    faults.error("DELETE", SLOT, "runtime_error", times=2)
    with pytest.raises(drums.CleanupFailed) as err:
        client.close()
    assert set(err.value.detail["ids"]) == ids and "reaper" in str(err.value)

    # With an exception already on its way out, that exception wins; the leak is only logged.
    faults.error("DELETE", SLOT, "runtime_error", times=1)
    with pytest.raises(Boom):
        with daemon.client() as other:
            other.create()
            raise Boom

    async def body() -> None:
        faults.error("DELETE", SLOT, "runtime_error", times=1)
        async with daemon.aclient() as aclient:
            await aclient.create()

    with pytest.raises(drums.CleanupFailed):
        run_async(body)


def test_cleanup_has_its_own_deadline(daemon: Daemon, run_async: Run) -> None:
    quick = drums.Timeouts(default_s=5.0, cleanup_s=0.5)
    daemon.faults.hang("DELETE", SLOT, times=1000)
    client = daemon.client(timeout=quick)
    for _ in range(3):
        client.create()
    started = time.monotonic()
    with pytest.raises(drums.CleanupFailed):
        client.close()
    assert time.monotonic() - started < 3  # 0.5 s budget, not 3 x 5 s

    async def body() -> None:
        async with daemon.aclient(timeout=quick) as aclient:
            for _ in range(3):
                await aclient.create()

    started = time.monotonic()
    with pytest.raises(drums.CleanupFailed) as err:
        run_async(body)
    assert time.monotonic() - started < 3
    assert len(err.value.detail["ids"]) == 3


def test_sigint_is_held_during_cleanup_and_raised_after() -> None:
    reached_end_of_block = False
    with pytest.raises(KeyboardInterrupt):
        with sigint_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            reached_end_of_block = True
    assert reached_end_of_block
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_overlapping_holds_restore_the_handler_whatever_order_they_end() -> None:
    first, second = sigint_held(), sigint_held()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)  # ends before the one that started after it
    assert signal.getsignal(signal.SIGINT) is not signal.default_int_handler  # still held
    second.__exit__(None, None, None)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_closed_client_says_so(daemon: Daemon, run_async: Run) -> None:
    client = daemon.client()
    client.close()
    with pytest.raises(drums.ConnectionFailed, match="closed"):
        client.health()

    async def body() -> None:
        aclient = daemon.aclient()
        await aclient.aclose()
        with pytest.raises(drums.ConnectionFailed, match="closed"):
            await aclient.health()

    run_async(body)


def test_a_sigint_handler_not_set_from_python_is_no_typeerror(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """issue 14, finding 8: signal.signal() returns None when the previous handler was not set
    from Python (at shutdown after Ctrl-C, or embedded); putting that back was a TypeError."""
    real = signal.signal
    calls = []

    def from_c_first(signum: int, handler: Any) -> Any:
        previous = real(signum, handler)
        calls.append(handler)
        return None if len(calls) == 1 else previous

    monkeypatch.setattr(signal, "signal", from_c_first)
    with sigint_held():
        pass
    assert calls[-1] is signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
