"""Support for the drums-verifiers tests: fake tasks, policy scripts, a vf-eval runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drums_verifiers.testing.fake_drumsd import FakeDaemon
from drums_verifiers.testing.mock_policy import MockPolicy

TOKEN = "test-token-" + "x" * 32

# Behaviour of the fake tasks; coordinates are in the fake's 192x108 screenshot space.
TASKS: dict[str, dict[str, Any]] = {
    "solve": {
        "instruction": "[policy:solve] Type 42 into the cell.",
        "fake": {"expect": {"type": "type", "text": "42"}},
    },
    "probe": {
        "instruction": "[policy:probe] Type 42 into the cell.",
        "fake": {"expect": {"type": "type", "text": "42"}},
    },
    "dies": {
        "instruction": "[policy:solve] Type 42 (the desktop dies).",
        "fake": {"expect": {"type": "type", "text": "42"}, "gone_after_actions": 1},
    },
    "crash": {
        "instruction": "[policy:solve] Type 42 (an app crashes).",
        "fake": {"expect": {"type": "type", "text": "42"}, "invalid_after_actions": 1},
    },
    "checker": {
        "instruction": "[policy:solve] Type 42 (the checker breaks).",
        "fake": {"expect": {"type": "type", "text": "42"}, "checker_error": "boom"},
    },
    "flagged": {
        "instruction": "[policy:solve] Type 42 (audit disagrees).",
        "fake": {"expect": {"type": "type", "text": "42"}, "audit_flags": ["nondeterministic"]},
    },
    "unaudited": {
        "instruction": "[policy:solve] Type 42 (no trust verdict).",
        "fake": {"expect": {"type": "type", "text": "42"}, "trust_unknown": True},
    },
    "fork": {
        "instruction": "[policy:child] Finish typing 42.",
        "fake": {
            "expect": {"type": "type", "text": "42"},
            "invalid_children": [1],
            "pending_gate_polls": 1,
        },
    },
    "shell": {
        "instruction": "[policy:shell] Make the file.",
        "fake": {"expect": {"type": "execute"}},
    },
    "scalecua": {
        "instruction": "[policy:scalecua] Type 42.",
        "fake": {"expect": {"type": "type", "text": "42"}},
    },
    "wander": {  # the policy acts, then stops talking: the episode ends without done/fail
        "instruction": "[policy:wander] Look around.",
        "fake": {"expect": {"type": "type", "text": "42"}},
    },
}

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "solve": [
        {"tool": "computer_click", "arguments": {"x": 50, "y": 40}},
        {"tool": "computer_type", "arguments": {"text": "42"}},
        {"tool": "computer_key", "arguments": {"key": "enter"}},
        {"tool": "computer_done", "arguments": {}},
    ],
    "probe": [
        {"tool": "computer_click", "arguments": {"x": 10, "y": 10}},
        {"tool": "computer_done", "arguments": {}},
    ],
    "wander": [
        {"tool": "computer_click", "arguments": {"x": 30, "y": 20}},
        {"tool": "computer_type", "arguments": {"text": "7"}},
        {"tool": "computer_click", "arguments": {"x": 40, "y": 20}},
    ],
    "child": [
        {"tool": "computer_type", "arguments": {"text": "42"}},
        {"tool": "computer_done", "arguments": {}},
    ],
    "shell": [
        {"tool": "computer_shell", "arguments": {"command": "echo hi > /tmp/x"}},
        {"tool": "computer_done", "arguments": {}},
    ],
    "scalecua": [
        {"tool": "computer", "arguments": {"action": "click", "x": 40, "y": 30}},
        {"tool": "computer", "arguments": {"action": "write", "message": "42"}},
        {"tool": "computer", "arguments": {"action": "terminate", "status": "success"}},
    ],
}


@dataclass
class Fake:
    url: str
    token_file: Path
    task_dir: Path
    daemon: FakeDaemon

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/fake/stats", timeout=10) as r:
            return json.loads(r.read())


def fake_daemon_env(tmp_path: Path, monkeypatch: Any) -> Iterator[FakeDaemon]:
    """A fake drumsd serving TASKS, reached only through DRUMS_URL / DRUMS_TOKEN_FILE (as a
    trainer's worker is configured); for the trainer checks' `daemon` fixtures."""
    from drums_verifiers.testing.fake_drumsd import FakeDrumsd

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    fake = FakeDaemon({k: {"id": k, "snapshot": "fake", **v} for k, v in TASKS.items()}, TOKEN)
    server = FakeDrumsd(fake)
    monkeypatch.setenv("DRUMS_URL", server.serve())
    monkeypatch.setenv("DRUMS_TOKEN_FILE", str(token_file))
    monkeypatch.delenv("DRUMS_TOKEN", raising=False)
    try:
        yield fake
    finally:
        server.close()


def fake_daemon_unless_live(
    live_task: str | None, tmp_path: Path, monkeypatch: Any
) -> Iterator[FakeDaemon | None]:
    """The trainer checks' `daemon` fixture: nothing when a live task is set (DRUMS_URL names
    the real daemon then), else `fake_daemon_env`."""
    if live_task:
        yield None
        return
    yield from fake_daemon_env(tmp_path, monkeypatch)


def live_envs() -> set[str]:
    """The daemon's envs, by the SDK (works for the fake and the real daemon)."""
    import drums

    with drums.connect() as client:
        return {e.id for e in client.list_envs()}


