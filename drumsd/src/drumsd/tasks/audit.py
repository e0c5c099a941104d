"""Verify with a reward audit: the score, and how far to trust it.

The audit runs the same checker calls a second time (`nondeterministic` when the answers differ),
the task's redundant checker (`redundant_disagree`), a scan of the slot's upper layer against the
task's scope manifest (`scope_violation`, or `scope_unchecked` without a manifest), and reports
the checker's timing and error class (`checker_crash`, `checker_timeout`), and `weak_evidence`
for a reward read only from what the desktop shows (accessibility tree, terminal text, a
window) with no redundant checker to confirm it by a second route. The audit never changes
the score or the validity; `trusted` sums it up: true only for a valid episode with a score and no
flag, false when something is wrong, null when something is unknown.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from pydantic import BaseModel, Field

from drumsd.linux import beneath

from .checker import CheckerCall
from .evaluate import (
    Evaluation,
    PreparedMetric,
    RunChecker,
    Scoring,
    default_runner,
    evaluate,
    prepare_metrics,
    redundant_evaluator,
    score_prepared,
)
from .getters import GetterError
from .model import ScopeManifest, Task, TaskContext
from .setup import SlotAccess

# Flags that mean "this reward is wrong or unproven"; scope_unchecked only means "not looked at".
UNKNOWN_FLAGS = frozenset({"scope_unchecked"})


class EpisodeFacts(BaseModel):
    """What the daemon knows about the episode being verified."""

    valid: bool | None = None  # every gate passed (None: not judged yet)
    last_action: str | None = None  # "DONE", "FAIL" or the last action's kind
    upper_dir: Path | None = None  # host path of the slot's overlay upper layer
    lower_dir: Path | None = None  # host path of the image root (to tell new directories)
    run_dir: Path | None = None  # the episode's task cache dir (execute stdout=..., cache_file)
    label: str = ""  # "slot=… episode=…" for logs


class ScopeReport(BaseModel):
    checked: bool
    reason: str | None = None
    roots: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list)
    violations: list[str] = Field(default_factory=list)
    seeds_intact: list[str] = Field(default_factory=list)
    changed_total: int = 0  # the lists above hold at most MAX_LISTED each
    violations_total: int = 0


class Audit(BaseModel):
    flags: list[str] = Field(default_factory=list)
    error_class: str | None = None
    checker_s: float | None = None
    getters_s: float | None = None
    postconfig_s: float | None = None
    second_score: float | None = None
    redundant_score: float | None = None
    redundant_error: str | None = None
    scope: ScopeReport
    metrics: list[dict[str, Any]] = Field(default_factory=list)
    reason: str | None = None


class AuditedScore(BaseModel):
    """A checker's score with its audit: what the task side knows. The daemon adds the episode's
    verdict and gates to make the API's `drums.models.VerifyResult`."""

    score: float | None
    valid: bool | None
    checker_error: str | None
    audit: Audit
    trusted: bool | None
    # Why verify itself makes the episode invalid (a getter or checker that failed): the daemon
    # adds these to the gates' reasons, and the episode is not valid.
    invalid_reasons: list[str] = Field(default_factory=list)


# ---- scope scan ------------------------------------------------------------------------------


# What a verify answer lists of a scan at most; the counts say how many there were. A tree of
# this many changed entries under the roots is not walked further (issue 39, D4: a root swapped
# for a link to /usr listed 123,783 host paths in a 22 MB answer).
MAX_LISTED = 200
MAX_SCANNED = 100_000


def _is_whiteout(st: os.stat_result) -> bool:
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(dir_fd: int) -> bool:
    for name in ("trusted.overlay.opaque", "user.overlay.opaque"):
        try:
            if os.getxattr(dir_fd, name) == b"y":
                return True
        except OSError:
            continue
    return False


def allowed(path: str, globs: list[str]) -> bool:
    """fnmatch over the whole slot path ('*' also crosses '/'); 'dir/**' covers dir itself."""
    for pattern in globs:
        if fnmatch.fnmatchcase(path, pattern):
            return True
        if pattern.endswith("/**") and path == pattern[:-3]:
            return True
    return False


class _TooMany(Exception):
    pass


