"""Resident checkers on a real daemon (tasks.resident_checkers, on by default): verify of an
OSWorld task scores through the worker (/v1/health pools.checkers counts its calls, none on the
fresh-process path), the checker child runs as the unprivileged uid in its scratch dir, a checker
that hangs is killed at the deadline with its helpers, and a worker killed with SIGKILL is replaced
and the next verify works. DRUMS_LIVE=1 (root, CRIU, the base image). It shares the "hardened"
daemon of the OSWorld live tests, so it costs their daemon start once.

The score with the worker against the fresh-process path on the same task in the same run is the
benchmark's: `docs/bench/verify_bench.py` (it asserts they agree)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import (
    create,
    destroy,
    execute,
    final,
    settled_gates,
    shared_daemon,
    timed_verify,
    verify,
)
from harness import poll
from live_daemon import http_client

RENAME = "e0df059f-28a6-4169-924f-b9623e7184cc"
SOLVE_RENAME = "mv ~/Desktop/todo_list_Jan_1 ~/Desktop/todo_list_Jan_2"
NOBODY = 65534


@pytest.fixture(scope="module")
def base():
    return shared_daemon("hardened")


def checkers(http) -> dict:
    return http.get("/v1/health").json()["pools"]["checkers"]


def ready_checkers(http) -> dict:
    return poll("resident checker worker ready", lambda: (c := checkers(http))["ready"] and c, 300)


def probe_task(test_body: str) -> dict:
    """An inline task whose checker runs the agent's test file (OSWorld's own
    check_python_file_by_test_suite imports and runs it in the checker process)."""
    return {
        "id": f"drums-checker-probe-{uuid.uuid4().hex[:8]}",
        "instruction": "write the test file",
        "config": [],
        "related_apps": ["os"],
        "evaluator": {
            "func": "check_python_file_by_test_suite",
            "result": {"type": "vm_file", "path": "/home/user/probe.py", "dest": "probe.py"},
            "expected": {"type": "vm_file", "path": "/home/user/test_probe.py", "dest": "t.py"},
        },
        "_body": test_body,
    }


def run_probe(daemon, test_body: str) -> tuple[dict, float]:
    task = probe_task(test_body)
    body = task.pop("_body")
    write = "printf 'X = 1\\n' > ~/probe.py && cat > ~/test_probe.py <<'PY'\n" + body + "\nPY"
    r, took = timed_verify(daemon, task, [write])
    return r.json(), took


def rename_episode(daemon, solved: bool) -> dict:
    with http_client(daemon) as http:
        sid = create(http, task=RENAME)["id"]
        try:
            if solved:
                assert execute(http, sid, SOLVE_RENAME)["output"]["returncode"] == 0
                final(http, sid, "done")
            settled_gates(http, sid)
            r = verify(http, sid)
            assert r.status_code == 200, r.text
            return r.json()
        finally:
            destroy(http, sid)


def test_verify_scores_through_the_worker(base):
    with http_client(base) as http:
        before = ready_checkers(http)
    assert before["enabled"] is True and before["rss_mib"] > 50, before
    for solved, score in ((True, 1.0), (False, 0.0)):
        result = rename_episode(base, solved)
        assert result["score"] == score and result["checker_error"] is None, result
        assert result["audit"]["second_score"] == score, result
    with http_client(base) as http:
        after = checkers(http)
    assert after["calls"] >= before["calls"] + 4, (before, after)  # first and second run, twice
    assert after["fallback_calls"] == before["fallback_calls"], after
    assert after["pid"] == before["pid"], (before, after)


def test_the_checker_child_runs_unprivileged_in_its_scratch_dir(base):
    body = (
        "import os\n"
        "def test():\n"
        f"    return os.getuid() == {NOBODY} and os.geteuid() == {NOBODY} and os.getgroups() == []"
        " and os.environ['HOME'].startswith('/tmp/drums-check-')"
        " and os.getsid(0) != os.getsid(os.getppid())\n"
    )
    result, _took = run_probe(base, body)
    assert result["score"] == 1.0, result


def test_a_hung_checker_is_killed_at_the_deadline(base):
    mark = Path(f"/tmp/drums-hung-checker-{uuid.uuid4().hex}")
    body = (
        "import os, subprocess, time\n"
        "helper = subprocess.Popen(['sleep', '600'])\n"
        f"open({str(mark)!r}, 'w').write(f'{{os.getpid()}} {{helper.pid}}')\n"
        "time.sleep(600)\n"
        "def test():\n"
        "    return True\n"
    )
    try:
        result, took = run_probe(base, body)
        assert result["score"] is None and "timeout" in (result["checker_error"] or ""), result
        assert took < 10.0 + 15.0, took  # eval_timeout_s of the shared daemon, plus getters
        pids = [int(p) for p in mark.read_text().split()]
        poll("hung checker and its helper gone", lambda: not any(_alive(p) for p in pids), 10)
    finally:
        mark.unlink(missing_ok=True)
    assert rename_episode(base, True)["score"] == 1.0


def test_a_worker_killed_with_sigkill_is_replaced(base):
    with http_client(base) as http:
        first = ready_checkers(http)
        os.kill(first["pid"], 9)
        replaced = poll(
            "a new checker worker",
            lambda: (c := checkers(http))["ready"] and c["pid"] != first["pid"] and c,
            300,
        )
    assert replaced["replaced"] == first["replaced"] + 1, replaced
    assert "SIGKILL" in (replaced["last_error"] or ""), replaced
    result = rename_episode(base, True)
    assert result["score"] == 1.0 and result["checker_error"] is None, result
    with http_client(base) as http:
        assert checkers(http)["fallback_calls"] == first["fallback_calls"]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(") ", 1)[1][0] != "Z"
