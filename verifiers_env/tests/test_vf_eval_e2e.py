"""`vf-eval drums-verifiers ...` end to end: the real CLI, a fake drumsd, a scripted policy.

Each test runs the verifiers CLI as a subprocess (harness programs and tool servers as real
processes), then reads what it wrote (traces.jsonl, DRUMS_RECORD) and what the fake host saw.
The first run may take a minute: `uv` prepares the chat program's environment from PyPI once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from vf_support import by_task, error_text, vf_eval, write_tasks


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_nothing_left(fake) -> None:
    stats = fake.stats()
    assert stats["live_slots"] == [], f"envs leaked: {stats}"
    assert stats["checkpoints"] == [], f"fork states leaked: {stats}"


def test_single_envs_follow_the_verifier_contract(fake_host, policy, tmp_path):
    names = ["solve", "probe", "dies", "crash", "checker", "flagged", "unaudited"]
    write_tasks(tmp_path / "tasks", names)
    record_file = tmp_path / "records.jsonl"
    episodes = vf_eval(fake_host, policy, tmp_path / "out", tmp_path / "tasks", records=record_file)
    traces = {name: ts[0] for name, ts in by_task(episodes).items()}
    assert sorted(traces) == sorted(names)

    solved = traces["solve"]
    assert solved["ok"] and solved["rewards"]["task_success"]["score"] == 1.0
    assert solved["metrics"] == {
        "drums_actions": 4.0,
        "drums_reward_trusted": 1.0,
        "drums_valid": 1.0,
    }
    info = solved["info"]["drums"]
    assert info["verdict"] == "valid" and info["trusted"] is True
    assert info["actions"] == {"click": 1, "type": 1, "key": 1, "done": 1}
    assert info["env"].startswith("s") and info["fork_parent"] is None

    probe = traces["probe"]  # a valid episode that did not solve the task: a real 0
    assert probe["ok"] and probe["rewards"]["task_success"]["score"] == 0.0

    crash = traces["crash"]  # a gate failed mid-episode: no reward, dropped, never trained
    assert not crash["ok"] and crash["rewards"]["task_success"] is None
    assert "drums_invalid:invalid:no_app_crash" in error_text(crash)
    assert crash["info"]["drums"]["dropped"] == "drums_invalid:invalid:no_app_crash"
    assert crash["metrics"]["drums_valid"] == 0.0

    dies = traces["dies"]  # the desktop died mid-episode: an error
    assert not dies["ok"] and "DrumsEnvFailure" in error_text(dies)
    assert "env_gone" in dies["info"]["drums"]["error"]
    assert dies["stop_condition"] == "desktop_finished" or dies["errors"]

    checker = traces["checker"]  # the checker crashed: an error, no reward
    assert not checker["ok"] and "DrumsCheckerError" in error_text(checker)
    assert checker["info"]["drums"]["checker_error"]

    flagged = traces["flagged"]  # valid with a score, but the audit disagreed: untrusted
    assert flagged["ok"] and flagged["rewards"]["task_success"]["score"] == 1.0
    assert flagged["metrics"]["drums_reward_trusted"] == 0.0
    assert flagged["info"]["drums"]["audit_flags"] == ["nondeterministic"]

    unaudited = traces["unaudited"]  # the daemon did not say: no trust metric, never 0.0
    assert unaudited["ok"] and unaudited["rewards"]["task_success"]["score"] == 1.0
    assert "drums_reward_trusted" not in unaudited["metrics"], unaudited["metrics"]
    assert unaudited["info"]["drums"]["trusted"] is None

    # Records carry turns and timings: create, gate wait, first screenshot, each verify and
    # each tool call's desktop time.
    timings = solved["info"]["drums"]["timings"]
    assert solved["info"]["drums"]["turns"] == 4
    assert {"create", "wait_valid", "first_screenshot"} <= set(timings), timings
    assert len(timings["verify"]) == 1 and len(timings["tool_calls"]) == 4, timings
    assert all(t >= 0 for t in [timings["create"], *timings["verify"], *timings["tool_calls"]])

    # Only the valid, scored, error-free traces are trainable.
    from drums_verifiers import iter_trainable_traces

    trainable = {t["task"]["data"]["id"] for t in iter_trainable_traces(episodes)}
    assert trainable == {"solve", "probe", "flagged", "unaudited"}, trainable

    lines = records(record_file)
    assert sorted(line["task"] for line in lines) == sorted(names)
    by_name = {line["task"]: line for line in lines}
    assert by_name["solve"]["reward"] == 1.0 and by_name["solve"]["ok"]
    assert by_name["crash"]["reward"] is None
    assert by_name["crash"]["errors"] == ["drums_invalid:invalid:no_app_crash"]
    assert_nothing_left(fake_host)


def test_fork_group_drops_the_invalid_child(fake_host, policy, tmp_path):
    write_tasks(tmp_path / "tasks", ["fork"])
    record_file = tmp_path / "records.jsonl"
    episodes = vf_eval(
        fake_host,
        policy,
        tmp_path / "out",
        tmp_path / "tasks",
        "--env.fork-n",
        "3",
        "--env.prefix",
        json.dumps(["pyautogui.click(5, 5)", {"type": "click", "x": 5, "y": 5}]),
        "--env.settle-s",
        "0.05",
        records=record_file,
    )
    assert len(episodes) == 1, "a fork group is one episode"
    children = sorted(episodes[0]["traces"], key=lambda t: t["info"]["drums"]["fork_index"])
    assert [c["info"]["drums"]["fork_index"] for c in children] == [0, 1, 2]
    parents = {c["info"]["drums"]["fork_parent"] for c in children}
    assert len(parents) == 1 and None not in parents
    assert len({c["info"]["drums"]["env"] for c in children}) == 3

    good = [children[0], children[2]]
    for child in good:
        assert child["ok"] and child["rewards"]["task_success"]["score"] == 1.0
        assert child["info"]["drums"]["actions"] == {"type": 1, "done": 1}
    bad = children[1]
    assert not bad["ok"] and not bad.get("rewards", {}).get("task_success")
    assert "drums_invalid:invalid:alive_after_resume" in error_text(bad)

    counters = fake_host.stats()["counters"]
    assert counters["forks"] == 1 and counters["checkpoints_prefork"] == 1
    assert counters["checkpoints_deleted"] == 1
    # the prefix (pyautogui code, then an action dict) ran once, on the parent, before the fork
    assert counters["steps"] == 2 + 2 * 2
    assert len(records(record_file)) == 3
    assert_nothing_left(fake_host)


def test_visual_window_harness_keeps_the_last_k_screenshots(fake_host, policy, tmp_path):
    write_tasks(tmp_path / "tasks", ["solve"])
    episodes = vf_eval(
        fake_host,
        policy,
        tmp_path / "out",
        tmp_path / "tasks",
        "--env.taskset.visual-window",
        "2",
        harness="drums-verifiers",
    )
    trace = by_task(episodes)["solve"][0]
    assert trace["ok"] and trace["rewards"]["task_success"]["score"] == 1.0
    requests = [r for r in policy.requests if r["script"] == "solve"]
    assert len(requests) == 4
    assert [sum(r["images"]) for r in requests] == [1, 2, 2, 2]
    assert requests[-1]["images"][1] == 0, "the opening screenshot became a placeholder"
    assert_nothing_left(fake_host)


def test_null_harness_sees_every_screenshot(fake_host, policy, tmp_path):
    write_tasks(tmp_path / "tasks", ["solve"])
    vf_eval(fake_host, policy, tmp_path / "out", tmp_path / "tasks")
    requests = [r for r in policy.requests if r["script"] == "solve"]
    assert [sum(r["images"]) for r in requests] == [1, 2, 3, 4]


def test_scaled_jpeg_screenshots_come_from_the_daemon(fake_host, policy, tmp_path):
    """screenshot_scale / screenshot_format: the daemon scales and encodes (the step asks for
    it), the model sees jpegs of half the screen, its coordinates map back to the screen."""
    write_tasks(tmp_path / "tasks", ["solve"])
    episodes = vf_eval(
        fake_host,
        policy,
        tmp_path / "out",
        tmp_path / "tasks",
        "--env.taskset.task.screenshot-scale",
        "0.5",
        "--env.taskset.task.screenshot-format",
        "jpeg",
    )
    trace = by_task(episodes)["solve"][0]
    assert trace["ok"] and trace["rewards"]["task_success"]["score"] == 1.0, error_text(trace)
    requests = [r for r in policy.requests if r["script"] == "solve"]
    assert [r["image_types"] for r in requests][-1] == ["image/jpeg"] * 4, requests
    counters = fake_host.stats()["counters"]
    assert counters.get("step_shots_jpeg") == 3 and "step_shots_png" not in counters, counters
    (slot,) = [s for s in fake_host.daemon.slots.values() if s.task and s.task["id"] == "solve"]
    assert slot.actions[0] == {"type": "click", "x": 100, "y": 80}, slot.actions  # (50, 40) x 2


@pytest.mark.parametrize("max_turns", [None, 2])
def test_an_episode_without_done_keeps_its_tally(fake_host, policy, tmp_path, max_turns):
    """The tool server pushes the rollout state behind each result: an episode that ends with
    the model falling silent, or at the turn budget, still reaches finalize with every action
    and tool-call timing."""
    write_tasks(tmp_path / "tasks", ["wander"])
    extra = ["--env.taskset.task.max-turns", str(max_turns)] if max_turns else []
    episodes = vf_eval(fake_host, policy, tmp_path / "out", tmp_path / "tasks", *extra)
    trace = by_task(episodes)["wander"][0]
    drums = trace["info"]["drums"]
    if max_turns:
        assert trace["stop_condition"] == "turn_budget", trace["stop_condition"]
        assert drums["actions"] == {"click": 1, "type": 1}, drums
    else:
        assert drums["actions"] == {"click": 2, "type": 1}, drums
    assert len(drums["timings"]["tool_calls"]) == sum(drums["actions"].values()), drums
    assert trace["ok"] and trace["rewards"]["task_success"]["score"] == 0.0, error_text(trace)
    assert_nothing_left(fake_host)


@pytest.mark.parametrize(
    ("style", "task", "actions"),
    [
        ("scalecua", "scalecua", {"click": 1, "type": 1, "done": 1}),
        ("hybrid", "shell", {"execute": 1, "done": 1}),
    ],
)
def test_other_tool_styles(fake_host, policy, tmp_path, style, task, actions):
    write_tasks(tmp_path / "tasks", [task])
    episodes = vf_eval(
        fake_host,
        policy,
        tmp_path / "out",
        tmp_path / "tasks",
        "--env.taskset.task.tool-style",
        style,
    )
    trace = by_task(episodes)[task][0]
    assert trace["ok"], error_text(trace)
    assert trace["rewards"]["task_success"]["score"] == 1.0
    assert trace["info"]["drums"]["actions"] == actions
    tools = policy.requests[0]["tools"]
    if style == "scalecua":
        assert tools == ["computer"]
    else:
        assert {
            "computer_shell",
            "computer_read_file",
            "computer_write_file",
            "computer_launch_app",
            "computer_click",
        } <= set(tools)
    assert_nothing_left(fake_host)


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration
