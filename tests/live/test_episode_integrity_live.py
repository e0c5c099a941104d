"""What an episode's gates must judge right on real desktops (issue 39): a long first step or a
restart of the guest's worker does not make a normal episode invalid (D8); an X server the desktop
user puts in the original's place does (a forged screen); a fork storm in one slot costs the
daemon little CPU, because the crash watch hears of no exec (D10)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, execute, gates, settled_gates
from harness import poll
from live_daemon import http_client

# The session daemon's (live_daemon.live_config): the tests below step across it.
ALIVE_AFTER_S = 1.0


@pytest.fixture
def daemon(live_daemon):
    return live_daemon


def valid_episode(http, slot: str) -> dict:
    report = settled_gates(http, slot, limit_s=60)
    failed = {name: g["evidence"] for name, g in report.items() if g["status"] != "pass"}
    assert not failed, failed
    r = http.get(f"/v1/slots/{slot}/gates")
    assert r.json()["valid"] is True, r.text
    return report


def test_a_first_step_longer_than_the_alive_window_keeps_the_episode_valid(daemon):
    # The step holds the slot for longer than alive_after_s and, once that has passed, closes
    # the terminal (an agent may close apps on purpose). alive_after_resume judges the tree at
    # alive_after_s, not after the step: before the fix it waited for the step's lock and saw
    # the terminal gone.
    with http_client(daemon) as http:
        slot = create(http)["id"]
        try:
            started = time.monotonic()
            out = execute(http, slot, f"sleep {ALIVE_AFTER_S + 2}; pkill -x xterm")
            assert out["output"]["returncode"] == 0, out
            assert time.monotonic() - started > ALIVE_AFTER_S
            report = valid_episode(http, slot)
            assert report["alive_after_resume"]["status"] == "pass"
        finally:
            http.delete(f"/v1/slots/{slot}")


def test_a_step_that_restarts_the_guest_worker_keeps_the_episode_valid(daemon):
    # pyautogui code that ends its worker process: the guest agent starts a new one, its own
    # doing, inside the alive window. Before the fix the old worker's exit failed the gate.
    with http_client(daemon) as http:
        slot = create(http)["id"]
        try:
            r = http.post(f"/v1/slots/{slot}/step", json={"action": "import os; os._exit(3)"})
            assert r.status_code >= 400 and "worker" in r.text, r.text
            ok = http.post(
                f"/v1/slots/{slot}/step", json={"action": {"type": "move", "x": 5, "y": 5}}
            )
            assert ok.status_code == 200, ok.text  # the new worker serves the next step
            report = valid_episode(http, slot)
            assert report["alive_after_resume"]["evidence"].get("worker_restarts"), report
        finally:
            http.delete(f"/v1/slots/{slot}")


# As the desktop user: kill the slot's X server and serve the same display from another one.
REPLACE_X = (
    "pkill -KILL -x Xvfb; sleep 0.5; rm -f /tmp/.X0-lock /tmp/.X11-unix/X0; "
    "(Xvfb :0 -screen 0 1920x1080x24 -nolisten tcp >/dev/null 2>&1 &); "
    "for i in $(seq 50); do [ -S /tmp/.X11-unix/X0 ] && break; sleep 0.1; done; "
    "[ -S /tmp/.X11-unix/X0 ]"
)


def test_an_x_server_replaced_after_the_alive_window_invalidates_the_episode(daemon):
    with http_client(daemon) as http:
        slot = create(http)["id"]
        try:
            valid_episode(http, slot)  # the alive window has passed, every gate too
            out = execute(http, slot, REPLACE_X)
            assert out["output"]["returncode"] == 0, out
            shot = http.get(f"/v1/slots/{slot}/screenshot")  # from the new server, if any
            assert shot.status_code in (200, 409, 502), shot.text
            body = poll(
                "the slot is quarantined",
                lambda: (s := http.get(f"/v1/slots/{slot}").json())["state"] == "quarantined" and s,
                limit_s=10,
            )
            assert "display_server" in body["quarantine_reason"], body
            gate = gates(http, slot)["display_server"]
            assert gate["status"] == "fail", gate
            assert gate["evidence"]["at_start"]["pid"] != gate["evidence"]["now"].get("pid"), gate
            assert "X server" in gate["evidence"]["reason"], gate
            r = http.post(f"/v1/slots/{slot}/verify", json={})
            assert r.status_code == 423, r.text  # no reward from a quarantined episode
            assert "display_server" in r.json()["error"]["detail"]["failed_gates"], r.text
        finally:
            http.delete(f"/v1/slots/{slot}")


# DRUMS_FORK_STORM_S: a longer window for a steadier figure (10 s gave the numbers in the docs).
STORM_S = float(os.environ.get("DRUMS_FORK_STORM_S", "4"))
FORK_STORM = "sh -c 'while :; do /bin/true; done' >/dev/null 2>&1 & echo $! > /tmp/storm.pid"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_fork_storm_in_a_slot_costs_the_daemon_little_cpu(daemon):
    """Prints the daemon's CPU during STORM_S of a fork/exec loop in one slot, and the events the
    crash watch folded. Before the fix the watch heard every fork, exec and comm change on the
    host and read /proc for each exec (0.11 core in the audit); now the kernel sends it forks
    and nonzero exits only."""
    assert daemon.proc is not None
    with http_client(daemon) as http:
        slot = create(http)["id"]
        try:
            valid_episode(http, slot)

            def daemon_core(seconds: float) -> tuple[float, int]:
                """The daemon's CPU (cores) over `seconds`, and the events its watch folded."""
                events0 = http.get("/v1/health").json()["crash_watch"]["events"]
                cpu0, t0 = cpu_seconds(daemon.proc.pid), time.monotonic()
                time.sleep(seconds)
                cpu1, t1 = cpu_seconds(daemon.proc.pid), time.monotonic()
                events1 = http.get("/v1/health").json()["crash_watch"]["events"]
                return (cpu1 - cpu0) / (t1 - t0), events1 - events0

            idle, _ = daemon_core(STORM_S / 2)
            execute(http, slot, FORK_STORM)
            storm, events = daemon_core(STORM_S)
            execute(http, slot, "kill $(cat /tmp/storm.pid)")
            print(
                f"fork storm: daemon {storm:.3f} core over {STORM_S:g} s ({events} events), "
                f"{idle:.3f} core idle before it"
            )
            # Before the fix the watch heard every fork, exec and comm of the loop and read /proc
            # for each exec in a worker thread: 0.11 core in the audit, 0.147 over 10 s here
            # (0.008 after, over 10 s; 0.05 leaves room for a short, noisy window).
            assert storm - idle < 0.05, f"the fork storm cost the daemon {storm - idle:.3f} core"
            report = valid_episode(http, slot)  # /bin/true exits 0: nothing crashed
            assert report["no_app_crash"]["status"] == "pass"
        finally:
            http.delete(f"/v1/slots/{slot}")
