"""The gate framework: gate names, pure judges from runtime facts, and the episode verdict.

A gate whose evidence the runtime does not report stays `pending` (never `pass` by default), so
the episode's validity is unknown (null) rather than wrongly true; only positive evidence of a
problem fails a gate (and quarantines the slot).

Judges take the slot's `SlotFacts` (as the supervisor read them: the runtime's, with the crash
watch's and the evidence reader's keys merged into `extra`), the facts at episode start, the
checkpoint's recorded hash, the host's namespaces, and return (status, evidence). The supervisor
reads facts from the runtime, calls the judges, stores the results in the slot record, and
quarantines the slot when any gate fails.

Keys of `SlotFacts.extra` the judges read (the runtime fills them):
  lock_applied: bool          hardening lock in force in the restored tree
  guest_ready: bool           the guest agent answers
  upper_sha256: str           hash of the restored upper layer at episode start
  expected_mounts: list[str]  the mount table this slot must have (else taken from the handle)
  proc_names: {pid: name}     names of `pids`, to apply natural_exits
  guest_workers: [pid]        the guest agent's action worker (its restart is not an exit)
  display_server: {display, pid, start, uid, sockets}  who serves the X display now; the
                              display_server gate compares it with the one at episode start
  crash_exits: [ {pid, name, signal} ]  crash-signal exits seen by the proc connector
  crash_watch: bool           False when the runtime has no process-events connector
  pids_max_hits: int          forks refused at pids.max (pids.events `max`); no_oom_kill fails
                              when it grew since the episode started
  host_namespaces: {ns: inode} the host's namespaces as the runtime sees them
  lock, upper_diff            evidence detail shown with lock_applied and state_hash
  upper_caches: [glob]        the image's caches the upper hash comparison left out
(`drumsd.runtime.gate_evidence` fills lock_applied, upper_sha256, expected_mounts and proc_names
from the OS; the crash watch fills crash_exits and crash_watch.)
`limits_in_force` may use normalized keys (memory_mib, pids_max, vcpus) or raw cgroup files
(v1: memory.limit_in_bytes, cpu.cfs_quota_us, cpu.cfs_period_us, pids.max; v2: memory.max,
cpu.max, pids.max); `normalize_limits` maps the latter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from drumsd.core.seams import SlotFacts
from drumsd.core.vocabulary import GATES
from drumsd.core.vocabulary import START_GATES as START_GATES  # re-exported: G.START_GATES

ISOLATED_NAMESPACES = ("pid", "mnt", "net", "ipc", "uts")

PASS, FAIL, PENDING = "pass", "fail", "pending"

Judgement = tuple[str, dict[str, Any]]


def judge_lock_applied(facts: SlotFacts, profile: str) -> Judgement:
    if profile == "trusted":
        return PASS, {"profile": "trusted", "note": "no hardening lock in the trusted profile"}
    applied = facts.extra.get("lock_applied")
    if applied is None:
        return PENDING, {"reason": "the runtime does not report lock_applied"}
    return (PASS if applied else FAIL), {
        "lock_applied": bool(applied),
        **({"lock": facts.extra["lock"]} if "lock" in facts.extra else {}),
    }


def normalize_limits(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Raw cgroup v1/v2 files -> memory_mib, pids_max, vcpus ("max" where unlimited)."""
    out: dict[str, Any] = {k: raw[k] for k in ("memory_mib", "pids_max", "vcpus") if k in raw}
    memory = raw.get("memory.limit_in_bytes", raw.get("memory.max"))
    if memory is not None and "memory_mib" not in out:
        text = str(memory).strip()
        # v1 spells "unlimited" as a huge page-rounded number.
        out["memory_mib"] = (
            "max" if text == "max" or int(text) >= 1 << 62 else int(text) / (1024 * 1024)
        )
    if "pids.max" in raw and "pids_max" not in out:
        text = str(raw["pids.max"]).strip()
        out["pids_max"] = "max" if text == "max" else int(text)
    if "vcpus" not in out:
        if "cpu.cfs_quota_us" in raw and "cpu.cfs_period_us" in raw:
            quota, period = int(raw["cpu.cfs_quota_us"]), int(raw["cpu.cfs_period_us"])
            out["vcpus"] = "max" if quota < 0 else quota / period
        elif "cpu.max" in raw:
            quota_text, _, period_text = str(raw["cpu.max"]).partition(" ")
            out["vcpus"] = (
                "max" if quota_text == "max" else int(quota_text) / int(period_text or 100000)
            )
    return out


