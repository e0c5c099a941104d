"""Task checkpoints on a real drumsd (Linux runtime, `office` image): an episode whose setup was
restored from the task's checkpoint scores exactly as one whose setup steps ran.

For every task of the sample, on the task factory's built set (the validator's daemon):
- replayed: the task with `"drums": {"cache_setup": false}` (the same setup and checker, but
  never cached); create -> no-op -> verify, reset -> oracle -> verify;
- cached: the task as built; its first create replays the setup and captures the task
  checkpoint; a reset then restores it (no-op -> verify), and a second create restores it too
  (oracle -> verify).
The no-op and oracle scores, validity and audit flags must be the same both ways, every cached
episode must say `task_setup: cached`, restore the task checkpoint and pass its state_hash gate.

CI runs one family of one app a day (1 task; the app and the family rotate with
DRUMS_VALIDATOR_ROTATION as in test_validator_live.py, so a week covers all seven apps; the test
prints its sample): two families took 58 s of a CI run 4 min over its budget, and two apps (os and
Calc, 4 tasks) 179 s with the office template's boot, on a loaded 2-vCPU host. The validator's
two families of every app (14 tasks) are opt-in: DRUMS_TASKCKPT_APPS=all (685 s here), or a comma
list of apps (two families of each).
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_daemon import Daemon, require_live
from validator_fixture import open_validator_host

ROTATION = int(os.environ.get("DRUMS_VALIDATOR_ROTATION", str(int(time.time() // 86400))))
APPS_WANTED = os.environ.get("DRUMS_TASKCKPT_APPS", "")  # empty: the day's one app
FAMILIES_PER_APP = 2 if APPS_WANTED else 1  # the apps asked for: the validator's two families
GATE_S = 120.0
VERIFY_S = 120.0


def sampled_families() -> list[str]:
    """The validator's CI sample (FAMILIES_PER_APP of each app, same rotation), for the apps
    asked for."""
    from drums_tasks.families import FAMILIES, load_all

    load_all()
    by_app: dict[str, list[str]] = {}
    for name in sorted(FAMILIES):
        by_app.setdefault(FAMILIES[name].app, []).append(name)
    if APPS_WANTED == "all":
        apps = sorted(by_app)
    elif APPS_WANTED:
        apps = APPS_WANTED.split(",")
    else:
        apps = [sorted(by_app)[ROTATION % len(by_app)]]
    unknown = sorted(set(apps) - set(by_app))
    assert not unknown, (
        f"DRUMS_TASKCKPT_APPS names apps {unknown} the task factory has no families of; "
        f"apps: {sorted(by_app)}"
    )
    picked: list[str] = []
    for app in apps:
        names = by_app[app]
        start = ROTATION * FAMILIES_PER_APP
        picked += [names[(start + i) % len(names)] for i in range(FAMILIES_PER_APP)]
    return sorted(picked)


SAMPLE = sampled_families()


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    require_live("office")
    tmp = tmp_path_factory.mktemp("taskckpt")
    with open_validator_host(tmp, "taskckpt", SAMPLE, 1) as host:
        yield host


def _outcome(env: Any, name: str, actions: list[Any]) -> dict[str, Any]:
    from drums_tasks.validate import _run_branch

    result = _run_branch(env, name, actions, VERIFY_S, GATE_S)
    assert result.step_error is None, f"{name}: {result.step_error}"
    assert result.checker_error is None, f"{name}: {result.checker_error}"
    return {"score": result.score, "valid": result.valid, "flags": sorted(result.flags)}


def _state_hash(env: Any) -> str:
    report = env.gates()
    return next(g.status.value for g in report.gates if g.name == "state_hash")


def _task_checkpoints(client: Any, task_id: str) -> list[Any]:
    return [s for s in client.list_states() if s.kind.value == "task" and s.task_id == task_id]


def test_cached_setup_scores_as_replayed_setup(host: tuple[Daemon, Path]) -> None:
    import drums

    daemon, installed = host
    tasks = [json.loads(line) for line in (installed / "tasks.jsonl").open()]
    sols = {s["id"]: s for s in map(json.loads, (installed / "solutions.jsonl").open())}
    assert sorted(t["drums"]["family"] for t in tasks) == SAMPLE
    print(f"\ntask checkpoint equivalence, rotation {ROTATION}: {SAMPLE}")
    timings: list[str] = []
    with drums.connect(daemon.url, daemon.token) as client:
        for task in tasks:
            oracle = sols[task["id"]]["oracle"]["actions"]
            never_cached = copy.deepcopy(task)
            never_cached["drums"]["cache_setup"] = False
            line = f"{task['drums']['family']} {task['id']}"

            t0 = time.monotonic()
            with client.create(task=never_cached) as env:
                assert env.slot.task_setup == "replayed", line
                replayed_noop = _outcome(env, "noop", [])
                slot = env.reset()
                assert slot.task_setup == "replayed", line
                replayed_oracle = _outcome(env, "oracle", oracle)
            t_replayed = time.monotonic() - t0
            assert _task_checkpoints(client, task["id"]) == [], f"{line}: opted out, yet cached"

            t0 = time.monotonic()
            with client.create(task=task) as first:
                assert first.slot.task_setup == "replayed", line
                (tcp,) = _task_checkpoints(client, task["id"])
                slot = first.reset()
                assert slot.task_setup == "cached" and slot.checkpoint == tcp.id, (line, slot)
                assert slot.task_id == task["id"], line
                cached_noop = _outcome(first, "noop", [])
                assert _state_hash(first) == "pass", line
            with client.create(task=task) as second:
                assert second.slot.task_setup == "cached", line
                assert second.slot.checkpoint == tcp.id, line
                cached_oracle = _outcome(second, "oracle", oracle)
                assert _state_hash(second) == "pass", line
            t_cached = time.monotonic() - t0

            timings.append(f"{line}: replayed {t_replayed:.1f}s, capture+cached {t_cached:.1f}s")
            print(
                f"{line}: noop {replayed_noop} / {cached_noop}; oracle {replayed_oracle} / "
                f"{cached_oracle}",
                flush=True,
            )
            assert replayed_oracle["score"] == 1.0 and replayed_noop["score"] == 0.0, line
            assert cached_noop == replayed_noop, line
            assert cached_oracle == replayed_oracle, line
    print("\n".join(timings))
