"""`drumsd bench episodes` end to end, kept short: one episode of the files task per path on the
base image, through two real daemons it starts itself. Every episode must be valid, the own CPU
account must have charged the desktops and the checkers (not zero), and the daemons must leave
nothing under the state root. DRUMS_LIVE=1 (root, CRIU, the base image). Slow: two template
builds (83-101 s here), so opt-in to keep CI in its budget: DRUMS_BENCH_EPISODES=1; the bench's
pure parts (paths, feature switches, the table, the CPU account) are unit tests in CI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from drumsd.bench.common import lock_file_of
from live_daemon import mounts_under, require_live

REPO = Path(__file__).resolve().parents[2]
FILES_TASK = "0f2c5a61"  # examples/tasks/files.json


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("DRUMS_BENCH_EPISODES") != "1",
    reason="opt-in (two template builds): DRUMS_BENCH_EPISODES=1",
)
def test_bench_episodes_runs_both_paths_and_cleans_up(tmp_path: Path) -> None:
    require_live("base")
    state_root = Path(f"/run/drums-bench-episodes-test-{tmp_path.name}")
    out = tmp_path / "episodes.json"
    argv = [sys.executable, "-m", "drumsd.cli", "bench", "episodes", "--image", "base"]
    argv += ["--task", FILES_TASK, "--episodes", "2", "--steps", "3", "--task-resets", "1"]
    argv += ["--phase-episodes", "1"]
    argv += ["--skip-boot", "--state-root", str(state_root), "--out", str(out)]
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        leftovers = [str(p) for p in state_root.glob("*/state/*")]
        mounted = mounts_under(state_root)
    finally:
        if not mounts_under(state_root):
            shutil.rmtree(state_root, ignore_errors=True)
        lock_file_of(state_root).unlink(missing_ok=True)  # the run's lock, beside the root
    assert done.returncode == 0, done.stderr[-4000:]
    assert "verify p50" in done.stdout and "features off" in done.stdout, done.stdout
    result = json.loads(out.read_text())
    paths = result["paths"]
    assert set(paths) == {"drums", "features off"}
    for name, path in paths.items():
        assert path["valid_episodes"] == 2, (name, path["episodes"])
        assert path["errors"] == [], (name, path["errors"])
        # Each daemon's state_dir on a tmpfs of its own, as deployed (and unmounted after: below).
        assert path["state_fs"] == "tmpfs", (name, path["state_fs"])
        own = path["cpu_per_episode_s"]["own"]
        assert own is not None and own > 0.05, (name, path["cpu_per_episode_s"])
        assert path["task_reset_s"]["n"] == 1, path["task_reset_s"]
        # The one-at-a-time episode: every phase read; the steps and verify cost something.
        by_phase = path["cpu_by_phase_s"]
        assert by_phase["episode"]["n"] == 1, by_phase
        assert by_phase["steps"]["p50"] > 0 and by_phase["verify"]["p50"] > 0, by_phase
    off = {"tasks": {"resident_checkers": False}, "task_checkpoints": {"enabled": False}}
    # Every feature is listed with its issue; the default path before switches off issue 33's.
    assert result["features"][:2] == [
        {"name": "resident_checkers", "issue": 33, "off": {"tasks": {"resident_checkers": False}}},
        {"name": "task_checkpoints", "issue": 33, "off": {"task_checkpoints": {"enabled": False}}},
    ]
    assert result["features_off"] == ["resident_checkers", "task_checkpoints"]
    assert paths["features off"]["config_overrides"] == off
    assert "CPU-s by phase p50, 1 at a time" in done.stdout, done.stdout
    assert mounted == []
    assert leftovers == []


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("DRUMS_BENCH_EPISODES") != "1",
    reason="opt-in (a template build): DRUMS_BENCH_EPISODES=1",
)
def test_bench_episodes_ramp_profile_places_the_steps_among_the_daemons_processes(
    tmp_path: Path,
) -> None:
    """--ramp --profile on a real daemon: the sampler read the daemon's processes (the desktops
    among them) and every step of the level has its window, wall split and CPU by kind."""
    require_live("base")
    state_root = Path(f"/run/drums-bench-episodes-test-{tmp_path.name}")
    out = tmp_path / "ramp.json"
    argv = [sys.executable, "-m", "drumsd.cli", "bench", "episodes", "--image", "base"]
    argv += ["--task", FILES_TASK, "--ramp", "1", "--ramp-rounds", "2", "--steps", "3"]
    argv += ["--profile", "--state-root", str(state_root), "--out", str(out)]
    try:
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        mounted = mounts_under(state_root)
    finally:
        if not mounts_under(state_root):
            shutil.rmtree(state_root, ignore_errors=True)
        lock_file_of(state_root).unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "slow steps, profiled" in done.stdout, done.stdout
    level = json.loads(out.read_text())["ramp"]["levels"][0]
    assert level["valid"] == 2, level
    prof = level["profile"]
    assert prof["samples"] > 5 and prof["sampler_cpu_s"] > 0, prof
    assert prof["all_steps"]["n"] == 6, prof["all_steps"]
    assert prof["all_steps"]["daemon_s_p50"] > 0, prof["all_steps"]
    kinds = {kind for kind, _, _ in prof["cpu_by_command_s"]}
    assert kinds & {"desktop", "desktop (new)"} and "daemon" in kinds, prof["cpu_by_command_s"]
    assert mounted == []
