"""The SkyRL adapter drives a few steps on the fake drumsd (verl: verl_check.py in its venv)."""

from __future__ import annotations

import json

import pytest
from drums_verifiers.adapters.skyrl import DrumsSkyRLEnv, parse_tool_call, uniform_rewards


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
    assert fake_host.stats()["live_slots"] == []  # closed with the trajectory's last step
    env.close()


def test_skyrl_env_ends_an_invalid_episode_without_reward_or_raise(fake_host):
    env = skyrl_env(fake_host, "crash")
    env.init([])
    env.step(call(action="type", text="42"))
    out = env.step(call(action="done"))  # raising here would crash skyrl-train's gather
    assert out["done"] and out["reward"] == 0.0 and out["metadata"]["drums_valid"] is False
    assert "no_app_crash" in out["metadata"]["drums"]["dropped"]
    assert env.get_metrics()["drums_valid"] == 0.0
    assert fake_host.stats()["live_slots"] == []  # closed when the trajectory ended
    env.close()  # and close() stays safe


def test_skyrl_make_registered_env_from_env_vars(fake_host, monkeypatch):
    import skyrl_gym

    monkeypatch.setenv("DRUMS_URL", fake_host.url)
    monkeypatch.setenv("DRUMS_TOKEN_FILE", str(fake_host.token_file))
    monkeypatch.delenv("DRUMS_TOKEN", raising=False)
    env = skyrl_gym.make("drums", env_config={}, extras={"drums_task": "solve", "max_turns": 3})
    assert isinstance(env, DrumsSkyRLEnv)
    assert "(from DRUMS_URL)" in env.daemon.resolve(announce=False).describe()
    env.init([])
    assert len(fake_host.stats()["live_slots"]) == 1
    env.close()
    assert fake_host.stats()["live_slots"] == []


def test_skyrl_init_failure_and_step_error_leave_nothing(fake_host):
    env = skyrl_env(fake_host, "no-such-task")
    with pytest.raises(Exception, match=r"(?i)task"):
        env.init([])
    assert fake_host.stats()["live_slots"] == [] and env.client is None
    env = skyrl_env(fake_host, "solve")
    env.init([])
    env.screen = None  # a bug of ours mid-step: the desktop must still go
    with pytest.raises(AttributeError):
        env.step(call(action="click", x=1, y=1))
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


def test_uniform_rewards_gives_a_left_out_float_the_batch_s_per_token_form():
    """skyrl-train's RayPPOTrainer refuses a batch mixing float and per-token rewards (a left-out
    trajectory's 0.0 beside the others' lists failed its generate); floats alone stay floats."""
    assert uniform_rewards([[0.0, 1.0], 0.0], [[5, 6], [7]]) == [[0.0, 1.0], [0.0]]
    assert uniform_rewards([[0.0, 0.0, 1.0], 0.5], [[1, 2, 3], [4, 5]]) == [
        [0.0, 0.0, 1.0],
        [0.0, 0.5],
    ]
    assert uniform_rewards([1.0, 0.0], [[1], [2, 3]]) == [1.0, 0.0]
