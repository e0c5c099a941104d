"""The documented first episode (examples/first_episode.py) against a real daemon: the example
task named by a prefix of its id, a fork of 4 verified at once (with alive_after_s at its default,
so verify must wait for the pending gate), metrics()["cost"], save, restore and delete_state;
every child valid True, the solving ones scored 1, nothing left afterwards. And the main job from
a clean clone with no ../shared beside it (DRUMS_LIVE=1, root, CRIU, the base/office images).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

import drums
import pytest
from live_daemon import free_port, require_live, start_live_daemon, stop_and_clean

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TASKS = REPO / "examples" / "tasks"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "first_episode", REPO / "examples/first_episode.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_first_episode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = Path(tempfile.mkdtemp(prefix="drums-first-"))
    daemon = start_live_daemon(root, alive_after_s=5.0, tasks={"dirs": [str(EXAMPLE_TASKS)]})
    try:
        example = load_example()
        verified: list[drums.VerifyResult] = []
        real_verify = drums.Env.verify

        def recording_verify(env: drums.Env, **kw: Any) -> drums.VerifyResult:
            verified.append(real_verify(env, **kw))
            return verified[-1]

        monkeypatch.setattr(drums.Env, "verify", recording_verify)
        with drums.connect(daemon.url, token=daemon.token) as client:
            scores = example.first_episode(client, example.TASK, tmp_path / "out")
            cost = client.metrics()["cost"]
            assert isinstance(cost, dict) and cost, cost
            kinds = [s.kind.value for s in client.list_states()]
            # The prefork and the saved state are gone; what is left is the template and the
            # daemon's own checkpoint of the task's setup (task checkpoints, reaped by lease).
            assert [k for k in kinds if k != "task"] == ["template"], kinds
            assert kinds.count("task") <= 1, kinds
        assert list(scores.values()) == [1.0, 0.0, 1.0, 0.0], scores
        assert [v.valid for v in verified] == [True] * 4, verified
        assert all(v.task_id and v.task_id.startswith(example.TASK) for v in verified)
        with drums.connect(daemon.url, token=daemon.token) as client:
            assert client.list_envs() == []
    finally:
        stop_and_clean(daemon, root / "state", root)


def test_the_main_job_runs_from_a_clean_clone(tmp_path: Path) -> None:
    require_live("office")
    if shutil.which("git") is None:
        pytest.fail("git is needed to clone the checkout")
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    clone = tmp_path / "elsewhere" / "drums"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "checkout", "-q", head], check=True)
    assert not (clone.parent / "shared").exists()
    state = Path(tempfile.mkdtemp(prefix="drums-mainjob-"))
    env = {
        **os.environ,
        "DRUMS_MAIN_DIR": str(tmp_path / "run"),
        "DRUMS_MAIN_STATE_DIR": str(state),
        "DRUMS_PORT": str(free_port()),
    }
    env.pop("DRUMS_OSWORLD_DIR", None)
    try:
        proc = subprocess.run(
            ["bash", "scripts/main-job.sh"],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            target = line.split()[4]
            if target.startswith(str(state)):
                subprocess.run(["umount", "-l", target], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    scores = [line for line in proc.stdout.splitlines() if ": score " in line]
    assert [line.rsplit(" ", 1)[1] for line in scores] == ["1.0", "0.0", "1.0", "0.0"], out[-4000:]
    assert "dropped" not in proc.stdout and "cost:" in proc.stdout and "restored it as" in out
    assert "shared" not in (tmp_path / "run" / "drumsd.json").read_text()
