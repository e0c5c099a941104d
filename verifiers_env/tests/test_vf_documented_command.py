"""The README's vf-eval command for a new user, run as written.

Only the values are swapped for the test's: the model, the model server (the scripted policy),
the task dir, the daemon URL and its token file; every flag is the README's, nothing added. The
command used to need `--env.agent.runtime.type subprocess` (else a cloud sandbox, and exit 1 "not
authenticated with prime"). Against the fake drumsd here; against a real desktop in prime-rl's
own environment in test_vf_primerl.py.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from vf_support import error_text, write_tasks

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- vf-eval: new user"


def documented_command() -> tuple[dict[str, str], list[str]]:
    """(environment assignments, argv) of the README's block."""
    text = (REPO / "README.md").read_text()
    block = text.split(MARKER, 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def with_values(argv: list[str], values: dict[str, str]) -> list[str]:
    """argv with the value after each option in `values` replaced; every option must be there."""
    out = list(argv)
    for option, value in values.items():
        assert option in out, f"the README's command has no {option}: {argv}"
        out[out.index(option) + 1] = value
    return out


def run_documented(
    exe: str, tmp_path: Path, model_url: str, daemon_url: str, token_file: Path, task_dir: Path,
    model: str = "mock-policy", extra_env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess, list[dict]]:  # fmt: skip
    assignments, argv = documented_command()
    assert argv[0] == "vf-eval", argv
    argv = with_values(
        [exe, *argv[1:]],
        {
            "-m": model,
            "--client.base-url": model_url,
            "--env.taskset.task-dir": str(task_dir),
            "--env.taskset.task.daemon.url": daemon_url,
            "--env.taskset.task.daemon.token-file": str(token_file),
        },
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DRUMS_", "PRIME_"))}
    env.update({name: "not-a-secret" for name in assignments})
    env.update(extra_env or {})
    env["HOME"] = str(tmp_path / "home")  # no prime login, no config of this machine's user
    proc = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    found = sorted(tmp_path.rglob("traces.jsonl"))
    episodes = [json.loads(x) for x in found[-1].read_text().splitlines()] if found else []
    return proc, episodes


def test_the_readme_command_runs_as_written(fake_host, policy, tmp_path):
    write_tasks(tmp_path / "tasks", ["solve"])
    exe = str(Path(sys.executable).with_name("vf-eval"))
    proc, episodes = run_documented(
        exe, tmp_path, policy.base_url, fake_host.url, fake_host.token_file, tmp_path / "tasks"
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == 1, proc.stderr[-3000:]
    assert traces[0]["ok"], error_text(traces[0])
    assert traces[0]["rewards"]["task_success"]["score"] == 1.0, traces[0]["rewards"]
    assert fake_host.stats()["live_slots"] == []


pytestmark = pytest.mark.integration
