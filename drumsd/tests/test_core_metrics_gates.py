"""Metrics windows and Prometheus text; gate judges and verdicts."""

from __future__ import annotations

import dataclasses
import re

import pytest
from drumsd.core import gates as G
from drumsd.core.metrics import Histogram, MetricsWindow, prometheus_text
from drumsd.core.seams import SlotFacts


def test_quantiles_are_nearest_rank() -> None:
    h = Histogram()
    for v in range(1, 101):
        h.observe(v / 100)
    assert h.quantile(0.5) == 0.5
    assert h.quantile(0.99) == 0.99
    s = h.summary()
    assert s["count"] == 100 and s["max"] == 1.0 and abs(s["mean"] - 0.505) < 1e-9


def test_cost_per_valid_episode_and_per_verified_reward() -> None:
    w = MetricsWindow(started_at=0.0)
    w.episode_finished("valid")
    w.episode_finished("valid")
    w.episode_finished("invalid")
    w.reward_verified()
    cost = w.cost(now=3600.0, host_usd_per_hour=2.0)
    assert cost["usd_in_window"] == 2.0
    assert cost["usd_per_valid_episode"] == 1.0
    assert cost["usd_per_verified_reward"] == 2.0
    assert MetricsWindow(started_at=0).cost(10, 1.0)["usd_per_valid_episode"] is None


SAMPLE_LINE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\.)*",?)*\})? '
    r"([-+]?[0-9.eE+-]+|[+-]Inf|NaN)$"
)


def test_prometheus_text_is_valid_exposition() -> None:
    w = MetricsWindow(started_at=0.0)
    w.observe("reset", 0.15)
    w.observe("reset", 0.4)
    w.failure('odd"class\n')
    w.episode_finished("valid")
    text = prometheus_text(w, 10.0, 1.0, [("drums_slots", "Slots.", {"state": "ready"}, 3)])
    assert text.endswith("\n")
    types: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"{name} typed twice"
            types[name] = kind
        elif line.startswith("# HELP"):
            continue
        else:
            assert SAMPLE_LINE.match(line), line
    assert types["drums_operation_seconds"] == "histogram"
    assert 'drums_operation_seconds_bucket{operation="reset",le="0.2"} 1' in text
    assert 'drums_operation_seconds_bucket{operation="reset",le="+Inf"} 2' in text
    assert 'drums_operation_seconds_count{operation="reset"} 2' in text
    assert 'drums_slots{state="ready"} 3.0' in text


def facts(**kw) -> SlotFacts:
    base = {
        "alive": True,
        "init_identity_ok": True,
        "limits_in_force": {"memory_mib": 2048, "pids_max": 1024, "vcpus": 1.0},
        "mounts": ["/ overlay", "/proc proc"],
        "net_links": ["lo"],
        "namespaces": {"pid": 11, "mnt": 12, "net": 13, "ipc": 14, "uts": 15},
        "oom_kills": 0,
        "pids": [1, 2, 3],
        "extra": {
            "lock_applied": True,
            "upper_sha256": "h",
            "expected_mounts": ["/ overlay", "/proc proc"],
            "crash_exits": [],
        },
    }
    extra = kw.pop("extra", {})
    base.update(kw)
    base["extra"] = {**base["extra"], **extra}
    return SlotFacts(**base)


HOST = {"pid": 1, "mnt": 2, "net": 3, "ipc": 4, "uts": 5}
X_SERVER = {
    "display": ":0",
    "pid": 2,
    "start": 7,
    "uid": 1000,
    "sockets": {"@/tmp/.X11-unix/X0": 5},
}


