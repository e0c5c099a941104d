"""Run inside prime-rl's own environment (scripts/trainer-venv.sh primerl: its pinned verifiers
commit, mcp 1.x, prime-rl-configs, prime-rl without its GPU dependencies), by test_vf_primerl.py.

- prime-rl's `rl @ <example> --dry-run` on both example TOMLs (its parser, its env-server configs).
- one rollout through the env-server path prime-rl's orchestrator uses: verifiers' `serve_env` on
  the env block (what prime-rl's `env-server` entry point calls), the taskset loaded client-side
  (`vf.load_taskset`, as prime-rl's `Env.start` does), and `EnvClient.run` with the task's data
  (as `Env.run` does); the drums-verifiers chat harness against a scripted policy and the fake
  drumsd (the live variant uses a real desktop: test_vf_primerl.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from drums_verifiers.testing.fake_drumsd import FakeDaemon, FakeDrumsd, load_tasks
from drums_verifiers.testing.mock_policy import MockPolicy
from vf_support import SCRIPTS, TOKEN, Fake, write_tasks

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ["rl-drums.toml", "rl-drums-fork.toml"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", EXAMPLES)
def test_rl_dry_run(name: str, tmp_path: Path) -> None:
    rl = Path(sys.executable).with_name("rl")
    cmd = [str(rl), "@", f"examples/{name}", "--dry-run", "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Dry run complete" in proc.stdout + proc.stderr
    envs = list((tmp_path / "out").rglob("envs/train/*.json"))
    assert len(envs) == 1, envs
    env = json.loads(envs[0].read_text())["env"]
    assert env["taskset"]["id"] == "drums-verifiers" and env["agent"]["harness"]["id"] == (
        "drums-verifiers"
    )
    print(f"PRIMERL-ROW rl-dry-run {name} ok")


def env_block(task_dir: Path, url: str, token_file: Path) -> dict:
    """The examples' env block, pointed at the test's daemon and tasks."""
    return {
        "taskset": {
            "id": "drums-verifiers",
            "task_dir": str(task_dir),
            "visual_window": 2,
            "task": {"daemon": {"url": url, "token_file": str(token_file)}, "tool_style": "drums"},
        },
        "agent": {"harness": {"id": "drums-verifiers"}, "runtime": {"type": "subprocess"}},
    }


def start_env_server(config: object, address: str) -> subprocess.Popen:
    """What prime-rl's `env-server` entry point runs: verifiers' serve_env on the env block."""
    from verifiers.v1.serve import env_config_data

    server_code = (
        "import json, sys; from verifiers.v1.serve import serve_env; "
        "serve_env(max_workers=1, address=sys.argv[1], config_data=json.loads(sys.argv[2]))"
    )
    data = json.dumps(env_config_data(config))  # type: ignore[arg-type]
    return subprocess.Popen([sys.executable, "-c", server_code, address, data], env=os.environ)


async def run_through_env_server(block: dict, base_url: str, task: str) -> list:
    """What prime-rl's orchestrator does (`Env.start`, `Env.run`), against one env server."""
    import verifiers.v1 as vf
    from verifiers.v1.serve import EnvClient

    config = vf.resolve_env_field({"env": block})["env"]
    address = f"tcp://127.0.0.1:{free_port()}"
    server = start_env_server(config, address)
    client = EnvClient(address=address)
    try:
        await client.wait_for_server_startup(timeout=120)
        tasks = {t.data.name: t for t in vf.load_taskset(config.taskset)}
        episode = await client.run(
            task_data=tasks[task].data.model_dump(mode="json"),
            # prime-rl trains through a vLLM generate endpoint (TrainClientConfig); the scripted
            # policy speaks chat completions, which the eval client forwards to
            client=vf.EvalClientConfig(base_url=base_url, api_key_var="MOCK_POLICY_KEY"),
            model="mock-policy",
            sampling=vf.SamplingConfig(),
        )
        return list(episode.traces)
    finally:
        await client.close()
        server.terminate()
        server.wait(timeout=60)


def test_rollout_through_env_server(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    write_tasks(tmp_path / "tasks", ["solve"])
    fake = FakeDaemon(load_tasks(tmp_path / "tasks"), TOKEN)
    drumsd = FakeDrumsd(fake)
    url = drumsd.serve()
    policy = MockPolicy(SCRIPTS, tmp_path / "policy-requests.jsonl")
    port = policy.serve()
    os.environ["MOCK_POLICY_KEY"] = "not-a-secret"
    try:
        block = env_block(tmp_path / "tasks", url, token_file)
        traces = asyncio.run(run_through_env_server(block, f"http://127.0.0.1:{port}/v1", "solve"))
        stats = Fake(url, token_file, tmp_path / "tasks", fake).stats()
    finally:
        policy.close()
        drumsd.close()
    assert len(traces) == 1, traces
    trace = traces[0]
    assert trace.ok and trace.reward == 1.0, (trace.reward, trace.errors)
    assert stats["live_slots"] == [], stats
    import verifiers

    version = getattr(verifiers, "__version__", "?")
    print(f"PRIMERL-ROW env-server {version} reward={trace.reward}")