def judge_cgroup(facts: SlotFacts, expected: Mapping[str, Any]) -> Judgement:
    """Each expected limit (memory_mib, pids_max, vcpus) must be in force; a limit the runtime
    does not report leaves the gate pending."""
    try:
        in_force = normalize_limits(facts.limits_in_force)
    except (TypeError, ValueError) as exc:
        return FAIL, {
            "reason": f"unreadable cgroup limits: {exc}",
            "raw": dict(facts.limits_in_force),
        }
    wrong, missing = {}, []
    for key, want in expected.items():
        if key not in in_force:
            missing.append(key)
        elif not _close(in_force[key], want):
            wrong[key] = {"want": want, "have": in_force[key]}
    if wrong:
        return FAIL, {"wrong": wrong}
    if missing:
        return PENDING, {"not_reported": missing, "in_force": in_force}
    return PASS, {"in_force": in_force}


def _close(have: Any, want: Any) -> bool:
    try:
        return abs(float(have) - float(want)) <= 1e-6 * max(1.0, abs(float(want)))
    except (TypeError, ValueError):
        return have == want


def judge_init_identity(facts: SlotFacts) -> Judgement:
    ok = bool(facts.init_identity_ok)
    return (PASS if ok else FAIL), {"init_identity_ok": ok, "alive": bool(facts.alive)}


def judge_mount_table(facts: SlotFacts, expected: Sequence[str] | None) -> Judgement:
    expected = facts.extra.get("expected_mounts", expected)
    if expected is None:
        return PENDING, {"reason": "the runtime does not report the expected mount table"}
    have, want = set(facts.mounts), set(expected)
    if have != want:
        return FAIL, {"unexpected": sorted(have - want), "missing": sorted(want - have)}
    return PASS, {"mounts": len(have)}


def judge_netns(facts: SlotFacts, host_namespaces: Mapping[str, int]) -> Judgement:
    links = sorted(facts.net_links)
    net = facts.namespaces.get("net")
    if net is None or net == host_namespaces.get("net"):
        return FAIL, {"reason": "slot shares the host's network namespace", "net": net}
    if links != ["lo"]:
        return FAIL, {"links": links, "reason": "a slot's namespace must have only lo"}
    return PASS, {"links": links, "net": net}


def judge_guest_ready(facts: SlotFacts) -> Judgement:
    ready = facts.extra.get("guest_ready")
    if ready is None:
        # restore() returns only after the agent answered, so a live tree means it was ready.
        ready = bool(facts.alive)
    return (PASS if ready else FAIL), {"guest_ready": bool(ready)}


def judge_state_hash(facts: SlotFacts, recorded: str | None) -> Judgement:
    restored = facts.extra.get("upper_sha256")
    if recorded is None:
        return PENDING, {"reason": "the checkpoint has no recorded upper_sha256"}
    if restored is None:
        return PENDING, {"reason": "the runtime does not report the restored upper hash"}
    # The image's caches (image_profiles.state_caches) were not compared: the report says so.
    caches = facts.extra.get("upper_caches")
    skipped: dict[str, Any] = {"caches_not_compared": caches} if caches else {}
    # What the restored tree changed itself (not a mismatch), so a pass says what it excused.
    for key in ("upper_written", "upper_mapped"):
        if facts.extra.get(key):
            skipped[key] = facts.extra[key]
    if restored != recorded:
        diff = facts.extra.get("upper_diff")
        return FAIL, {
            "recorded": recorded,
            "restored": restored,
            **({"diff": diff} if diff else {}),
            **skipped,
        }
    return PASS, {"upper_sha256": restored, **skipped}


def judge_isolation(
    facts: SlotFacts,
    host_namespaces: Mapping[str, int],
    other_slots: Mapping[str, Mapping[str, int]],
) -> Judgement:
    mine = facts.namespaces
    problems = []
    for ns in ISOLATED_NAMESPACES:
        inode = mine.get(ns)
        if inode is None:
            problems.append(f"{ns}: not reported")
        elif host_namespaces.get(ns) == inode:
            problems.append(f"{ns}: same as the host")
        else:
            for other_id, theirs in other_slots.items():
                if theirs.get(ns) == inode:
                    problems.append(f"{ns}: shared with slot {other_id}")
    if problems:
        return FAIL, {"problems": problems}
    return PASS, {"namespaces": {ns: mine.get(ns) for ns in ISOLATED_NAMESPACES}}


def judge_alive_after_resume(
    facts: SlotFacts, baseline: Mapping[str, Any], natural_exits: Sequence[str]
) -> Judgement:
    """Every process of the tree at ready is still alive, except those named in natural_exits
    and the guest agent's action worker (`guest_workers` at ready): the agent itself restarts
    that one when a step kills it or runs past its timeout, so its exit is not an app's."""
    if not facts.alive:
        return FAIL, {"reason": "the slot's init is gone"}
    start_names: dict[str, str] = {str(k): v for k, v in baseline.get("proc_names", {}).items()}
    start_pids = {int(p) for p in baseline.get("pids", [])}
    now_pids = {int(p) for p in facts.pids}
    workers = {int(p) for p in baseline.get("guest_workers", [])}
    restarted = sorted((start_pids - now_pids) & workers)
    gone = sorted(start_pids - now_pids - workers)
    unexpected = [
        {"pid": pid, "name": start_names[str(pid)]}
        for pid in gone
        if str(pid) in start_names and start_names[str(pid)] not in natural_exits
    ]
    unnamed = [pid for pid in gone if str(pid) not in start_names]
    if unexpected:
        return FAIL, {"exited": unexpected, "unnamed_exits": unnamed}
    if unnamed:
        # Without names natural_exits cannot apply: unknown, not a failure.
        return PENDING, {
            "reason": "processes exited whose names the runtime did not report (proc_names)",
            "unnamed_exits": unnamed,
        }
    return PASS, {
        "pids": len(now_pids),
        "natural_exits": len(gone),
        **({"worker_restarts": restarted} if restarted else {}),
    }


