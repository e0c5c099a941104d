"""vf-eval against a real drumsd with the Linux runtime: a scripted solve scores 1, a probe 0.

Skipped unless DRUMS_LIVE_URL is set. It takes a task factory build (`python -m
drums_tasks.build --seed S --out DIR`): DIR/tasks.jsonl and DIR/solutions.jsonl. The mock policy
replays the task's oracle through the `hybrid` tools (pyautogui code and commands run as the
desktop user via `computer_shell`), then `computer_done`; the probe gives up at once.

    DRUMS_LIVE_URL=http://127.0.0.1:7070 DRUMS_LIVE_TOKEN_FILE=/etc/drums/token \
    DRUMS_LIVE_BUILD=/var/lib/drums/factory [DRUMS_LIVE_TASK=<id>] pytest -m live ...
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest
from drums_verifiers.testing.mock_policy import MockPolicy
from vf_support import Fake, by_task, error_text, vf_eval

pytestmark = [pytest.mark.live, pytest.mark.skipif(
    not os.environ.get("DRUMS_LIVE_URL"), reason="needs a real drumsd (DRUMS_LIVE_URL)")]


def oracle_script(actions: list[Any]) -> list[dict[str, Any]]:
    """The oracle's drumsd actions as hybrid tool calls a scripted policy makes."""
    steps: list[dict[str, Any]] = []
    for action in actions:
        if isinstance(action, str):
            code = action if "import pyautogui" in action else f"import pyautogui\n{action}"
            steps.append({"tool": "computer_shell",
                          "arguments": {"command": f"python3 -c {shlex.quote(code)}"}})
        elif action.get("type") == "execute":
            cmd = action["command"]
            steps.append({"tool": "computer_shell", "arguments": {
                "command": cmd if isinstance(cmd, str) else shlex.join(cmd)}})
        elif action.get("type") == "wait":
            steps.append({"tool": "computer_wait", "arguments": {"seconds": action["seconds"]}})
        else:
            raise ValueError(f"no hybrid tool replays {action!r}")
    return [*steps, {"tool": "computer_done", "arguments": {}}]


def test_real_daemon_scripted_solve_scores_1_and_probe_0(tmp_path: Path):
    build = Path(os.environ["DRUMS_LIVE_BUILD"])
    tasks = {json.loads(line)["id"]: json.loads(line)
             for line in (build / "tasks.jsonl").read_text().splitlines() if line.strip()}
    solutions = {json.loads(line)["id"]: json.loads(line)
                 for line in (build / "solutions.jsonl").read_text().splitlines() if line}
    task_id = os.environ.get("DRUMS_LIVE_TASK") or next(iter(tasks))
    task = tasks[task_id]
    for name, marker in (("solve", "live-solve"), ("probe", "live-probe")):
        task_dir = tmp_path / name
        task_dir.mkdir()
        (task_dir / "task.json").write_text(json.dumps(
            {**task, "id": f"{task_id}", "instruction": f"[policy:{marker}] "
                                                       f"{task.get('instruction', '')}"}))
    scripts = {"live-solve": oracle_script(solutions[task_id]["oracle"]["actions"]),
               "live-probe": [{"tool": "computer_fail", "arguments": {}}]}
    policy = MockPolicy(scripts)
    policy.base_url = f"http://127.0.0.1:{policy.serve()}/v1"  # type: ignore[attr-defined]
    fake = Fake(url=os.environ["DRUMS_LIVE_URL"],
                token_file=Path(os.environ.get("DRUMS_LIVE_TOKEN_FILE", "/etc/drums/token")),
                task_dir=tmp_path, daemon=None)  # type: ignore[arg-type]
    try:
        for name, expected in (("solve", 1.0), ("probe", 0.0)):
            episodes = vf_eval(fake, policy, tmp_path / f"out-{name}", tmp_path / name,
                               "--env.taskset.task.tool-style", "hybrid",
                               "--env.taskset.task.max-turns", "60",
                               records=tmp_path / "records.jsonl", timeout=1800)
            trace = by_task(episodes)[task_id][0]
            assert trace["ok"], error_text(trace)
            assert trace["rewards"]["drums"]["score"] == expected
            assert trace["info"]["drums"]["verdict"] == "valid"
    finally:
        policy.close()
