"""A task checkpoint that holds a process about to exit by itself is dropped, not cached.

CI once quarantined test_osworld_live's gimp_theme-nothing on alive_after_resume: the office
image lets GIMP query its plug-ins at first start, the task checkpoint captured after the first
setup held one (warp) still querying, and it exited moments after every restore. The daemon now
watches a new task checkpoint's source slot for the gate's window (plus a margin) before the
checkpoint serves episodes, and drops it when a process it holds exits there
(`ops_task_checkpoints.watch_held_processes`).

The task's setup launches a shell that keeps running a process (comm `late-exit`) which sleeps
in 0.05 s steps and exits 0.3 s after it sees the wall clock jump by over GAP_S: the freeze of
its slot's dump, or a restore. It starts and ends nothing while it waits, so the capture's quiet
window passes with it running and the dump holds it, as the capture held warp. On the code
before, the second episode restored that checkpoint and was quarantined on alive_after_resume
(`late-exit` exited); now the watch sees it exit in the source slot, drops the checkpoint (the
daemon's log names the slot, the task and the process) and the second episode, arriving during
the watch, waits for the verdict and replays the setup, valid.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, office_daemon, settled_gates
from live_daemon import http_client

# Exits 0.3 s after it sees the wall clock jump by over GAP_S between two of its 0.05 s sleeps:
# a dump's freeze of its slot, or a restore. A shell restarts it whenever it exits, so a stall of
# a loaded host before the dump (an exit the quiet window sees) only delays the capture.
GAP_S = 0.3
LATE_EXIT = f"""\
import ctypes, time
ctypes.CDLL(None).prctl(15, b"late-exit", 0, 0, 0)
last = time.time()
while True:
    time.sleep(0.05)
    now = time.time()
    if now - last > {GAP_S}:
        time.sleep(0.3)
        raise SystemExit(0)
    last = now
"""
LAUNCH = ["sh", "-c", f"while :; do python3 -c '{LATE_EXIT}'; done"]


def _task() -> dict[str, object]:
    return {
        # Its own id per run: a task checkpoint of an earlier run's would be another key anyway
        # (a new daemon), but the log lines are found by it.
        "id": f"held-exit-{int(time.time())}",
        "snapshot": "os",
        "instruction": "Nothing to do.",
        "source": "drums tests",
        "config": [{"type": "launch", "parameters": {"command": LAUNCH}}],
        "related_apps": ["os"],
        "evaluator": {"func": "infeasible"},
    }


def test_a_task_checkpoint_holding_a_process_that_exits_is_dropped() -> None:
    daemon = office_daemon()  # skips (fails under DRUMS_LIVE=1) without CRIU or the image
    task = _task()
    with http_client(daemon) as http:
        slots: list[str] = []
        try:
            first = create(http, task=task)  # replays the setup, captures the checkpoint
            slots.append(first["id"])
            # Arriving while the new checkpoint is watched: waits for the verdict, replays.
            second = create(http, task=task)
            slots.append(second["id"])
            # No episode quarantined (on the code before: the second, restored from the
            # checkpoint, failed alive_after_resume naming late-exit).
            for slot in slots:
                report = settled_gates(http, slot)
                alive = report["alive_after_resume"]
                assert alive["status"] == "pass", (slot, alive)
                record = http.get(f"/v1/slots/{slot}").json()
                assert record["state"] == "ready", record
            assert first["task_setup"] == "replayed", first
            assert second["task_setup"] == "replayed", second
            body = http.get("/v1/checkpoints").json()
            held = [
                c
                for c in body["checkpoints"]
                if c["kind"] == "task" and c.get("task_id") == task["id"]
            ]
            assert held == [], held
        finally:
            for slot in slots:
                destroy(http, slot)
    # The watch saw it: the checkpoint held late-exit (else it would have been kept and the
    # second episode cached), and the log says which slot, task and process.
    dropped = [
        line for line in daemon.log().splitlines() if "dropped" in line and task["id"] in line
    ]
    print("\n".join(dropped))
    assert len(dropped) == 1, dropped
    assert "late-exit" in dropped[0] and first["id"] in dropped[0], dropped
