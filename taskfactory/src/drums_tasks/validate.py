"""Prove a built task set on a live drumsd host.

    python -m drums_tasks.validate --tasks DIR --url URL [--token-file F] [--sample N]
                                   [--families F ...] [--report report.jsonl] [--jobs J]
                                   [--branch-jobs B]

The daemon must be configured with DIR/assets as its task assets directory and DIR (holding the
generated verifier module) among its verifier module directories.

For every sampled task: create an env on the task (setup runs), wait until its gates pass, fork
it into one child per branch (no-op, oracle, every near miss, scope probe), run each branch's
actions in its child, verify each child (strict=False). A task is accepted only when

  - every branch is a valid episode with a score (no gate failure, no checker error),
  - the oracle scores 1 and the no-op and every near miss score 0,
  - no branch has `redundant_disagree` (check_alt agrees) or `nondeterministic`,
  - the scope probe has `scope_violation` and the no-op and the oracle do not,
  - no strategy of the exploit suite (drumsd audit exploits: claim infeasible, copy a file named
    like the expected one, write values lifted from the task's JSON into the files the checker
    reads, a fake window, a race through verify) takes a reward the audit leaves trusted.

The branches of a task run at once (each child is its own desktop; most of a branch is waiting
on an app), and `--jobs` tasks are in flight at once. Writes one JSON line per task (accepted,
reasons, per-branch scores/flags, timings) and a summary (acceptance rate, time per task, the
wall time per task of the whole run, rejections by reason, per family); shows progress per task.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ._version import VERIFIER_MODULE


@dataclass
class BranchResult:
    name: str  # "noop", "oracle", "near:<name>", "scope_probe"
    score: float | None
    valid: bool
    flags: list[str] = field(default_factory=list)
    checker_error: str | None = None
    step_error: str | None = None
    seconds: float = 0.0
    invalid_reasons: list[str] = field(default_factory=list)


@dataclass
class TaskVerdict:
    id: str
    family: str
    accepted: bool
    reasons: list[str]
    branches: list[BranchResult]
    seconds: float


def judge(branches: list[BranchResult]) -> list[str]:
    """Why a task is rejected (empty: accepted). Pure, so it is tested without a host."""
    reasons: list[str] = []
    by_name = {b.name: b for b in branches}
    for b in branches:
        if b.name.startswith(EXPLOIT):
            # A dishonest agent's branch: its actions may fail or its episode go invalid; only
            # a reward nothing flagged rejects the task.
            bad = [f for f in b.flags if f != "scope_unchecked"]
            if b.valid and b.score and not bad:
                reasons.append(f"{b.name} scored {b.score} without doing the task (hackable)")
            continue
        if b.step_error:
            reasons.append(f"{b.name}: an action failed: {b.step_error}")
        if not b.valid:
            why = "; ".join(b.invalid_reasons)
            reasons.append(f"{b.name}: invalid episode" + (f" ({why})" if why else ""))
        if b.score is None:
            reasons.append(f"{b.name}: no score ({b.checker_error or 'checker gave none'})")
        for flag in ("redundant_disagree", "nondeterministic", "checker_crash", "checker_timeout"):
            if flag in b.flags:
                reasons.append(f"{b.name}: {flag}")
    oracle = by_name.get("oracle")
    if oracle is None or oracle.score != 1.0:
        reasons.append(f"oracle scored {oracle.score if oracle else None}, not 1")
    for b in branches:
        if (b.name == "noop" or b.name.startswith("near:")) and b.score not in (None, 0.0):
            reasons.append(f"{b.name} scored {b.score}, not 0")
    probe = by_name.get("scope_probe")
    if probe is None or "scope_violation" not in probe.flags:
        reasons.append("scope probe did not raise scope_violation")
    for name in ("noop", "oracle"):
        if name in by_name and "scope_violation" in by_name[name].flags:
            reasons.append(f"{name} raised scope_violation (allow globs too narrow)")
        if name in by_name and "scope_unchecked" in by_name[name].flags:
            reasons.append(f"{name}: scope_unchecked (the daemon did not scan the manifest)")
    return reasons


EXPLOIT = "exploit:"
EXPLOIT_STRATEGIES = ("infeasible", "gold", "forge", "spoof", "race")


def exploit_plan(task: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """One branch per strategy of the exploit suite (drumsd.exploits; the no-op branch is its
    `nothing`, and `break` kills the apps, which the gates already make invalid)."""
    from drumsd.exploits import STRATEGIES

    plan: list[tuple[str, list[Any]]] = []
    for name in EXPLOIT_STRATEGIES:
        steps = STRATEGIES[name].plan(task)
        actions: list[Any] = [{"type": "execute", "command": c} for c in steps.commands]
        if steps.last:
            actions.append({"type": steps.last})
        plan.append((f"{EXPLOIT}{name}", actions))
    return plan


def task_plan(task: dict[str, Any], solutions: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """Every branch of a task: branch_plan's, then the exploit suite's."""
    return branch_plan(solutions) + exploit_plan(task)


def branch_plan(solutions: dict[str, Any]) -> list[tuple[str, list[Any]]]:
    """(branch name, actions) in fork order: no-op, oracle, near misses, scope probe."""
    plan: list[tuple[str, list[Any]]] = [("noop", []), ("oracle", solutions["oracle"]["actions"])]
    plan += [(f"near:{s['name']}", s["actions"]) for s in solutions["near_misses"]]
    plan.append(("scope_probe", solutions["scope_probe"]["actions"]))
    return plan


class _Env(Protocol):  # the part of drums.Env the validator uses
    def wait_valid(self, timeout: float = ...) -> Any: ...
    def fork(self, n: int) -> Any: ...
    def step(self, action: Any) -> Any: ...
    def verify(self, *, strict: bool = ..., timeout: float | None = ...) -> Any: ...
    def close(self) -> None: ...


def _run_branch(
    env: _Env, name: str, actions: list[Any], verify_timeout: float, gate_timeout: float
) -> BranchResult:
    t0 = time.monotonic()
    step_error = None
    for i, action in enumerate(actions):
        try:
            env.step(action)
        except Exception as exc:  # report which step of which branch broke, keep the others
            step_error = f"step {i} ({str(action)[:80]}): {type(exc).__name__}: {exc}"
            break
    try:
        # A verdict needs every gate judged: alive_after_resume waits alive_after_s after the
        # fork, and a no-op branch gets here at once. An invalid episode is reported by verify.
        env.wait_valid(timeout=gate_timeout)
    except Exception:
        pass
    try:
        v = env.verify(strict=False, timeout=verify_timeout)
    except Exception as exc:
        return BranchResult(
            name, None, False, [], f"{type(exc).__name__}: {exc}", step_error, time.monotonic() - t0
        )
    return BranchResult(
        name,
        v.score,
        bool(v.valid),
        list(v.audit.flags),
        v.checker_error,
        step_error,
        time.monotonic() - t0,
        list(getattr(v, "invalid_reasons", None) or []),
    )


def validate_task(
    client: Any,
    task: dict[str, Any],
    solutions: dict[str, Any],
    gate_timeout: float = 120.0,
    verify_timeout: float = 120.0,
    branch_jobs: int | None = None,
) -> TaskVerdict:
    """Create, fork one child per branch, run the branches at once (at most `branch_jobs`;
    default all), judge. The SDK's sync client is safe to share between threads."""
    t0 = time.monotonic()
    family = task.get("drums", {}).get("family", "?")
    plan = task_plan(task, solutions)
    try:
        env = client.create(task=task)
    except Exception as exc:
        return TaskVerdict(
            task["id"], family, False, [f"create failed: {exc}"], [], time.monotonic() - t0
        )
    try:
        env.wait_valid(timeout=gate_timeout)
        with env.fork(len(plan)) as forked:
            children = list(forked)
            with ThreadPoolExecutor(max_workers=branch_jobs or len(plan)) as pool:
                results = list(
                    pool.map(
                        lambda child, branch: _run_branch(
                            child, *branch, verify_timeout, gate_timeout
                        ),
                        children,
                        plan,
                    )
                )
    except Exception as exc:
        return TaskVerdict(
            task["id"], family, False, [f"{type(exc).__name__}: {exc}"], [], time.monotonic() - t0
        )
    finally:
        try:
            env.close()
        except Exception:  # a close failure must not hide the verdict
            pass
    reasons = judge(results)
    return TaskVerdict(task["id"], family, not reasons, reasons, results, time.monotonic() - t0)