def scan_scope(
    upper_dir: Path, manifest: ScopeManifest, lower_dir: Path | None = None
) -> ScopeReport:
    """Files under the manifest's roots that the episode changed, and those outside `allow`.

    A change is anything present in the upper layer under a root: a new or modified file or
    symlink, a deletion (whiteout), an opaque directory, or a directory the image did not have
    (when lower_dir is given). A seeded file whose content still has its seeded hash is not a
    change. Paths are as seen inside the slot.

    The upper layer is the desktop user's: it is read beneath `upper_dir` without following a
    symlink anywhere (a root that is a link is itself the change, never walked), and the lists
    are cut at MAX_LISTED (the `*_total` counts are whole) and the walk at MAX_SCANNED entries
    (then `checked` is false: the scan is incomplete).
    """
    changed: list[str] = []
    seeds_intact: list[str] = []
    reason: str | None = None

    def note(path: str) -> None:
        changed.append(path)
        if len(changed) > MAX_SCANNED:
            raise _TooMany

    try:
        for root in manifest.roots:
            _scan_root(upper_dir, root, manifest, lower_dir, note, seeds_intact)
    except _TooMany:
        reason = f"more than {MAX_SCANNED} changed entries under the roots: the scan stopped"
    for path in manifest.seeded:
        # A seed that left the upper layer without a whiteout was deleted, unless the image
        # (e.g. a checkpoint taken after setup) still holds it.
        under_root = any(path.startswith(r.rstrip("/") + "/") for r in manifest.roots)
        in_upper = beneath.lstat_beneath(upper_dir, path) is not None
        in_lower = lower_dir is not None and beneath.lstat_beneath(lower_dir, path) is not None
        if under_root and not in_upper and not in_lower:
            changed.append(path)
    violations = sorted(p for p in changed if not allowed(p.rstrip("/"), manifest.allow))
    changed.sort()
    return ScopeReport(
        checked=reason is None,
        reason=reason,
        roots=list(manifest.roots),
        changed=changed[:MAX_LISTED],
        violations=violations[:MAX_LISTED],
        seeds_intact=sorted(seeds_intact)[:MAX_LISTED],
        changed_total=len(changed),
        violations_total=len(violations),
    )


def _scan_root(
    upper_dir: Path,
    root: str,
    manifest: ScopeManifest,
    lower_dir: Path | None,
    note: Any,
    seeds_intact: list[str],
) -> None:
    top = root.strip("/")
    st = beneath.lstat_beneath(upper_dir, top)
    if st is None:
        # Not in the upper layer (unchanged), unless a component on the way is a link the
        # episode made: then that link is the change.
        _note_link_on_the_way(upper_dir, top, note)
        return
    if not stat.S_ISDIR(st.st_mode):
        note("/" + top)  # the root itself replaced (by a link, a file, a whiteout)
        return
    try:
        walk = beneath.walk_beneath(upper_dir, top)
    except OSError:
        note("/" + top)  # swapped for a link since the lstat
        return
    for rel_dir, _dirs, files, dir_fd in walk:
        slot_dir = "/" + rel_dir
        if rel_dir != top and (
            _is_opaque(dir_fd)
            or (lower_dir is not None and beneath.lstat_beneath(lower_dir, rel_dir) is None)
        ):
            note(slot_dir + "/")
        for name in files:  # symlinks (to directories too) are among them
            slot_path = f"{slot_dir.rstrip('/')}/{name}"
            try:
                entry = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone while walking
            if _is_whiteout(entry):
                note(slot_path)
                continue
            seed = manifest.seeded.get(slot_path)
            if seed is not None and stat.S_ISREG(entry.st_mode):
                if beneath.sha256_at(dir_fd, name) == seed:
                    seeds_intact.append(slot_path)
                    continue
            note(slot_path)


def _note_link_on_the_way(upper_dir: Path, top: str, note: Any) -> None:
    parts = top.split("/")
    for i in range(1, len(parts)):
        st = beneath.lstat_beneath(upper_dir, "/".join(parts[:i]))
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            note("/" + "/".join(parts[:i]))
            return


