"""The SkyRL env through skyrl-train 0.3.1's SkyRLGymGenerator (skyrl_check.py, its own venv)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_vf_verl import live_run
from trainer_checks import passed, run_check


def test_skyrl_env_through_skyrl_train_generator():
    result = run_check("skyrl", "skyrl_check.py", {"DRUMS_SKYRL_LIVE_TASK": ""})
    assert passed(result) == 4


@pytest.mark.live
def test_skyrl_env_on_a_real_daemon(tmp_path: Path):
    lines = live_run(
        tmp_path, "skyrl", "skyrl_check.py", "DRUMS_SKYRL_LIVE_TASK", "DRUMS_SKYRL_RESULT", 2
    )  # the live episode and the registration check
    assert len(lines) == 1


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration
