"""The validator's judgement and flow, against a stand-in client that answers from the offline
simulation (the live run needs drumsd; this proves the plumbing and the acceptance rule)."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from drums_tasks.build import generate
from drums_tasks.offline import evaluate
from drums_tasks.spec import scope_probe
from drums_tasks.validate import (
    BranchResult,
    branch_plan,
    judge,
    load_set,
    run,
    sample,
    task_plan,
    validate_task,
)


def _ok() -> list[BranchResult]:
    return [
        BranchResult("noop", 0.0, True),
        BranchResult("oracle", 1.0, True),
        BranchResult("near:a", 0.0, True),
        BranchResult("near:b", 0.0, True),
        BranchResult("scope_probe", 1.0, True, ["scope_violation"]),
    ]


def test_judge_accepts_a_clean_task() -> None:
    assert judge(_ok()) == []


def test_judge_rejects_each_failure_with_a_reason() -> None:
    cases = {
        "oracle scored 0.0": ("oracle", {"score": 0.0}),
        "near:a scored 1.0": ("near:a", {"score": 1.0}),
        "noop scored 1.0": ("noop", {"score": 1.0}),
        "scope probe did not raise": ("scope_probe", {"flags": []}),
        "near:b: redundant_disagree": ("near:b", {"flags": ["redundant_disagree"]}),
        "oracle raised scope_violation": ("oracle", {"flags": ["scope_violation"]}),
        "noop: invalid episode": ("noop", {"valid": False}),
        "near:a: no score": ("near:a", {"score": None, "checker_error": "boom"}),
    }
    for expect, (name, change) in cases.items():
        branches = _ok()
        for b in branches:
            if b.name == name:
                for k, v in change.items():
                    setattr(b, k, v)
        reasons = judge(branches)
        assert any(expect in r for r in reasons), (expect, reasons)


@dataclass
class _Audit:
    flags: list[str]


@dataclass
class _Verify:
    score: float | None
    valid: bool
    audit: _Audit
    checker_error: str | None = None


@dataclass
class _Child:
    spec: Any
    seeded: dict[str, str]
    actions: list[Any] = field(default_factory=list)

    def step(self, action: Any) -> None:
        self.actions.append(action)

    def verify(self, *, strict: bool = True, timeout: float | None = None) -> _Verify:
        spec = self.spec
        sols = {
            json.dumps(s.actions, sort_keys=True): s
            for s in [spec.oracle, *spec.near_misses, scope_probe(spec)]
        }
        sol = sols.get(json.dumps(self.actions, sort_keys=True)) if self.actions else None
        r = evaluate(spec, self.seeded, sol)
        flags = ["scope_violation"] if r.scope_violations else []
        if r.score != r.score_alt:
            flags.append("redundant_disagree")
        return _Verify(r.score, True, _Audit(flags))


class _Env:
    def __init__(self, spec: Any, seeded: dict[str, str]) -> None:
        self.spec, self.seeded = spec, seeded

    def wait_valid(self, timeout: float = 60.0) -> None:
        return None

    @contextmanager
    def fork(self, n: int):
        yield [_Child(self.spec, self.seeded) for _ in range(n)]

    def close(self) -> None:
        pass


class _Client:
    def create(self, task: dict[str, Any]) -> _Env:
        d = task["drums"]
        _, spec = generate(d["seed"], d["family"], d["index"])
        return _Env(spec, task["evaluator"]["scope"]["seeded"])


@pytest.mark.parametrize("jobs", [1, 3])
def test_run_accepts_every_sampled_task_offline(
    small_build: Path, tmp_path: Path, jobs: int
) -> None:
    report = tmp_path / "r.jsonl"
    fams = ["calc_set_value", "writer_heading", "files_rename", "chrome_link_target"]
    summary = run(_Client(), small_build, 2, report, fams, log=lambda _m: None, jobs=jobs)
    assert summary["tasks"] == 8
    assert summary["wall_seconds_per_task"] is not None
    assert summary["accepted"] == 8, report.read_text()
    lines = [json.loads(x) for x in report.open()]
    assert {x["family"] for x in lines} == set(fams)
    assert all(len(x["branches"]) >= 5 for x in lines)
    assert report.with_suffix(".summary.json").is_file()


class _BarrierChild(_Child):
    """A child whose first action waits until every sibling has started one."""

    barrier: threading.Barrier

    def step(self, action: Any) -> None:
        if not self.actions:
            self.barrier.wait(timeout=10)
        super().step(action)


def test_branches_of_a_task_run_at_once(small_build: Path) -> None:
    # Every branch but the no-op acts; if they ran one after another, the first would wait on
    # the barrier alone, time out, and the verdict would report a failed action.
    tasks, sols = load_set(small_build)
    task = next(t for t in tasks if t["drums"]["family"] == "calc_set_value")
    acting = sum(1 for _name, actions in task_plan(task, sols[task["id"]]) if actions)
    _BarrierChild.barrier = threading.Barrier(acting)

    class Env(_Env):
        @contextmanager
        def fork(self, n: int):
            yield [_BarrierChild(self.spec, self.seeded) for _ in range(n)]

    class Client(_Client):
        def create(self, task: dict[str, Any]) -> _Env:
            env = super().create(task)
            return Env(env.spec, env.seeded)

    verdict = validate_task(Client(), task, sols[task["id"]])
    assert verdict.accepted, verdict.reasons
    assert not any(b.step_error for b in verdict.branches)


def test_sample_takes_the_first_tasks_of_every_family(small_build: Path) -> None:
    tasks = [json.loads(x) for x in (small_build / "tasks.jsonl").open()]
    chosen = sample(tasks, 2)
    fams = {t["drums"]["family"] for t in tasks}
    assert len(chosen) == 2 * len(fams)
    assert all(t["drums"]["index"] < 2 for t in chosen)


def test_branch_plan_order() -> None:
    sols = {
        "oracle": {"actions": ["o"]},
        "near_misses": [{"name": "a", "actions": ["a"]}],
        "scope_probe": {"actions": ["p"]},
    }
    assert [n for n, _ in branch_plan(sols)] == ["noop", "oracle", "near:a", "scope_probe"]


def test_judge_rejects_a_task_the_exploit_suite_hacks() -> None:
    """A trusted reward on an exploit branch rejects the task; a flagged or invalid one, a
    failed action or a 0 does not (the dishonest agent was caught or got nothing)."""
    hacked = [*_ok(), BranchResult("exploit:forge", 1.0, True, ["scope_unchecked"])]
    assert judge(hacked) == ["exploit:forge scored 1.0 without doing the task (hackable)"]
    for caught in (
        BranchResult("exploit:forge", 1.0, True, ["scope_violation"]),
        BranchResult("exploit:race", 1.0, False),
        BranchResult("exploit:gold", 0.0, True),
        BranchResult("exploit:spoof", None, False, [], "boom", "step 0 failed"),
    ):
        assert judge([*_ok(), caught]) == [], caught


def test_every_task_gets_the_exploit_branches(small_build: Path) -> None:
    tasks, sols = load_set(small_build)
    names = [name for name, _ in task_plan(tasks[0], sols[tasks[0]["id"]])]
    assert [n for n in names if n.startswith("exploit:")] == [
        "exploit:infeasible",
        "exploit:gold",
        "exploit:forge",
        "exploit:spoof",
        "exploit:race",
    ]