def _scope(task: Task, episode: EpisodeFacts) -> ScopeReport:
    manifest = task.scope
    if manifest is None:
        return ScopeReport(checked=False, reason="the task has no scope manifest")
    if episode.upper_dir is None or not episode.upper_dir.is_dir():
        return ScopeReport(checked=False, reason="no upper layer to scan for this slot")
    return scan_scope(episode.upper_dir, manifest, episode.lower_dir)


# ---- verify ----------------------------------------------------------------------------------


def _differs(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is not b
    return abs(a - b) > 1e-9


def _flag_for(error_class: str | None) -> str | None:
    if error_class == "timeout":
        return "checker_timeout"
    if error_class in ("crash", "runner"):
        return "checker_crash"
    if error_class == "memory_limit":
        return "checker_memory_limit"
    if error_class == "cpu_limit":
        return "checker_cpu_limit"
    return None


# Getters whose answer is what the desktop shows, which the desktop user controls (a fake window,
# an AT-SPI object, text echoed in a terminal). A reward from them alone is weak evidence unless
# the task names a second route (a redundant checker).
DESKTOP_EVIDENCE = frozenset(
    {"accessibility_tree", "active_url_from_accessTree", "vm_terminal_output", "vm_window_size"}
)


def desktop_evidence(task: Task) -> list[str]:
    """The getters of the task's evaluator that read what the desktop shows (pure)."""
    ev = task.evaluator
    found = []
    for part in (ev.result, ev.expected):
        for getter in part if isinstance(part, list) else [part]:
            if isinstance(getter, dict) and getter.get("type") in DESKTOP_EVIDENCE:
                found.append(str(getter["type"]))
    return sorted(set(found))


def trusted_verdict(valid: bool | None, score: float | None, flags: list[str]) -> bool | None:
    """True only for a valid episode with a score and no flag; None when something is unknown."""
    if valid is False or score is None or any(f not in UNKNOWN_FLAGS for f in flags):
        return False
    if valid is None or flags:
        return None
    return True


def _with_check(prepared: list[PreparedMetric], check: str) -> list[PreparedMetric]:
    out = []
    for item in prepared:
        call = item.call
        if call is not None:
            call = CheckerCall(
                request={**call.request, "check": check},
                files=call.files,
                module_dir=call.module_dir,
            )
        out.append(replace(item, call=call))
    return out


async def _redundant(
    task: Task,
    evaluation: Evaluation,
    access: SlotAccess,
    ctx: TaskContext,
    run: RunChecker,
    run_dir: Path | None,
) -> Scoring | str | None:
    found = redundant_evaluator(task)
    if found is None:
        return None
    ev, check = found
    if check is not None:
        # drums_verifier: the alternative check over the very same inputs.
        return await score_prepared(_with_check(evaluation.prepared, check), ev.conj, run)
    try:
        prepared = await prepare_metrics(
            ev, task, access, ctx, run_dir=run_dir, prefix="redundant-"
        )
    except GetterError as exc:
        return f"redundant checker's getter failed: {exc}"
    return await score_prepared(prepared, ev.conj, run)


async def _second_and_redundant(
    task: Task,
    evaluation: Evaluation,
    access: SlotAccess,
    ctx: TaskContext,
    run: RunChecker,
    episode: EpisodeFacts,
) -> tuple[Scoring, Scoring | str | None]:
    results: dict[str, Any] = {}

    async def second() -> None:
        results["second"] = await score_prepared(evaluation.prepared, evaluation.conj, run)

    async def redundant() -> None:
        results["redundant"] = await _redundant(task, evaluation, access, ctx, run, episode.run_dir)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        nursery.start_soon(redundant)
    return results["second"], results["redundant"]


async def verify(
    task: Task,
    access: SlotAccess,
    ctx: TaskContext,
    episode: EpisodeFacts,
    run: RunChecker | None = None,
) -> AuditedScore:
    """Score the task on the slot and audit the score. Never raises for a checker's failure.

    `run` runs one checker call; by default a process in the checker venv (`ctx.checker`).
    """
    if run is None:
        run = default_runner(ctx)
    scans: list[ScopeReport] = []

    async def scan() -> None:
        # In the frozen window, right after the getters' files are read: what the scan sees is
        # the state they read, not one an agent process changed since (issue 36).
        scans.append(await trio.to_thread.run_sync(_scope, task, episode))

    evaluation = await evaluate(
        task,
        access,
        ctx,
        run,
        last_action=episode.last_action,
        run_dir=episode.run_dir,
        label=episode.label,
        while_frozen=scan,
    )
    flags: list[str] = []
    if evaluation.frozen is False:
        flags.append("not_frozen")  # the freeze failed: the reads raced the desktop
    reads = evaluation.reads or access
    first_flag = _flag_for(evaluation.error_class)
    if first_flag:
        flags.append(first_flag)
    audit = Audit(
        scope=ScopeReport(checked=False),
        error_class=evaluation.error_class,
        checker_s=evaluation.scoring.checker_s if evaluation.scoring else None,
        getters_s=evaluation.getters_s,
        postconfig_s=evaluation.postconfig_s,
        reason=evaluation.reason,
        metrics=[vars(m) for m in evaluation.scoring.metrics] if evaluation.scoring else [],
    )
    if evaluation.scoring is not None and evaluation.score is not None:
        # The second run and the redundant checker are independent reads of what the first run
        # read (each checker process gets its own scratch copy): run them at once.
        second, redundant = await _second_and_redundant(task, evaluation, reads, ctx, run, episode)
        audit.second_score = second.score
        second_flag = _flag_for(second.error_class)
        if second_flag and second_flag not in flags:
            flags.append(second_flag)
        if _differs(evaluation.score, second.score):
            flags.append("nondeterministic")
        if isinstance(redundant, str):
            audit.redundant_error = redundant
            flags.append("redundant_disagree")
        elif redundant is not None:
            audit.redundant_score = redundant.score
            audit.redundant_error = redundant.error
            if _differs(evaluation.score, redundant.score):
                flags.append("redundant_disagree")
    if evaluation.score and desktop_evidence(task) and redundant_evaluator(task) is None:
        flags.append("weak_evidence")
    audit.scope = scans[0] if scans else await trio.to_thread.run_sync(_scope, task, episode)
    if not audit.scope.checked:
        flags.append("scope_unchecked")
    if audit.scope.violations:
        flags.append("scope_violation")
    audit.flags = flags
    checker_error = (
        f"{evaluation.error_class}: {evaluation.error}" if evaluation.error_class else None
    )
    reasons = (
        [failed_evaluation_reason(evaluation)]
        if evaluation.error_class in EPISODE_UNREADABLE
        else []
    )
    valid = False if reasons else episode.valid
    return AuditedScore(
        score=evaluation.score,
        valid=valid,
        checker_error=checker_error,
        audit=audit,
        trusted=trusted_verdict(valid, evaluation.score, flags),
        invalid_reasons=reasons,
    )


# A slot's disk with less free than this at verify is full: what its apps saved may be cut short
# and what its getters or checkers write may fail (issue 36, the exploit suite's `diskfill`).
DISK_FULL_MIB = 4.0
DISK_FULL_FRACTION = 0.01


def full_disk_reason(free_mib: float | None, total_mib: float | None) -> str | None:
    """Why a slot whose disk is full at verify is an invalid episode, or None (pure)."""
    if free_mib is None or not total_mib:
        return None
    if free_mib >= max(DISK_FULL_MIB, DISK_FULL_FRACTION * total_mib):
        return None
    return (
        f"verify failed: the slot's disk was full ({free_mib:.1f} MiB free of "
        f"{total_mib:.0f} MiB): the state the evaluator reads may be cut short"
    )


# Evaluation failures that mean the episode's state could not be read (a getter, the
# postconfig): the episode is invalid. A checker that fails on what it was given (crash,
# timeout, a limit) is the design's third row instead: `checker_error`, no score, the
# episode's validity the gates' (the trainer skips it either way).
EPISODE_UNREADABLE = frozenset({"getter", "postconfig"})


def failed_evaluation_reason(evaluation: Evaluation) -> str:
    """Why an evaluation that could not read the episode makes it invalid (pure): there is no
    reward to learn from, not even a 0 (issue 36: an agent that breaks what the evaluator reads
    must not earn a trusted 0 or 1 by it)."""
    if evaluation.error_class == "getter":
        return f"verify failed: {evaluation.error}"
    return f"verify failed ({evaluation.error_class}): {evaluation.error}"
