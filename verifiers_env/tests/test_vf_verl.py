"""The verl adapter inside verl 0.9.1 itself (verl_check.py, run in the verl venv).

The unit run uses the fake drumsd; the live run starts a real drumsd on the office image and runs
the agent loop on OSWorld task e0df059f, the daemon given only through DRUMS_URL /
DRUMS_TOKEN_FILE, and lists the daemon's slots before and after.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import httpx
import pytest
from harness import day_sample
from trainer_checks import REPO, passed, result_lines, run_check

OSWORLD = REPO.parent / "shared" / "osworld"
TASK = "e0df059f-28a6-4169-924f-b9623e7184cc"


SLOW_ROWS = ("verl-v1", "skyrl-vlm", "skyrl-trainer", "primerl-live")


def slow_rows() -> set[str]:
    """The slow matrix rows this run takes: all with DRUMS_TRAINER_MATRIX=1, else one a day, in
    turn (CI's sample: each trainer's CI cost stays one live episode plus every fourth day this)."""
    if os.environ.get("DRUMS_TRAINER_MATRIX") == "1":
        return set(SLOW_ROWS)
    return set(day_sample(SLOW_ROWS, 1))


def matrix_env(row: str, var: str) -> dict[str, str]:
    return {var: "1" if row in slow_rows() else ""}


def test_verl_tool_and_agent_loop_against_verl_0_9_1():
    matrix = os.environ.get("DRUMS_TRAINER_MATRIX") == "1"  # the v1 group on the fake: opt-in
    env = {"DRUMS_VERL_LIVE_TASK": "", "DRUMS_VERL_V1_GROUP": "1" if matrix else ""}
    result = run_check("verl", "verl_check.py", env)
    assert passed(result) == 8 + 2 * matrix  # + the v1 group and the failure paths


def live_run(
    tmp_path: Path,
    name: str,
    check: str,
    task_var: str,
    marker: str,
    tests: int = 1,
    extra: dict[str, str] | None = None,
) -> list[str]:
    """Run `check` against a real drumsd (office image); the slots before and after are empty."""
    if os.environ.get("DRUMS_LIVE") != "1":
        pytest.skip("needs DRUMS_LIVE=1 (root, CRIU, the office image)")
    sys.path[:0] = [str(REPO / "tests" / "live"), str(REPO / "tests" / "integration")]
    from live_daemon import http_client, start_live_daemon, stop_and_clean

    assert OSWORLD.is_dir(), f"no shared OSWorld tasks at {OSWORLD}"
    started = time.monotonic()
    live = start_live_daemon(tmp_path / "d", image="office", tasks={"dirs": [str(OSWORLD)]})
    try:
        print(
            f"{name} live daemon {live.url}: office template in {time.monotonic() - started:.1f}s"
        )
        with http_client(live) as http:
            # One create on the task first, so the trainer's episodes restore its captured setup
            # (the first desktop of a fresh daemon replays the setup and captures it; its gate
            # once stayed pending behind that capture, fixed in the daemon since). The warm-up is
            # destroyed before `before` is listed.
            warm = http.post("/v1/slots", json={"image": "office", "task": TASK}).json()
            print(f"{name} warm-up: {warm.get('id')} task_setup={warm.get('task_setup')}")
            http.delete(f"/v1/slots/{warm['id']}")
            before = http.get("/v1/slots").json()["slots"]
        env = {task_var: TASK, "DRUMS_URL": live.url, "DRUMS_TOKEN_FILE": str(live.dir / "token")}
        env.update(extra or {})
        t0 = time.monotonic()
        result = run_check(name, check, env)
        print(f"{name} live episode in {time.monotonic() - t0:.1f}s")
        assert passed(result) == tests
        lines = result_lines(result, marker)
        print("\n".join(lines))
        with http_client(live) as http:
            after = http.get("/v1/slots").json()["slots"]
        assert before == [] and after == [], (before, after)
        return lines
    finally:
        try:
            stop_and_clean(live, tmp_path / "d" / "state")
        except httpx.HTTPError:
            pass


@pytest.mark.live
def test_verl_agent_loop_on_a_real_daemon(tmp_path: Path):
    """One episode through the drums agent loop; on the days CI samples the verl v1 row (always
    with DRUMS_TRAINER_MATRIX=1), also a GRPO group of 4 through verl's default v1 worker,
    AgentLoopWorkerTQ, with a real TransferQueue, one sample's model server dying mid-way, and a
    model error, a timeout and a cancellation mid-trajectory, each leaving no slot."""
    extra = matrix_env("verl-v1", "DRUMS_VERL_V1_GROUP")
    group = bool(extra["DRUMS_VERL_V1_GROUP"])
    lines = live_run(tmp_path, "verl", "verl_check.py", "DRUMS_VERL_LIVE_TASK", "DRUMS_VERL_",
                     1 + 2 * group, extra)  # fmt: skip
    assert len([line for line in lines if line.startswith("DRUMS_VERL_RESULT")]) == 1
    if not group:
        print("verl v1 group not sampled today: DRUMS_TRAINER_MATRIX=1 runs it")
        return
    (v1,) = [line for line in lines if line.startswith("DRUMS_VERL_V1_RESULT")]
    assert '"prompt_status": ["finished"]' in v1 and '"advantages": [0.0, 0.0, 0.0]' in v1
    assert '"rewards": [1.0, 1.0, 1.0]' in v1  # solved: the failed 0.0 in the group would show
    (leaks,) = [line for line in lines if line.startswith("DRUMS_VERL_LEAKS")]
    assert '"cancelled envs left": 0' in leaks and '"timeout envs left": 0' in leaks


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration
