"""drums.osworld.DesktopEnv driven by a loop shaped like OSWorld's run_single_example (reset,
agent predictions, step per action with its pause, evaluate, screenshots recorded), written here,
over three shared OSWorld tasks: one solved by a script (1), one left alone (0), one infeasible
answered FAIL (1); every step's info carries the gate verdict, and a step that crashes the xterm
turns it invalid (no_app_crash); with require_terminal the observation has the xterm's text.
No env is left afterwards. DRUMS_LIVE=1; the tasks come from
/work/shared/osworld (skipped, clearly, when absent).
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import drums
import pytest
from drums.osworld import DesktopEnv
from live_daemon import start_live_daemon, stop_and_clean

OSWORLD = Path("/work/shared/osworld")
RENAME = OSWORLD / "os" / "e0df059f-28a6-4169-924f-b9623e7184cc.json"
INFEASIBLE = OSWORLD / "os" / "c288e301-e626-4b98-a1ab-159dcb162af5.json"


def run_single_example(
    env: DesktopEnv, predict: Callable[[str, dict], list[Any]], task: dict, out: Path
) -> float:
    """reset, predict, step each action with its pause, record screenshots, evaluate."""
    obs = env.reset(task_config=task)
    out.mkdir(parents=True, exist_ok=True)
    (out / "step_0.png").write_bytes(obs["screenshot"])
    done, step = False, 0
    while not done and step < 5:
        for action in predict(task["instruction"], obs):
            step += 1
            obs, _reward, done, info = env.step(action, pause=0.5)
            (out / f"step_{step}.png").write_bytes(obs["screenshot"])
            assert info["valid"] is not False and info["env_id"] == env.env.id, info
            if done:
                break
    return env.evaluate()


def solver(instruction: str, obs: dict) -> list[Any]:
    return [
        "import subprocess; subprocess.run(['mv', '/home/user/Desktop/todo_list_Jan_1', "
        "'/home/user/Desktop/todo_list_Jan_2'])",
        "DONE",
    ]


def idler(instruction: str, obs: dict) -> list[Any]:
    return [{"action_type": "MOVE_TO", "parameters": {"x": 100, "y": 100}}, {"action_type": "DONE"}]


def refuser(instruction: str, obs: dict) -> list[Any]:
    return ["FAIL"]


def terminal_text_is_observed(client: drums.Client) -> None:
    """require_terminal=True: obs["terminal"] is the desktop xterm's text, with what a command
    typed into it printed, and reading it is no action of the episode."""
    with DesktopEnv(client=client, require_terminal=True) as env:
        obs = env.reset()
        assert isinstance(obs["terminal"], str) and "$" in obs["terminal"], obs["terminal"]
        env.step("pyautogui.click(480, 300)", pause=0.2)  # into the xterm
        obs, _, _, _ = env.step("pyautogui.typewrite('echo drums-$((6*7))\\n')", pause=0.5)
        lines = obs["terminal"].splitlines()
        assert any(line.endswith("echo drums-$((6*7))") for line in lines), lines
        assert "drums-42" in lines, lines  # the shell's output, not only the typed line
        assert env.env is not None and env.env.actions == 2


def crashed_gate_shows_in_the_step_info(client: drums.Client, task: dict) -> None:
    """A step that crashes the desktop's xterm (SIGSEGV: the no_app_crash gate fails): the
    steps' info turns invalid naming the gate, and with raise_on_invalid a step raises."""
    with DesktopEnv(client=client) as env:
        env.reset(task_config=task)
        _, _, _, info = env.step("import os; os.system('pkill -SEGV -x xterm')", pause=0.2)
        deadline = time.monotonic() + 15
        while info["valid"] is not False and time.monotonic() < deadline:
            _, _, _, info = env.step("WAIT", pause=0.2)
        assert info["valid"] is False and info["verdict"] == "invalid", info
        assert "no_app_crash" in info["failed_gates"], info
        env.raise_on_invalid = True
        with pytest.raises(drums.InvalidEpisode) as err:
            env.step("WAIT", pause=0)
        assert "no_app_crash" in err.value.failed_gates


def test_desktopenv_runs_the_osworld_loop(tmp_path: Path) -> None:
    if not (RENAME.is_file() and INFEASIBLE.is_file()):
        pytest.skip(f"no shared OSWorld tasks at {OSWORLD} (fixtures for this test only)")
    root = Path(tempfile.mkdtemp(prefix="drums-dtenv-"))
    daemon = start_live_daemon(root)
    try:
        with drums.connect(daemon.url, token=daemon.token) as client:
            cases = [
                ("solve", json.loads(RENAME.read_text()), solver, "pyautogui", 1.0),
                ("idle", json.loads(RENAME.read_text()), idler, "computer_13", 0.0),
                ("infeasible", json.loads(INFEASIBLE.read_text()), refuser, "pyautogui", 1.0),
            ]
            for name, task, predict, space, expected in cases:
                with DesktopEnv(action_space=space, client=client) as env:
                    score = run_single_example(env, predict, task, tmp_path / name)
                    assert score == expected, (name, score, env.last_verify)
                    assert env.last_verify is not None and env.last_verify.valid, env.last_verify
                assert client.list_envs() == [], name
                assert (tmp_path / name / "step_1.png").stat().st_size > 1000
            terminal_text_is_observed(client)
            crashed_gate_shows_in_the_step_info(client, json.loads(RENAME.read_text()))
            assert client.list_envs() == []
    finally:
        stop_and_clean(daemon, root / "state", root)