def judge_no_oom_kill(facts: SlotFacts, baseline: Mapping[str, Any]) -> Judgement:
    """The slot's tree ran out of neither memory (an OOM kill) nor pids: a fork refused at
    `pids.max` since the episode started (a fork bomb) fails it as well (issue 14, finding 11),
    since the desktop and checker can no longer start what they need."""
    kills = int(facts.oom_kills) - int(baseline.get("oom_kills", 0))
    evidence: dict[str, Any] = {"oom_kills": max(0, kills)}
    hits_now = facts.extra.get("pids_max_hits")
    if hits_now is not None:
        hits = int(hits_now) - int(baseline.get("pids_max_hits", 0))
        evidence["pids_max_hits"] = max(0, hits)
        if hits > 0:
            evidence["reason"] = f"{hits} fork(s) refused at pids.max"
            return FAIL, evidence
    return (PASS if kills <= 0 else FAIL), evidence


def judge_no_app_crash(facts: SlotFacts, crash_watch: bool) -> Judgement:
    crashes = facts.extra.get("crash_exits")
    if crashes:
        return FAIL, {"crash_exits": list(crashes)}
    if not crash_watch:
        return PASS, {"watched": False, "note": "crash_watch off: crashes are not observed"}
    if crashes is None or facts.extra.get("crash_watch") is False:
        return PENDING, {"reason": "the runtime does not watch process events (crash_exits)"}
    return PASS, {"watched": True}


IDENTITY_KEYS = ("pid", "start", "sockets")


def judge_display_server(
    now: Mapping[str, Any] | None, held: Mapping[str, Any] | None
) -> Judgement:
    """The X server that served the display when the episode began serves it still: same
    process (pid and start time) holding the same listening sockets. Screenshots and input go
    to whoever holds them, so a server the desktop user started in its place (after killing
    it) would feed every screen-based check a forged screen (issue 39)."""
    if held is None or now is None:
        return PENDING, {"reason": "the runtime does not report the display's X server"}
    if held.get("pid") is None:
        return FAIL, {"reason": f"no X server at episode start: {held.get('error')}"}
    same = all(now.get(k) == held.get(k) for k in IDENTITY_KEYS)
    if same:
        return PASS, {k: held.get(k) for k in ("display", *IDENTITY_KEYS, "uid")}
    gone = not now.get("sockets")
    return FAIL, {
        "reason": f"the X server of display {held.get('display')} "
        + ("is gone" if gone else "was replaced: another process serves the display"),
        "at_start": {k: held.get(k) for k in IDENTITY_KEYS},
        "now": {k: now.get(k) for k in (*IDENTITY_KEYS, "uid", "error") if k in now},
    }


def judge_not_quarantined(quarantine_reason: str | None) -> Judgement:
    if quarantine_reason:
        return FAIL, {"reason": quarantine_reason}
    return PASS, {}


def episode_valid(statuses: Mapping[str, str]) -> bool | None:
    """True when every gate passed, False when one failed, None while any is pending."""
    values = [statuses.get(name, PENDING) for name in GATES]
    if FAIL in values:
        return False
    if PENDING in values:
        return None
    return True


def failed_gates(statuses: Mapping[str, str]) -> list[str]:
    return [name for name in GATES if statuses.get(name) == FAIL]


def verdict(statuses: Mapping[str, str], quarantined: bool) -> str:
    """valid | invalid | quarantined | pending"""
    if quarantined:
        return "quarantined"
    valid = episode_valid(statuses)
    return {True: "valid", False: "invalid", None: "pending"}[valid]


def quarantine_reason(statuses: Mapping[str, str], evidence: Mapping[str, Any]) -> str | None:
    """The reason recorded when a gate failure quarantines a slot."""
    failed = [g for g in failed_gates(statuses) if g != "not_quarantined"]
    if not failed:
        return None
    first = failed[0]
    return f"gate {first} failed: {_short(evidence.get(first, {}))}" + (
        f" (and {', '.join(failed[1:])})" if len(failed) > 1 else ""
    )


def _short(evidence: Any) -> str:
    text = str(evidence)
    return text if len(text) <= 200 else text[:197] + "..."
