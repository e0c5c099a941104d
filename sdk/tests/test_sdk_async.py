"""Every method of the async client and env, under asyncio and trio (the `run_async` param)."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from sdk_harness import Daemon

import drums
from drums import models as m

Run = Callable[..., Any]


def test_daemon_level_calls(daemon: Daemon, run_async: Run) -> None:
    async def body() -> None:
        async with daemon.aclient() as client:
            assert await client.ping() is True
            assert (await client.health()).version
            tasks = await client.tasks()
            assert (await client.task(tasks[0].id)).id == tasks[0].id
            assert (await client.metrics()).window_s >= 0
            assert isinstance(await client.reset_metrics(), m.Metrics)
            assert isinstance(await client.list_states(), list)
            assert await client.list_envs() == []

    run_async(body)


def test_episode_fork_save_verify(daemon: Daemon, run_async: Run) -> None:
    async def body() -> None:
        async with daemon.aclient() as client:
            async with client.create(task="task-ok", idle_timeout_s=600) as env:
                assert (await env.wait_valid(timeout=10)).valid is True
                assert (await env.gates()).episode == 1
                obs = await env.observe()
                assert obs.png.startswith(b"\x89PNG") and obs.instruction
                assert (await env.step("pyautogui.click(1, 1)")).actions == 1
                assert (await env.step({"type": "hotkey", "keys": ["ctrl", "s"]})).actions == 2
                assert (await env.verify()).score == 1.0
                assert (await env.verify(strict=False, timeout=30)).valid
                assert (await env.reset()).episode == 2
                assert (await env.refresh()).episode == 2
                assert (await env.metrics()).episode == 2
                assert (await env.wait_quiescent(timeout=5)).quiescent
                assert (await env.load_task({"id": "t2", "instruction": "x"})).id == "t2"

                async with env.fork(3) as children:
                    assert len(children) == 3
                    assert [c.slot.parent for c in children] == [env.id] * 3
                    assert (await children[1].verify()).score == 0.0  # no action yet
                    prefork_id = children.state.id
                assert prefork_id not in [s.id for s in await client.list_states()]
                assert [s.id for s in await client.list_envs()] == [env.id]

                state = await env.save(keep=False)
                assert (await client.get_state(state)).id == state.id
                copy = await client.create(from_state=state)
                assert copy.slot.checkpoint == state.id

                assert (await env.quarantine("bad")).state == m.SlotState.quarantined
                with pytest.raises(drums.Quarantined):
                    await env.step("x")
                assert (await env.release()).state == m.SlotState.ready

                other = await client.attach(env.id)
                assert other.id == env.id and not other.owned
                await other.close()
                with pytest.raises(drums.EnvGone):
                    await env.gates()
            saved = await env._client.list_states()
            assert state.id in [s.id for s in saved]  # kept until the client closes

    run_async(body)
    assert daemon.leftovers() == ([], [])


def test_delete_state_and_keep(daemon: Daemon, run_async: Run) -> None:
    async def body() -> str:
        async with daemon.aclient() as client:
            env = await client.create()
            kept = await env.save()  # lives until its lease runs out
            doomed = await env.save(keep=False)
            await client.delete_state(doomed.id)
            with pytest.raises(drums.NotFound):
                await client.get_state(doomed)
            return kept.id

    kept_id = run_async(body)
    assert daemon.leftovers() == ([], [kept_id])