def test_every_gate_passes_on_good_facts() -> None:
    f = facts()
    baseline = {"pids": [1, 2, 3], "proc_names": {"3": "splash"}, "oom_kills": 0}
    results = {
        "lock_applied": G.judge_lock_applied(f, "hardened"),
        "cgroup": G.judge_cgroup(f, {"memory_mib": 2048, "pids_max": 1024, "vcpus": 1.0}),
        "init_identity": G.judge_init_identity(f),
        "mount_table": G.judge_mount_table(f, None),
        "netns": G.judge_netns(f, HOST),
        "guest_ready": G.judge_guest_ready(f),
        "state_hash": G.judge_state_hash(f, "h"),
        "isolation": G.judge_isolation(f, HOST, {"s-2": {"pid": 99}}),
        "alive_after_resume": G.judge_alive_after_resume(f, baseline, []),
        "no_oom_kill": G.judge_no_oom_kill(f, baseline),
        "no_app_crash": G.judge_no_app_crash(f, True),
        "display_server": G.judge_display_server(X_SERVER, X_SERVER),
        "not_quarantined": G.judge_not_quarantined(None),
    }
    assert set(results) == set(G.GATES)
    statuses = {k: v[0] for k, v in results.items()}
    assert all(s == G.PASS for s in statuses.values()), results
    assert G.episode_valid(statuses) is True
    assert G.verdict(statuses, False) == "valid"


@pytest.mark.parametrize(
    ("gate", "judged"),
    [
        ("lock_applied", lambda: G.judge_lock_applied(facts(extra={"lock_applied": False}), "h")),
        (
            "cgroup",
            lambda: G.judge_cgroup(
                facts(limits_in_force={"memory_mib": 4096}), {"memory_mib": 2048}
            ),
        ),
        ("init_identity", lambda: G.judge_init_identity(facts(init_identity_ok=False))),
        (
            "mount_table",
            lambda: G.judge_mount_table(
                facts(mounts=["/ overlay", "/proc proc", "/evil bind"]), None
            ),
        ),
        ("netns_links", lambda: G.judge_netns(facts(net_links=["lo", "eth0"]), HOST)),
        ("netns_host", lambda: G.judge_netns(facts(namespaces={"net": 3}), HOST)),
        ("state_hash", lambda: G.judge_state_hash(facts(extra={"upper_sha256": "x"}), "h")),
        (
            "isolation_host",
            lambda: G.judge_isolation(
                facts(namespaces={"pid": 1, "mnt": 12, "net": 13, "ipc": 14, "uts": 15}), HOST, {}
            ),
        ),
        ("isolation_shared", lambda: G.judge_isolation(facts(), HOST, {"s-2": {"ipc": 14}})),
        (
            "alive_after_resume",
            lambda: G.judge_alive_after_resume(
                facts(pids=[1, 2]), {"pids": [1, 2, 3], "proc_names": {"3": "soffice"}}, ["x"]
            ),
        ),
        ("no_oom_kill", lambda: G.judge_no_oom_kill(facts(oom_kills=2), {"oom_kills": 1})),
        (
            "no_app_crash",
            lambda: G.judge_no_app_crash(
                facts(extra={"crash_exits": [{"pid": 9, "signal": 11}]}), True
            ),
        ),
        (
            "display_server_replaced",
            lambda: G.judge_display_server(
                {**X_SERVER, "pid": 40, "start": 90, "sockets": {"@/tmp/.X11-unix/X0": 6}}, X_SERVER
            ),
        ),
        (
            "display_server_gone",
            lambda: G.judge_display_server({"display": ":0", "pid": None, "sockets": {}}, X_SERVER),
        ),
        ("not_quarantined", lambda: G.judge_not_quarantined("by request")),
    ],
)
def test_each_gate_can_fail(gate: str, judged) -> None:
    status, evidence = judged()
    assert status == G.FAIL, (gate, evidence)
    assert evidence


def test_natural_exits_do_not_fail_alive_after_resume() -> None:
    status, _ = G.judge_alive_after_resume(
        facts(pids=[1, 2]), {"pids": [1, 2, 3], "proc_names": {"3": "splash"}}, ["splash"]
    )
    assert status == G.PASS


