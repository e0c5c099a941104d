"""OSWorld's evaluator semantics, written for drums.

Order, as in OSWorld's DesktopEnv.evaluate: postconfig steps; then an infeasible task scores 1 on
a final FAIL action and 0 otherwise, and any other task scores 0 after a final FAIL; then the
result/expected getters and the metric functions, combined by `conj`: with "and" the first 0 is the
answer, else the mean; with "or" the first 1 is the answer, else the max. A result file that does
not exist scores that metric 0 (with "and" the whole task). Metric functions run in the checker
venv (checker.py); getters are ours (getters.py). Inputs are read from the slot once, so the audit
can run the same checker calls again without touching the slot.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from drumsd.core.seams import RuntimeError_

from .checker import (
    CheckerCall,
    CheckerEnv,
    CheckerOutcome,
    metric_call,
    run_checker,
    verifier_call,
)
from .getters import GetterEnv, GetterError, GetterUnsupported, ResultMissing, get_value
from .host_support import find_verifier_module
from .model import Evaluator, Task, TaskContext
from .setup import SetupError, SetupReport, SlotAccess, run_postconfig

log = logging.getLogger("drumsd.tasks.evaluate")

RunChecker = Callable[[CheckerCall], Awaitable[CheckerOutcome]]


@dataclass(frozen=True)
class MetricSpec:
    func: str
    result: dict[str, Any] | None
    expected: dict[str, Any] | None
    options: dict[str, Any]


def _at(value: Any, index: int, many: bool) -> Any:
    if not many:
        return value
    if isinstance(value, list):
        return value[index] if index < len(value) else None
    return None


def metric_specs(ev: Evaluator) -> list[MetricSpec]:
    """One spec per metric function, with its own result, expected and options (pure)."""
    many = isinstance(ev.func, list)
    specs = []
    for i, func in enumerate(ev.funcs):
        options = _at(ev.options, i, many) or {}
        specs.append(
            MetricSpec(
                func=func,
                result=_at(ev.result, i, many) or None,
                expected=_at(ev.expected, i, many) or None,
                options=dict(options),
            )
        )
    return specs


def combine(scores: list[float], conj: str) -> float:
    """OSWorld's combination over metrics that all ran (pure)."""
    if conj == "and":
        return 0.0 if any(s == 0.0 for s in scores) else sum(scores) / len(scores)
    return 1.0 if any(s == 1.0 for s in scores) else max(scores)


@dataclass
class PreparedMetric:
    func: str
    call: CheckerCall | None  # None when the result file was missing
    missing: str | None = None


@dataclass
class MetricScore:
    func: str
    score: float | None
    missing: str | None = None
    error_class: str | None = None
    error: str | None = None
    duration_s: float = 0.0


@dataclass
class Scoring:
    score: float | None
    metrics: list[MetricScore] = field(default_factory=list)
    error_class: str | None = None
    error: str | None = None

    @property
    def checker_s(self) -> float:
        return round(sum(m.duration_s for m in self.metrics), 3)


# Getters that read the slot only through `SlotAccess.read_file`, at the paths their config names:
# their files are read once while the slot is frozen, before any getter runs (issue 36).
FILE_GETTERS = frozenset({"vm_file", "content_from_vm_file"})

# What runs inside the frozen window after the reads (the audit's scope scan).
WhileFrozen = Callable[[], Awaitable[None]]


def frozen_paths(task: Task, ctx: TaskContext) -> list[str]:
    """The slot paths the task's file getters (and its redundant evaluator's) will read, as
    the getters ask for them (`~` expanded): read together while the slot is frozen (pure)."""
    configs: list[Any] = []
    for ev in (task.evaluator.model_dump(), task.evaluator.redundant or {}):
        for part in (ev.get("result"), ev.get("expected")):
            configs += part if isinstance(part, list) else [part]
    paths: list[str] = []
    for config in configs:
        if isinstance(config, dict) and config.get("type") in FILE_GETTERS:
            found = config.get("path")
            for path in found if isinstance(found, list) else [found]:
                if isinstance(path, str):
                    paths.append(ctx.user_home + path[1:] if path.startswith("~") else path)
    return list(dict.fromkeys(paths))


class FrozenReads:
    """A SlotAccess whose `read_file` answers the paths read while the slot was frozen from
    those reads (the same bytes, or the same error), and passes anything else to the slot."""

    def __init__(self, access: SlotAccess, files: dict[str, bytes | Exception | None]) -> None:
        self.access = access
        self.files = files

    def __getattr__(self, name: str) -> Any:
        return getattr(self.access, name)

    async def read_file(self, path: str) -> bytes:
        if path not in self.files:
            return await self.access.read_file(path)
        got = self.files[path]
        if got is None:
            raise FileNotFoundError(path)
        if isinstance(got, Exception):
            raise got
        return got


