"""drums_tasks.validate against a real drumsd (Linux runtime, `office` image), over a sample of
the task factory's families. CI runs one task of each of CI_FAMILIES_PER_APP families of a third
of the apps (2-3 tasks, ~40 s here; the apps take turns and the families rotate by the day, every
app every third day, DRUMS_VALIDATOR_ROTATION=K picks rotation K, and the test prints which ran).
The opt-in tier covers every family: DRUMS_VALIDATOR_PER_FAMILY=N runs N tasks of each of the 55
families (N=1 took about 10 minutes here; N=2 is the sample of the last full runs, 110 tasks).

Each sampled task goes through the whole validator: create on the task, gates, fork into no-op,
oracle, every near miss and the scope probe, act in each child (the branches at once), verify
each. Every sampled task must be accepted, or its rejection must name why after every branch ran
(a daemon failure is never an explanation), and the acceptance rate must stay at or above
MIN_ACCEPTANCE. Two tasks are in flight at once: about 10 s of wall time per task on a 2-core
host, plus a one-off template checkpoint of the image.

The report (one JSON line per task, and its summary) is kept under out/validate/ for the record.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_daemon import Daemon, require_live
from validator_fixture import REPO, open_validator_host, run_validation

# CI samples a few families of every app to keep .ci/run within its time budget; the opt-in tier
# (DRUMS_VALIDATOR_PER_FAMILY set) runs every family.
FULL = "DRUMS_VALIDATOR_PER_FAMILY" in os.environ
PER_FAMILY = int(os.environ.get("DRUMS_VALIDATOR_PER_FAMILY", "1"))
CI_FAMILIES_PER_APP = 1  # 2 took 3 min of a CI run over its budget; the rotation covers the rest
# Each app every third day (a third of the apps a day): half the apps a day took 62 s of a CI run
# that was 4 min over its budget.
CI_APP_DAYS = 3
ROTATION = int(os.environ.get("DRUMS_VALIDATOR_ROTATION", str(int(time.time() // 86400))))


def sampled_families() -> list[str] | None:
    """None (every family) in the opt-in tier; else CI_FAMILIES_PER_APP of a third of the apps, the
    apps and their families rotating by the day."""
    if FULL:
        return None
    from drums_tasks.families import FAMILIES, load_all

    load_all()
    by_app: dict[str, list[str]] = {}
    for name in sorted(FAMILIES):
        by_app.setdefault(FAMILIES[name].app, []).append(name)
    picked: list[str] = []
    for i, names in enumerate(by_app.values()):
        if i % CI_APP_DAYS != ROTATION % CI_APP_DAYS:
            continue  # this app's day is another one
        start = (ROTATION // CI_APP_DAYS) * CI_FAMILIES_PER_APP
        picked += [names[(start + j) % len(names)] for j in range(CI_FAMILIES_PER_APP)]
    return sorted(picked)


SAMPLE = sampled_families()
JOBS = 2
# Below this, a change broke tasks (or the daemon) rather than one script meeting a slow app.
MIN_ACCEPTANCE = 0.9


@pytest.fixture(scope="module")
def validator_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    require_live("office")
    tmp = tmp_path_factory.mktemp("validator")
    with open_validator_host(tmp, "validator", SAMPLE, PER_FAMILY) as host:
        yield host


def test_validator_over_a_sample_of_every_family(validator_host: tuple[Daemon, Path]) -> None:
    from drums_tasks.families import FAMILIES, load_all

    load_all()
    daemon, installed = validator_host
    record = REPO / "out" / "validate" / time.strftime("%Y%m%dT%H%M%S")
    record.mkdir(parents=True, exist_ok=True)
    report = record / "report.jsonl"
    print(f"\nvalidator sample (rotation {ROTATION}): {SAMPLE or 'every family'}")
    summary = run_validation(
        daemon.url, daemon.token, installed, report, PER_FAMILY, SAMPLE, jobs=JOBS
    )
    verdicts: list[dict[str, Any]] = [json.loads(line) for line in report.read_text().splitlines()]
    print(f"\nvalidator report: {report}")
    print(json.dumps({k: v for k, v in summary.items() if k != "per_family"}, indent=1))

    tasks = {json.loads(line)["id"]: json.loads(line) for line in open(installed / "tasks.jsonl")}
    per_family = Counter(v["family"] for v in verdicts)
    assert per_family == dict.fromkeys(SAMPLE or FAMILIES, PER_FAMILY), per_family
    apps = {tasks[v["id"]]["snapshot"] for v in verdicts}
    # The apps of the families that ran (every app in the opt-in tier; half of them in CI's).
    assert apps == {FAMILIES[name].app for name in (SAMPLE or FAMILIES)}
    for v in sorted(verdicts, key=lambda v: v["family"]):
        branches = {b["name"]: b for b in v["branches"]}
        line = f"{v['family']} {v['id']} {v['seconds']:.1f}s"
        # Every branch ran: no-op, oracle, at least one near miss, the scope probe.
        assert {"noop", "oracle", "scope_probe"} <= set(branches), f"{line}: {v['reasons']}"
        assert any(name.startswith("near:") for name in branches), line
        assert any(name.startswith("exploit:") for name in branches), line
        if v["accepted"]:
            assert v["reasons"] == []
            assert branches["oracle"]["score"] == 1.0 and branches["noop"]["score"] == 0.0
            assert "scope_violation" in branches["scope_probe"]["flags"]
        else:
            print(f"{line} REJECTED: {v['reasons']}")
            assert v["reasons"] and all(r.strip() for r in v["reasons"]), line
    assert summary["tasks"] == len(verdicts) == PER_FAMILY * len(SAMPLE or FAMILIES)
    assert summary["accepted"] == sum(v["accepted"] for v in verdicts)
    # A family the exploit suite hacks (its answer is in the task's JSON: docs/reward-audit.md)
    # is rightly rejected; the rate bounds every other reason a task fails.
    hackable = [
        v["family"]
        for v in verdicts
        if v["reasons"] and all("(hackable)" in r for r in v["reasons"])
    ]
    print(f"rejected as hackable by the exploit suite: {hackable}")
    judged = len(verdicts) - len(hackable)
    assert summary["accepted"] >= MIN_ACCEPTANCE * judged, summary["rejections_by_reason"]
