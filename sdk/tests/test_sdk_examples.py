"""The examples run against the in-process daemon, and the RL loop leaks nothing when it fails."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from sdk_harness import Daemon

import drums

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TASK_FILE = Path("/work/shared/osworld/os/e0df059f-28a6-4169-924f-b9623e7184cc.json")
INLINE_TASK = {"id": "e0df059f", "instruction": "Rename todo_list_Jan_1.", "config": []}


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task() -> Any:
    # The shared OSWorld file when present (sent inline, since it exists here), else a copy.
    return str(TASK_FILE) if TASK_FILE.is_file() else INLINE_TASK


def test_first_episode_runs_and_cleans_up(daemon: Daemon, tmp_path: Path) -> None:
    example = load("first_episode")
    out = tmp_path / "out"
    with daemon.client() as client:
        scores = example.first_episode(client, task(), out)
    # The stand-in scores any episode that acted (every copy here); which copies really solve
    # the task is checked against a real daemon and checker in test_sdk_processes.py.
    assert len(scores) == 4 and all(s == 1.0 for s in scores.values()), scores
    assert sorted(p.name for p in out.iterdir()) == [
        "child0.png", "child1.png", "child2.png", "child3.png", "parent.png", "start.png",
    ]  # fmt: skip
    assert daemon.leftovers() == ([], [])


def test_rl_loop_runs_episodes_and_drops_invalid_ones(daemon: Daemon) -> None:
    example = load("rl_loop")
    calls = {"n": 0}

    with daemon.client() as client:

        def policy(obs: drums.Observation) -> Any:
            calls["n"] += 1
            if calls["n"] == 4:  # the second episode goes bad, as when a gate fails mid-episode
                client.attach(obs.meta["env_id"]).quarantine("a gate failed mid-episode")
            return {"type": "done"} if calls["n"] % 3 == 0 else "pyautogui.press('a')"

        rewards = example.run_episodes(client, task(), episodes=3, policy=policy, max_steps=5)
    assert rewards == [1.0, None, 1.0]
    assert daemon.leftovers() == ([], [])


@pytest.mark.parametrize("failure", ["exception", "ctrl-c"])
def test_rl_loop_leaks_nothing_when_interrupted(daemon: Daemon, failure: str) -> None:
    example = load("rl_loop")
    calls = {"n": 0}

    def policy(obs: drums.Observation) -> Any:
        calls["n"] += 1
        if calls["n"] == 7:  # mid-way through the second episode
            if failure == "exception":
                raise RuntimeError("the policy crashed")
            os.kill(os.getpid(), signal.SIGINT)
        return "pyautogui.press('a')"

    expected = RuntimeError if failure == "exception" else KeyboardInterrupt
    with pytest.raises(expected):
        with daemon.client() as client:
            example.run_episodes(client, task(), episodes=5, policy=policy, max_steps=5)
    assert calls["n"] == 7
    assert daemon.leftovers() == ([], [])