def test_a_guest_worker_restart_does_not_fail_alive_after_resume() -> None:
    # The guest agent restarted its action worker (pid 3) after a step killed it: the daemon's
    # own doing (issue 39, D8). Any other exit still fails.
    baseline = {"pids": [1, 2, 3], "proc_names": {"3": "python3"}, "guest_workers": ["3"]}
    status, evidence = G.judge_alive_after_resume(facts(pids=[1, 2, 9]), baseline, [])
    assert status == G.PASS and evidence["worker_restarts"] == [3], evidence
    named = {**baseline, "proc_names": {"2": "xterm", "3": "python3"}}
    assert G.judge_alive_after_resume(facts(pids=[1, 9]), named, [])[0] == G.FAIL


def test_trusted_profile_has_no_lock_and_verdict_rules() -> None:
    assert G.judge_lock_applied(facts(extra={"lock_applied": None}), "trusted")[0] == G.PASS
    statuses = {name: G.PASS for name in G.GATES}
    statuses["alive_after_resume"] = G.PENDING
    assert G.episode_valid(statuses) is None and G.verdict(statuses, False) == "pending"
    statuses["netns"] = G.FAIL
    assert G.episode_valid(statuses) is False
    assert G.failed_gates(statuses) == ["netns"]
    assert G.verdict(statuses, True) == "quarantined"
    reason = G.quarantine_reason(statuses, {"netns": {"links": ["eth0"]}})
    assert reason is not None and reason.startswith("gate netns failed")


def test_unreported_evidence_leaves_gates_pending_never_passed() -> None:
    bare = dataclasses.replace(facts(limits_in_force={}), extra={})
    assert G.judge_lock_applied(bare, "hardened")[0] == G.PENDING
    assert G.judge_cgroup(bare, {"memory_mib": 1})[0] == G.PENDING
    assert G.judge_mount_table(bare, None)[0] == G.PENDING
    assert G.judge_state_hash(bare, None)[0] == G.PENDING
    assert G.judge_state_hash(bare, "h")[0] == G.PENDING
    assert G.judge_no_app_crash(bare, True)[0] == G.PENDING
    assert G.judge_no_app_crash(bare, False)[0] == G.PASS


def test_raw_cgroup_files_are_normalized() -> None:
    v1 = {
        "memory.limit_in_bytes": str(2048 * 1024 * 1024),
        "cpu.cfs_quota_us": "100000",
        "cpu.cfs_period_us": "100000",
        "pids.max": "1024",
        "freezer.state": "THAWED",
    }
    want = {"memory_mib": 2048, "pids_max": 1024, "vcpus": 1.0}
    assert G.judge_cgroup(facts(limits_in_force=v1), want)[0] == G.PASS
    v2 = {"memory.max": "max", "cpu.max": "200000 100000", "pids.max": "max"}
    assert G.normalize_limits(v2) == {"memory_mib": "max", "pids_max": "max", "vcpus": 2.0}
    status, evidence = G.judge_cgroup(facts(limits_in_force=v2), want)
    assert status == G.FAIL and set(evidence["wrong"]) == {"memory_mib", "pids_max", "vcpus"}


def test_exits_of_unnamed_processes_leave_alive_after_resume_pending() -> None:
    status, evidence = G.judge_alive_after_resume(facts(pids=[1, 2]), {"pids": [1, 2, 3]}, [])
    assert status == G.PENDING and evidence["unnamed_exits"] == [3]
    dead = facts(alive=False)
    assert G.judge_alive_after_resume(dead, {"pids": [1]}, [])[0] == G.FAIL


def test_forks_refused_at_pids_max_fail_no_oom_kill() -> None:
    """issue 14, finding 11: only refusals since the episode started count."""
    at = {"oom_kills": 0, "pids_max_hits": 5}
    assert G.judge_no_oom_kill(facts(extra={"pids_max_hits": 5}), at)[0] == G.PASS
    status, evidence = G.judge_no_oom_kill(facts(extra={"pids_max_hits": 9}), at)
    assert status == G.FAIL and evidence["pids_max_hits"] == 4 and "pids.max" in evidence["reason"]
    # A runtime that does not report the counter is judged on OOM kills alone.
    assert G.judge_no_oom_kill(facts(extra={}), at)[0] == G.PASS
    assert G.judge_no_oom_kill(facts(oom_kills=1, extra={}), at)[0] == G.FAIL
