"""The verl and SkyRL adapters drive a few steps on the fake drumsd, without GPUs."""

from __future__ import annotations

import asyncio
import json

import pytest
from drums_verifiers.adapters.skyrl import DrumsSkyRLEnv, parse_tool_call
from drums_verifiers.adapters.verl import DrumsComputerTool, run_desktop_episode
from drums_verifiers.verdict import DrumsInvalidEpisode


def call(**arguments) -> str:
    return (
        f"I will act.<tool_call>{json.dumps({'name': 'computer', 'arguments': arguments})}"
        "</tool_call>"
    )


def skyrl_env(fake, task: str) -> DrumsSkyRLEnv:
    return DrumsSkyRLEnv(
        env_config={"daemon_url": fake.url, "token_file": str(fake.token_file)},
        extras={"drums_task": task, "max_turns": 6},
    )


def test_skyrl_env_solves_a_task(fake_host):
    env = skyrl_env(fake_host, "solve")
    prompt, meta = env.init([{"role": "system", "content": "be brief"}])
    assert prompt[1]["content"][1]["type"] == "image_url" and meta["env"]
    out = env.step(call(action="click", x=20, y=20))
    assert not out["done"] and out["observations"][0]["content"][1]["type"] == "image_url"
    out = env.step("no tool call here")
    assert "error: no <tool_call>" in out["observations"][0]["content"]
    env.step(call(action="type", text="42"))
    out = env.step(call(action="done"))
    assert out["done"] and out["reward"] == 1.0
    assert out["metadata"]["drums"]["verdict"] == "valid"
    assert env.get_metrics() == {
        "drums_valid": 1.0,
        "drums_actions": 3.0,
        "drums_reward_trusted": 1.0,
    }
    env.close()
    assert fake_host.stats()["live_slots"] == []


def test_skyrl_env_refuses_to_reward_an_invalid_episode(fake_host):
    env = skyrl_env(fake_host, "crash")
    env.init([])
    env.step(call(action="type", text="42"))
    with pytest.raises(DrumsInvalidEpisode, match="drums_invalid:invalid:no_app_crash"):
        env.step(call(action="done"))
    env.close()
    assert fake_host.stats()["live_slots"] == []


def test_skyrl_turn_limit_ends_with_the_checker(fake_host):
    env = skyrl_env(fake_host, "probe")
    env.init([])
    outs = [env.step(call(action="wait", seconds=0)) for _ in range(6)]
    assert [o["done"] for o in outs] == [False] * 5 + [True]
    assert outs[-1]["reward"] == 0.0
    env.close()


def test_parse_tool_call_rejects_other_tools():
    with pytest.raises(ValueError, match="only tool"):
        parse_tool_call('<tool_call>{"name": "bash", "arguments": {}}</tool_call>')


def scripted(*steps):
    replies = iter(steps)

    async def generate(messages, tools):
        assert tools[0]["function"]["name"] == "computer"
        args = next(replies)
        if args is None:
            return {"role": "assistant", "content": "finished"}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "computer", "arguments": json.dumps(args)},
                }
            ],
        }

    return generate


def test_verl_tool_and_loop_solve_and_release(fake_host):
    tool = DrumsComputerTool({"daemon_url": fake_host.url, "token_file": str(fake_host.token_file)})
    result = asyncio.run(
        run_desktop_episode(
            tool,
            scripted(
                {"action": "click", "x": 10, "y": 10},
                {"action": "type", "text": "42"},
                {"action": "done"},
            ),
            "solve",
        )
    )
    assert result.reward == 1.0 and result.error is None
    assert result.info["actions"] == {"click": 1, "type": 1, "done": 1}
    tool_msgs = [m for m in result.messages if m["role"] == "tool"]
    assert [m["images"] for m in tool_msgs] == [1, 1, 0]
    assert fake_host.stats()["live_slots"] == []


def test_verl_episode_on_a_dying_desktop_has_no_reward(fake_host):
    tool = DrumsComputerTool({"daemon_url": fake_host.url, "token_file": str(fake_host.token_file)})
    result = asyncio.run(
        run_desktop_episode(
            tool, scripted({"action": "click", "x": 10, "y": 10}, {"action": "done"}), "dies"
        )
    )
    assert result.reward is None and "DrumsEnvFailure" in result.error
    assert "env_gone" in result.info["error"]
    assert fake_host.stats()["live_slots"] == []