async def read_frozen(
    task: Task, access: SlotAccess, ctx: TaskContext, while_frozen: WhileFrozen | None
) -> tuple[bool | None, FrozenReads]:
    """Freeze the slot (its cgroup: no process of it runs), read every file a getter will
    read, run `while_frozen` (the scope scan), thaw. An agent process racing verify can then
    neither change a result file between two getters' reads nor undo an out-of-scope write
    between the getters' read and the scan (issue 36, `race`). Getters that ask live apps
    (DevTools, AT-SPI, a command) run after the thaw: they need the desktop running.

    Returns (True: frozen, False: the freeze failed, None: the slot cannot be frozen), and
    the access to read through."""
    files: dict[str, bytes | Exception | None] = {}

    async def read_all() -> None:
        for path in frozen_paths(task, ctx):
            try:
                files[path] = await access.read_file(path)
            except FileNotFoundError:
                files[path] = None
            except (OSError, RuntimeError, RuntimeError_, trio.TooSlowError) as exc:
                files[path] = exc  # raised again to the getter that reads it
        if while_frozen is not None:
            await while_frozen()

    frozen_state = getattr(access, "frozen", None)
    if frozen_state is None:
        await read_all()
        return None, FrozenReads(access, files)
    async with frozen_state() as frozen:
        await read_all()
    return frozen, FrozenReads(access, files)


@dataclass
class Evaluation:
    score: float | None
    error_class: str | None = None  # crash|timeout|unsupported|bad_request|getter|postconfig
    error: str | None = None
    reason: str | None = None  # how the score came about when no checker ran
    scoring: Scoring | None = None
    prepared: list[PreparedMetric] = field(default_factory=list)
    conj: str = "and"
    postconfig: SetupReport | None = None
    getters_s: float = 0.0
    postconfig_s: float = 0.0
    frozen: bool | None = None  # the slot was frozen while its files were read (read_frozen)
    reads: SlotAccess | None = None  # what the getters read through (the frozen reads)


async def read_getter(config: dict[str, Any] | None, env: GetterEnv) -> Any:
    """`get_value`, with any failure to read the slot named by its getter and where it reads
    (a failing getter makes the episode invalid: its cause must say which one failed)."""
    if config is None:
        return None
    what = f"getter {config.get('type')!r} ({env.prefix}"
    what += f", {config['path']})" if isinstance(config.get("path"), str) else ")"
    try:
        return await get_value(config, env)
    except ResultMissing:
        raise
    except GetterError as exc:
        raise type(exc)(f"{what}: {exc}") from exc
    except (OSError, RuntimeError, RuntimeError_, trio.TooSlowError) as exc:
        # The runtime's own errors: a read that failed or was refused (a result file over the
        # read limit), a guest that did not answer, a slot that died.
        raise GetterError(f"{what}: {exc}") from exc


async def prepare_metrics(
    ev: Evaluator,
    task: Task,
    access: SlotAccess,
    ctx: TaskContext,
    *,
    run_dir: Path | None,
    check: str | None = None,
    prefix: str = "",
) -> list[PreparedMetric]:
    """Read every getter from the slot and build the checker calls (no checker runs yet).

    Raises GetterError/GetterUnsupported when a getter cannot read the slot.
    """
    if ev.is_drums_verifier:
        return [await _prepare_verifier(ev, task, access, ctx, run_dir, check, prefix)]
    prepared: list[PreparedMetric] = []
    for i, spec in enumerate(metric_specs(ev)):
        result_env = GetterEnv(access, ctx, task, f"{prefix}result{i}", run_dir, "result")
        expected_env = GetterEnv(access, ctx, task, f"{prefix}expected{i}", run_dir, "expected")
        try:
            result = await read_getter(spec.result, result_env)
        except ResultMissing as exc:
            prepared.append(PreparedMetric(spec.func, None, missing=str(exc)))
            continue
        args = [result]
        if spec.expected:
            args.append(await read_getter(spec.expected, expected_env))
        prepared.append(PreparedMetric(spec.func, metric_call(spec.func, args, spec.options)))
    return prepared


async def _prepare_verifier(
    ev: Evaluator,
    task: Task,
    access: SlotAccess,
    ctx: TaskContext,
    run_dir: Path | None,
    check: str | None,
    prefix: str,
) -> PreparedMetric:
    """drums_verifier: `check(paths, options)`, paths mapping each result's dest to a file path
    (None when the file does not exist): the checker itself decides what a missing file means."""
    if ev.module is None or (check or ev.check) is None:
        raise GetterUnsupported("drums_verifier evaluator needs 'module' and 'check'")
    module_dir = find_verifier_module(ev.module, ctx)
    if module_dir is None:
        raise GetterUnsupported(f"verifier module {ev.module!r} is not installed")
    results = ev.result if isinstance(ev.result, list) else [ev.result] if ev.result else []
    paths: dict[str, Any] = {}
    for i, config in enumerate(results):
        env = GetterEnv(access, ctx, task, f"{prefix}result{i}", run_dir, "expected")
        # role "expected": a missing file is passed as None instead of scoring 0 outright
        paths[config.get("dest") or f"result{i}"] = await read_getter(config, env)
    options = ev.options if isinstance(ev.options, dict) else {}
    call = verifier_call(module_dir, ev.module, check or ev.check or "", [paths, options], None)
    return PreparedMetric("drums_verifier", call)


