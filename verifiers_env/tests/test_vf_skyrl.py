"""The SkyRL env through skyrl-train 0.3.1's SkyRLGymGenerator (skyrl_check.py) and skyrl 0.3.0's
SkyRLVLMGymGenerator (skyrl_vlm_check.py), each in its own venv."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_vf_verl import live_run, slow_rows
from trainer_checks import passed, run_check


def test_skyrl_env_through_skyrl_train_generator():
    """skyrl_check.py against the fake drumsd; on the days CI samples the skyrl-trainer row
    (always with DRUMS_TRAINER_MATRIX=1) also one step of skyrl-train's RayPPOTrainer.train."""
    trainer = "skyrl-trainer" in slow_rows()
    env = {"DRUMS_SKYRL_LIVE_TASK": "", "DRUMS_SKYRL_TRAINER": "1" if trainer else ""}
    result = run_check("skyrl", "skyrl_check.py", env)
    assert passed(result) == 9 + trainer


def test_skyrl_env_through_skyrl_vision_generator():
    result = run_check("skyrl-vlm", "skyrl_vlm_check.py", {"DRUMS_SKYRL_VLM_LIVE_TASK": ""})
    assert passed(result) == 2


@pytest.mark.live
def test_skyrl_env_on_a_real_daemon(tmp_path: Path):
    lines = live_run(
        tmp_path, "skyrl", "skyrl_check.py", "DRUMS_SKYRL_LIVE_TASK", "DRUMS_SKYRL_RESULT", 3
    )  # the live episode and the checks that need no daemon (registration, refused screenshots)
    assert len(lines) == 1


@pytest.mark.live
def test_skyrl_vision_generator_group_of_four_on_a_real_daemon(tmp_path: Path):
    """A GRPO group of 4 through skyrl's SkyRLVLMGymGenerator on a real task, one sample's model
    server dying mid-trajectory: screenshots in every turn, the failed one out of its group, no
    slot left (live_run lists the daemon's slots after)."""
    if "skyrl-vlm" not in slow_rows():
        pytest.skip("slow row, not CI's sample today: DRUMS_TRAINER_MATRIX=1 runs it")
    (line,) = live_run(
        tmp_path, "skyrl-vlm", "skyrl_vlm_check.py", "DRUMS_SKYRL_VLM_LIVE_TASK",
        "DRUMS_SKYRL_VLM_RESULT",
    )  # fmt: skip
    assert '"valid": [1.0, 1.0, 0.0, 1.0]' in line


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration
