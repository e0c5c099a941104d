"""The SkyRL adapter drives a few steps on the fake drumsd (verl: verl_check.py in its venv)."""

from __future__ import annotations

import json

import pytest
from drums_verifiers.adapters.skyrl import DrumsSkyRLEnv, parse_tool_call
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