def write_tasks(directory: Path, names: list[str]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        task = {"id": name, "snapshot": "fake", **TASKS[name]}
        (directory / f"{name}.json").write_text(json.dumps(task))


def vf_eval(
    fake: Fake,
    policy: MockPolicy,
    out: Path,
    task_dir: Path | None,
    *extra: str,
    harness: str = "null",
    records: Path | None = None,
    timeout: float = 600,
) -> list[dict[str, Any]]:
    """Run the real vf-eval CLI end to end and return the episodes it wrote (traces.jsonl:
    one episode per line, its traces inside). Without `task_dir` the tasks come from `extra`
    (e.g. `--env.taskset.task-ids`)."""
    exe = Path(sys.executable).with_name("vf-eval")
    cmd = [
        str(exe),
        "drums-verifiers",
        "-m",
        "mock-policy",
        "-r",
        "1",
        "--client.base-url",
        policy.base_url,  # type: ignore[attr-defined]
        "--client.api-key-var",
        "MOCK_POLICY_KEY",
        "--env.agent.harness.id",
        harness,
        "--env.agent.runtime.type",
        "subprocess",
        "--no-push",
        "--no-rich",
        "-o",
        str(out),
        *(["--env.taskset.task-dir", str(task_dir)] if task_dir is not None else []),
        "--env.taskset.task.daemon.url",
        fake.url,
        "--env.taskset.task.daemon.token-file",
        str(fake.token_file),
        *extra,
    ]
    env = {**os.environ, "MOCK_POLICY_KEY": "not-a-secret"}
    if records is not None:
        env["DRUMS_RECORD"] = str(records)
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    (out / "vf-eval.log").parent.mkdir(parents=True, exist_ok=True)
    (out / "vf-eval.log").write_text(f"$ {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}")
    assert proc.returncode == 0, f"vf-eval failed ({proc.returncode}):\n{proc.stderr[-6000:]}"
    found = sorted(out.rglob("traces.jsonl"))
    assert found, f"vf-eval wrote no traces.jsonl under {out}:\n{proc.stderr[-3000:]}"
    return [json.loads(line) for line in found[-1].read_text().splitlines() if line.strip()]


def by_task(episodes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every trace of every episode, by drums task id."""
    out: dict[str, list[dict[str, Any]]] = {}
    for episode in episodes:
        for trace in episode["traces"]:
            data = trace["task"]["data"]  # prime-rl's pinned verifiers has no TaskData.id
            out.setdefault(data.get("id") or data["name"], []).append(trace)
    return out


def error_text(trace: dict[str, Any]) -> str:
    return " | ".join(f"{e['type']}: {e['message']}" for e in trace.get("errors", []))