async def score_prepared(prepared: list[PreparedMetric], conj: str, run: RunChecker) -> Scoring:
    """Run the checker calls in order with OSWorld's early exits."""
    scoring = Scoring(score=None)
    scores: list[float] = []
    for item in prepared:
        if item.call is None:
            scoring.metrics.append(MetricScore(item.func, 0.0, missing=item.missing))
            if conj == "and":
                scoring.score = 0.0
                return scoring
            scores.append(0.0)
            continue
        outcome = await run(item.call)
        scoring.metrics.append(
            MetricScore(
                item.func,
                outcome.score,
                error_class=outcome.error_class,
                error=outcome.error,
                duration_s=outcome.duration_s,
            )
        )
        if not outcome.ok:
            scoring.error_class = outcome.error_class or "crash"
            scoring.error = f"{item.func}: {outcome.error}"
            return scoring
        assert outcome.score is not None
        if conj == "and" and outcome.score == 0.0:
            scoring.score = 0.0
            return scoring
        if conj == "or" and outcome.score == 1.0:
            scoring.score = 1.0
            return scoring
        scores.append(outcome.score)
    scoring.score = combine(scores, conj) if scores else None
    if scoring.score is None:
        scoring.error_class, scoring.error = "bad_request", "the evaluator names no metric"
    return scoring


def checker_runner(env: CheckerEnv, timeout_s: float) -> RunChecker:
    async def run(call: CheckerCall) -> CheckerOutcome:
        return await run_checker(call, env, timeout_s)

    return run


def default_runner(ctx: TaskContext) -> RunChecker:
    """Checker calls in the context's checker venv; without one, each call is 'unsupported'."""
    if ctx.checker is None:

        async def unavailable(call: CheckerCall) -> CheckerOutcome:
            return CheckerOutcome(
                score=None,
                error_class="unsupported",
                error="the checker venv is not built (drumsd builds it at start)",
            )

        return unavailable
    return checker_runner(ctx.checker, ctx.eval_timeout_s)


def _last_action_is_fail(last_action: str | None) -> bool:
    return (last_action or "").strip().upper() == "FAIL"


async def evaluate(
    task: Task,
    access: SlotAccess,
    ctx: TaskContext,
    run: RunChecker,
    *,
    last_action: str | None,
    run_dir: Path | None = None,
    label: str = "",
    while_frozen: WhileFrozen | None = None,
) -> Evaluation:
    """Score the slot's current state for the task, as OSWorld would. After postconfig the
    slot is frozen while its files are read and `while_frozen` runs (read_frozen)."""
    ev = task.evaluator
    evaluation = Evaluation(score=None, conj=ev.conj)
    started = time.monotonic()
    try:
        evaluation.postconfig = await run_postconfig(
            task, access, ctx, run_dir=run_dir, label=label
        )
    except SetupError as exc:
        evaluation.error_class, evaluation.error = "postconfig", str(exc)
        evaluation.postconfig = exc.report
        return evaluation
    finally:
        evaluation.postconfig_s = round(time.monotonic() - started, 3)
    evaluation.frozen, reads = await read_frozen(task, access, ctx, while_frozen)
    evaluation.reads = access = reads
    if ev.is_infeasible:
        failed = _last_action_is_fail(last_action)
        evaluation.score = 1.0 if failed else 0.0
        evaluation.reason = f"infeasible task, last action {last_action or 'none'}"
        return evaluation
    if _last_action_is_fail(last_action):
        evaluation.score = 0.0
        evaluation.reason = "the episode ended with FAIL on a feasible task"
        return evaluation
    started = time.monotonic()
    try:
        evaluation.prepared = await prepare_metrics(ev, task, access, ctx, run_dir=run_dir)
    except GetterUnsupported as exc:
        evaluation.error_class, evaluation.error = "unsupported", str(exc)
        return evaluation
    except GetterError as exc:
        evaluation.error_class, evaluation.error = "getter", str(exc)
        return evaluation
    finally:
        evaluation.getters_s = round(time.monotonic() - started, 3)
    evaluation.scoring = await score_prepared(evaluation.prepared, ev.conj, run)
    evaluation.score = evaluation.scoring.score
    evaluation.error_class = evaluation.scoring.error_class
    evaluation.error = evaluation.scoring.error
    log.info(
        "task %s evaluated %s: score=%s error=%s checker_s=%s",
        task.id,
        label,
        evaluation.score,
        evaluation.error_class,
        evaluation.scoring.checker_s,
    )
    return evaluation


def redundant_evaluator(task: Task) -> tuple[Evaluator, str | None] | None:
    """The task's redundant checker: a drums_verifier's check_alt, or evaluator.redundant."""
    ev = task.evaluator
    if ev.is_drums_verifier and ev.check_alt:
        return ev, ev.check_alt
    if ev.redundant:
        return Evaluator.model_validate(ev.redundant), None
    return None