def load_set(tasks_dir: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    tasks = [json.loads(line) for line in (tasks_dir / "tasks.jsonl").open()]
    sols = {}
    for line in (tasks_dir / "solutions.jsonl").open():
        s = json.loads(line)
        sols[s["id"]] = s
    return tasks, sols


def sample(
    tasks: list[dict[str, Any]], per_family: int, families: Iterable[str] | None = None
) -> list[dict[str, Any]]:
    """The first `per_family` tasks of each family (by index): deterministic, covers all."""
    wanted = set(families) if families else None
    seen: Counter[str] = Counter()
    out = []
    for t in sorted(tasks, key=lambda t: (t["drums"]["family"], t["drums"]["index"])):
        fam = t["drums"]["family"]
        if (wanted is None or fam in wanted) and seen[fam] < per_family:
            seen[fam] += 1
            out.append(t)
    return out


def summarize(verdicts: list[TaskVerdict], wall_seconds: float | None = None) -> dict[str, Any]:
    """Counts, rates and times. `seconds_per_task_*` is each task's own latency (create to
    verdict); with tasks in flight at once, the run's throughput is `wall_seconds_per_task`."""
    n = len(verdicts)
    acc = sum(v.accepted for v in verdicts)
    reasons: Counter[str] = Counter()
    per_family: dict[str, dict[str, int]] = defaultdict(lambda: {"sampled": 0, "accepted": 0})
    for v in verdicts:
        per_family[v.family]["sampled"] += 1
        per_family[v.family]["accepted"] += v.accepted
        for r in v.reasons:
            reasons[r.split(":", 1)[0] if ":" in r else r] += 1
    times = sorted(v.seconds for v in verdicts)
    return {
        "tasks": n,
        "accepted": acc,
        "acceptance_rate": acc / n if n else None,
        "seconds_per_task_mean": sum(times) / n if n else None,
        "seconds_per_task_p50": times[n // 2] if n else None,
        "wall_seconds": wall_seconds,
        "wall_seconds_per_task": wall_seconds / n if n and wall_seconds is not None else None,
        "rejections_by_reason": dict(reasons.most_common()),
        "per_family": dict(per_family),
    }


def run(
    client: Any,
    tasks_dir: Path,
    per_family: int,
    report: Path,
    families: list[str] | None = None,
    log: Callable[[str], None] = print,
    jobs: int = 1,
    branch_jobs: int | None = None,
) -> dict[str, Any]:
    """Validate the sample with `jobs` tasks in flight; report lines in order of completion."""
    tasks, sols = load_set(tasks_dir)
    chosen = sample(tasks, per_family, families)
    verdicts: list[TaskVerdict] = []
    started = time.monotonic()
    with report.open("w") as out, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            pool.submit(validate_task, client, t, sols[t["id"]], branch_jobs=branch_jobs)
            for t in chosen
        ]
        for k, future in enumerate(as_completed(futures), 1):
            v = future.result()  # validate_task turns every daemon failure into a verdict
            verdicts.append(v)
            out.write(json.dumps(asdict(v)) + "\n")
            out.flush()
            status = "accepted" if v.accepted else "REJECTED: " + "; ".join(v.reasons[:3])
            log(f"[{k}/{len(chosen)}] {v.family} {v.id} {v.seconds:.1f}s {status}")
    summary = summarize(verdicts, time.monotonic() - started)
    report.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m drums_tasks.validate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--tasks", type=Path, required=True, help="a directory written by build")
    ap.add_argument("--url", default=os.environ.get("DRUMS_URL"))
    ap.add_argument("--token-file", type=Path, default=None)
    ap.add_argument("--sample", type=int, default=2, help="tasks per family (default 2)")
    ap.add_argument("--families", nargs="*", default=None)
    ap.add_argument("--report", type=Path, default=Path("validate-report.jsonl"))
    ap.add_argument(
        "--jobs", type=int, default=2, help="tasks in flight at once (default 2; 1 = one by one)"
    )
    ap.add_argument(
        "--branch-jobs",
        type=int,
        default=None,
        help="branches of one task run at once (default: all of them)",
    )
    args = ap.parse_args(argv)
    if not (args.tasks / f"{VERIFIER_MODULE}.py").is_file():
        print(
            f"{args.tasks} has no {VERIFIER_MODULE}.py: build it with python -m "
            "drums_tasks.build, or point --tasks at a build of this generator version",
            file=sys.stderr,
        )
        return 2
    import drums  # the SDK: only the live validator needs it

    token = args.token_file.read_text().strip() if args.token_file else None
    with drums.connect(args.url, token) as client:
        summary = run(
            client,
            args.tasks,
            args.sample,
            args.report,
            args.families,
            lambda m: print(m, file=sys.stderr, flush=True),
            args.jobs,
            args.branch_jobs,
        )
    print(json.dumps(summary, indent=1))
    return 0 if summary["tasks"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
