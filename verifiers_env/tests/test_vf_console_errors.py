"""A daemon that cannot be used stops vf-eval with one line on its console and exit 1.

Runs the real `vf-eval` CLI as a process (fake drumsd, scripted policy) with a missing token, a
wrong token, an unreachable daemon and an unknown task id, and reads its stderr.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from vf_support import write_tasks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_vf_eval(
    policy, tmp_path: Path, url: str, env_extra: dict[str, str], source: list[str] | None = None
) -> subprocess.CompletedProcess:
    write_tasks(tmp_path / "tasks", ["solve"])
    exe = Path(sys.executable).with_name("vf-eval")
    cmd = [
        str(exe), "drums-verifiers", "-m", "mock-policy", "-r", "1",
        "--client.base-url", policy.base_url, "--client.api-key-var", "MOCK_POLICY_KEY",
        "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess",
        "--no-push", "--no-rich", "-o", str(tmp_path / "out"),
        *(source or ["--env.taskset.task-dir", str(tmp_path / "tasks")]),
        "--env.taskset.task.daemon.url", url,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRUMS_")}
    env.update({"MOCK_POLICY_KEY": "not-a-secret", **env_extra})
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("case", ["missing-token", "wrong-token", "unreachable"])
def test_a_daemon_that_cannot_be_used_stops_vf_eval_with_one_line(
    case, fake_host, policy, tmp_path
):
    """No token, a wrong token or no daemon: vf-eval exits 1 before any rollout, with one line
    naming the daemon, the cause and the token's real source (it used to run every rollout to
    a failure and exit 0)."""
    url = fake_host.url
    if case == "missing-token":
        extra = {"DRUMS_TOKEN_FILE": str(tmp_path / "no-such-token")}
        expect = ["no drumsd token", str(tmp_path / "no-such-token"), "token-file"]
    elif case == "wrong-token":
        wrong = tmp_path / "wrong-token"
        wrong.write_text("not-the-token-" + "y" * 32)
        extra = {"DRUMS_TOKEN_FILE": str(wrong)}
        expect = ["Unauthorized", f"token source: {wrong} (DRUMS_TOKEN_FILE)"]
    else:
        url = f"http://127.0.0.1:{free_port()}"
        extra = {"DRUMS_TOKEN_FILE": str(fake_host.token_file)}
        expect = [f"drumsd {url})", "ConnectionFailed"]
    proc = run_vf_eval(policy, tmp_path, url, extra)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if "cannot load tasks" in line]
    assert len(lines) == 1, proc.stderr[-4000:]
    assert lines[0].startswith("drums-verifiers: cannot load tasks (drumsd "), lines[0]
    for part in expect:
        assert part in lines[0], lines[0]
    assert fake_host.stats()["counters"].get("slots_created", 0) == 0


def test_unknown_task_id_is_one_line_not_a_traceback(fake_host, policy, tmp_path):
    """A task id the daemon does not list stops vf-eval before any rollout with one line."""
    extra = {"DRUMS_TOKEN_FILE": str(fake_host.token_file)}
    source = ["--env.taskset.task-ids", '["solve", "no-such-task"]']
    proc = run_vf_eval(policy, tmp_path, fake_host.url, extra, source)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if "cannot load tasks" in line]
    assert lines == [
        f"drums-verifiers: cannot load tasks (drumsd {fake_host.url}): KeyError: the daemon "
        "does not know task 'no-such-task'; list them with GET /v1/tasks"
    ], proc.stderr[-4000:]
    assert fake_host.stats()["counters"].get("slots_created", 0) == 0


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration


def test_a_failed_harness_program_says_why_on_the_console(fake_host, tmp_path):
    """The drums-verifiers harness's program fails (its model server answers 404): vf-eval's
    console has one line with the program's own error, not only `stop=HarnessError`."""
    write_tasks(tmp_path / "tasks", ["solve"])
    exe = Path(sys.executable).with_name("vf-eval")
    cmd = [
        str(exe), "drums-verifiers", "-m", "mock-policy", "-r", "1",
        "--client.base-url", f"{fake_host.url}/no-model/v1", "--client.api-key-var",
        "MOCK_POLICY_KEY", "--no-push", "--no-rich", "-o", str(tmp_path / "out"),
        "--env.taskset.task-dir", str(tmp_path / "tasks"),
        "--env.taskset.task.daemon.url", fake_host.url,
        "--env.taskset.task.daemon.token-file", str(fake_host.token_file),
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRUMS_")}
    env["MOCK_POLICY_KEY"] = "not-a-secret"
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, check=False)
    lines = [line for line in proc.stderr.splitlines() if "harness drums-verifiers exited" in line]
    assert len(lines) == 1, proc.stderr[-4000:]
    assert "ERROR" in lines[0] and "(task solve)" in lines[0], lines[0]
    cause = lines[0].split("exited ", 1)[1]
    assert "Error" in cause and "Traceback" not in cause, lines[0]
    print(f"vf console: {lines[0]}")
    assert fake_host.stats()["live_slots"] == []
