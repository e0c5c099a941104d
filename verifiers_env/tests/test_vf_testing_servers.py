"""The fake drumsd answers in the SDK's wire shapes; the mock policy streams tool calls."""

from __future__ import annotations

import asyncio
import json
import urllib.request

import drums
import pytest
from drums_verifiers import desktop
from drums_verifiers.config import DaemonConfig
from drums_verifiers.testing.mock_policy import completion_chunks, next_step
from vf_support import SCRIPTS


def test_fake_drumsd_through_the_sdk(fake_host):
    task = json.loads((fake_host.task_dir / "fork.json").read_text())

    async def scenario():
        client = await desktop.open_client(
            DaemonConfig(url=fake_host.url, token_file=fake_host.token_file)
        )
        try:
            env = await desktop.create_env(client, task, 60)
            assert (await desktop.wait_valid(env, 10)).valid is True
            obs = await desktop.observe(env)
            assert obs.instruction.startswith("[policy:child]")
            assert desktop.png_size(obs.png) == (192, 108)
            await desktop.step(env, {"type": "type", "text": "42"})
            outcomes = []
            async with desktop.fork(env, 3) as children:
                for child in children:
                    try:
                        await desktop.wait_valid(child, 10)
                        outcomes.append("valid")
                    except drums.InvalidEpisode as exc:
                        outcomes.append(f"invalid:{','.join(desktop.failed_gates(exc))}")
                result = await desktop.verify(children[0], 10)
            assert outcomes == ["valid", "invalid:alive_after_resume", "valid"]
            assert result.score == 1.0 and result.trusted is True
            attached = await desktop.attach_env(client, desktop.env_id(env))
            assert attached.id == env.id
            await desktop.close_env(env)
        finally:
            await desktop.aclose_client(client)

    asyncio.run(scenario())
    stats = fake_host.stats()
    assert stats["live_slots"] == [] and stats["checkpoints"] == []


def test_fake_drumsd_refuses_a_wrong_token(fake_host):
    request = urllib.request.Request(
        f"{fake_host.url}/v1/slots", headers={"Authorization": "Bearer nope"}
    )
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=10)
    assert info.value.code == 401
    assert json.loads(info.value.read())["error"]["code"] == "unauthorized"


def test_mock_policy_follows_the_script_by_turn():
    convo = [{"role": "user", "content": [{"type": "text", "text": "[policy:probe] go"}]}]
    assert next_step(convo, SCRIPTS)["tool"] == "computer_click"
    convo += [{"role": "assistant", "content": ""}, {"role": "tool", "content": "ok"}]
    assert next_step(convo, SCRIPTS)["tool"] == "computer_done"
    convo += [{"role": "assistant", "content": ""}, {"role": "tool", "content": "ok"}]
    assert "finished" in next_step(convo, SCRIPTS)["text"]
    chunks = completion_chunks("m", {"tool": "computer_done", "arguments": {}})
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["total_tokens"] > 0


def test_mock_policy_serves_openai_streaming(policy):
    from openai import OpenAI

    client = OpenAI(base_url=policy.base_url, api_key="x")
    with client.chat.completions.stream(
        model="mock", messages=[{"role": "user", "content": "[policy:solve] hi"}]
    ) as stream:
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert call.function.name == "computer_click"
    assert json.loads(call.function.arguments) == {"x": 50, "y": 40}


def test_episode_desktops_close_on_cancellation_and_error(fake_host):
    from drums_verifiers.episode import EpisodeDesktops

    daemon = DaemonConfig(url=fake_host.url, token_file=fake_host.token_file)
    created = asyncio.Event()

    async def episode(fail: bool):
        async with EpisodeDesktops(daemon) as owner:
            await owner.create("solve", 60)
            await owner.create("probe", 60)
            created.set()
            if fail:
                raise RuntimeError("the rollout crashed")
            await asyncio.sleep(60)

    async def cancelled():
        task = asyncio.create_task(episode(fail=False))
        await created.wait()
        assert len(fake_host.stats()["live_slots"]) == 2
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancelled())
    assert fake_host.stats()["live_slots"] == []
    with pytest.raises(RuntimeError, match="crashed"):
        asyncio.run(episode(fail=True))
    stats = fake_host.stats()
    assert stats["live_slots"] == [] and stats["counters"]["slots_destroyed"] == 4
