"""Task checkpoints, the pure part: the key a task's setup is cached under, which setups may be
cached at all, which cached ones to reap when they outgrow their cap.

A task checkpoint is the desktop right after a task's setup ran on a source checkpoint (a
template or a saved state), captured once; later creates and resets of the same task restore it
instead of replaying the setup. Its key must change whenever anything the setup depends on does:
the source (its id and hashes), the task's JSON, the bytes of every host file the setup copies
in, and the values its placeholders and commands are filled with (screen size, password, user
home, the browser and python commands).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from drumsd.core.gates import FAIL, PASS, judge_alive_after_resume
from drumsd.core.records import CheckpointKind, CheckpointRecord
from drumsd.core.seams import SlotFacts

# Bumped when what a key covers changes, so keys of an older daemon never match.
KEY_VERSION = 1

# Setup step types whose result must not be reused by another episode, and why. Decided by
# type: the rest (commands, app launches, files from the cache or assets, window actions) give
# the same desktop every time they run on the same source.
PER_EPISODE_STEPS: Mapping[str, str] = {
    "update_browse_history": "time-dependent: its visit times count back from the episode's start",
    "chrome_open_tabs": "network: the tabs load their pages when the setup runs",
}


@dataclass(frozen=True)
class SetupFingerprint:
    """Everything a task's setup depends on besides its source checkpoint, as the task bridge
    read it: `files` maps each host file the setup reads to the sha256 of its bytes."""

    task_id: str
    task_json: Mapping[str, Any]
    files: Mapping[str, str]
    context: Mapping[str, Any]
    cacheable: bool
    reason: str | None = None  # why the setup must run per episode (cacheable False)


def source_identity(cp: CheckpointRecord) -> dict[str, Any]:
    """What names the desktop a setup starts from: a rebuilt template or another saved state
    is another source, even of the same image."""
    return {
        "id": cp.id,
        "kind": cp.kind.value,
        "image": cp.image,
        "image_sha256": cp.image_sha256,
        "upper_sha256": cp.upper_sha256,
        "profile": cp.profile,
    }


def task_checkpoint_key(source: Mapping[str, Any], fp: SetupFingerprint) -> str:
    """sha256 over the source, the task's JSON, the setup's file hashes and its context, in a
    canonical JSON form (sorted keys, so a dict's order does not change the key)."""
    doc = {
        "v": KEY_VERSION,
        "source": dict(source),
        "task": fp.task_json,
        "files": dict(fp.files),
        "context": dict(fp.context),
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def setup_cacheable(
    step_types: Iterable[str], task_option: Any, *, enabled: bool = True
) -> tuple[bool, str | None]:
    """(cacheable, why not). `task_option` is the task's `drums.cache_setup` (None when the
    task does not say); `enabled` the daemon's `task_checkpoints.enabled`."""
    if not enabled:
        return False, "task checkpoints are off on this daemon (task_checkpoints.enabled)"
    if task_option is False:
        return False, "the task opts out (drums.cache_setup is false)"
    types = list(step_types)
    if not types:
        return False, "the task has no setup steps: its episode is its source's restore"
    for kind in types:
        why = PER_EPISODE_STEPS.get(kind)
        if why is not None and task_option is not True:
            return False, f"setup step {kind!r} must run per episode ({why})"
    return True, None


def check_cache_option(value: Any) -> str | None:
    """A problem with a task's `drums.cache_setup`, or None: it is a bool when given."""
    if value is None or isinstance(value, bool):
        return None
    return f"drums.cache_setup must be true or false, not {value!r}"


def find_task_checkpoint(
    checkpoints: Iterable[CheckpointRecord], key: str
) -> CheckpointRecord | None:
    """The newest ready task checkpoint under `key` that is not being deleted."""
    found = [
        cp
        for cp in checkpoints
        if cp.kind is CheckpointKind.task
        and cp.task_key == key
        and cp.ready
        and not cp.delete_when_unused
    ]
    return max(found, key=lambda c: c.created_at) if found else None


def task_checkpoints_over_cap(
    checkpoints: Iterable[CheckpointRecord], referenced: set[str], cap_mib: float | None
) -> list[tuple[CheckpointRecord, str]]:
    """Least recently used task checkpoints to delete so the rest fit under `cap_mib` (None:
    no cap). One a live slot restores from is never chosen; it still counts towards the total."""
    if cap_mib is None:
        return []
    mine = [cp for cp in checkpoints if cp.kind is CheckpointKind.task and cp.ready]
    total = sum(cp.size_mib for cp in mine)
    out: list[tuple[CheckpointRecord, str]] = []
    for cp in sorted(mine, key=lambda c: (c.last_used_at, c.created_at)):
        if total <= cap_mib:
            break
        if cp.id in referenced:
            continue
        out.append((cp, f"task checkpoints over task_checkpoints.max_mib={cap_mib:g} (LRU)"))
        total -= cp.size_mib
    return out


# ---- proving a new task checkpoint on a restore of itself before it serves episodes ----------
#
# A process a task checkpoint holds that exits on its own moments after a restore (a GIMP
# plug-in still answering its first-start query when the quiet window ended, warp in CI) exits
# the same way in every episode restored from it, and the alive_after_resume gate refuses each
# of them. So a new task checkpoint serves episodes only once a probe (a throwaway restore of
# it, never a user's slot) has run for the gate's window and nothing it held exited there. Its
# source slot is not watched: the agent acts there (quits apps, resets, destroys it), so what
# exits there says nothing of the checkpoint.


def held_watch_s(alive_after_s: float) -> float:
    """How long a new task checkpoint's probe runs before it is judged: the alive_after_resume
    gate's window (alive_after_s), plus as much again up to a second, since the gate's judge
    reads an episode's tree a moment after alive_after_s (the read takes time under load)."""
    return alive_after_s + min(alive_after_s, 1.0)


@dataclass(frozen=True)
class HeldVerdict:
    """Whether a probed task checkpoint may serve episodes (`keep`). A dropped one is tried
    again after the capture's retry delay when `retry_later` (what it held exits by itself, it
    does not restore or takes over the bound to, or the host had no room for its probe, so a
    capture right away would likely do the same), else at the next episode (not proven: its
    probe could not be read)."""

    keep: bool
    reason: str
    retry_later: bool = False
    exited: tuple[str, ...] = ()


def judge_held_processes(
    baseline: Mapping[str, Any], facts: SlotFacts | None, natural_exits: Sequence[str]
) -> HeldVerdict:
    """The verdict on a task checkpoint whose probe ran for `held_watch_s`: `baseline` is the
    probe's tree right after its restore (pids, proc_names, guest_workers, as an episode's
    baseline at ready), `facts` the tree at the window's end (None: unreadable). Judged as
    alive_after_resume judges an episode restored from the checkpoint, which the probe is in
    all but its agent: kept when the gate passes on it."""
    if facts is None:
        return HeldVerdict(
            False,
            "its probe's tree could not be read at the window's end, so no one saw that what "
            "it holds stays alive",
        )
    status, evidence = judge_alive_after_resume(facts, baseline, natural_exits)
    if status == PASS:
        return HeldVerdict(True, "every process it holds was still running in its probe")
    if status == FAIL and evidence.get("exited"):
        exited = tuple(f"{e['name']}({e['pid']})" for e in evidence["exited"])
        return HeldVerdict(
            False,
            f"process(es) {', '.join(exited)} it holds exited by themselves in a probe "
            "restored from it, within the alive_after_resume window: every episode restored "
            "from it would fail that gate",
            retry_later=True,
            exited=exited,
        )
    if status == FAIL:
        return HeldVerdict(
            False,
            f"a probe restored from it failed alive_after_resume: {evidence.get('reason')}",
            retry_later=True,
        )
    return HeldVerdict(
        False,
        "processes it holds exited in its probe whose names were not read "
        f"(pids {evidence.get('unnamed_exits')})",
        retry_later=True,
    )
