"""A task checkpoint is proven on a restore of itself (a probe), not on its source slot.

CI once quarantined test_osworld_live's gimp_theme-nothing on alive_after_resume: the office
image lets GIMP query its plug-ins at first start, the task checkpoint captured after the first
setup held one (warp) still querying, and it exited moments after every restore. The daemon now
restores a new task checkpoint into a throwaway instance and watches that for the gate's window
(plus a margin) before the checkpoint serves episodes, and drops it when a process it holds
exits there (`ops_task_checkpoints.run_probe`).

The first test's setup launches a shell that keeps running a process (comm `late-exit`) which
sleeps in 0.05 s steps and exits 0.3 s after it sees the wall clock jump by over GAP_S: the
freeze of its slot's dump, or a restore. It starts and ends nothing while it waits, so the
capture's quiet window passes with it running and the dump holds it, as the capture held warp.
On the code before 4414bdc, the second episode restored that checkpoint and was quarantined on
alive_after_resume (`late-exit` exited); now the probe sees it exit, the checkpoint is dropped
(the daemon's log names the slot, the task and the process) and the second episode, arriving
meanwhile, waits for the verdict and replays the setup, valid.

The second test's source episode is destroyed right after its create (as a bench warm-up or an
agent done at once does): the checkpoint is still proven by its probe and the next episode of
the task restores it (`cached`). When the source slot was watched instead, its destroy left the
checkpoint unproven and dropped, and every following episode replayed the setup.
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


def _task(launch: list[str] = LAUNCH, name: str = "held-exit") -> dict[str, object]:
    return {
        # Its own id per run: a task checkpoint of an earlier run's would be another key anyway
        # (a new daemon), but the log lines are found by it.
        "id": f"{name}-{int(time.time())}",
        "snapshot": "os",
        "instruction": "Nothing to do.",
        "source": "drums tests",
        "config": [{"type": "launch", "parameters": {"command": launch}}],
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
            # Arriving while the new checkpoint is probed: waits for the verdict, replays.
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
    # The probe saw it: the checkpoint held late-exit (else it would have been kept and the
    # second episode cached), and the log says which slot, task and process.
    dropped = [
        line for line in daemon.log().splitlines() if "dropped" in line and task["id"] in line
    ]
    print("\n".join(dropped))
    assert len(dropped) == 1, dropped
    assert "late-exit" in dropped[0] and first["id"] in dropped[0], dropped


def test_a_source_destroyed_right_after_its_create_leaves_the_checkpoint_to_its_probe() -> None:
    daemon = office_daemon()
    task = _task(["sleep", "100000"], name="short-source")
    with http_client(daemon) as http:
        slots: list[str] = []
        try:
            first = create(http, task=task)  # replays the setup, captures the checkpoint
            slots.append(first["id"])
            destroy(http, first["id"])  # the episode ends before the gate's window
            second = create(http, task=task)  # waits for the probe's verdict
            slots.append(second["id"])
            assert first["task_setup"] == "replayed", first
            assert second["task_setup"] == "cached", second
            report = settled_gates(http, second["id"])
            assert report["alive_after_resume"]["status"] == "pass", report
            body = http.get("/v1/checkpoints").json()
            kept = [c for c in body["checkpoints"] if c.get("task_id") == task["id"]]
            assert [c["id"] for c in kept] == [second["checkpoint"]], kept
        finally:
            for slot in slots:
                destroy(http, slot)
    lines = [line for line in daemon.log().splitlines() if task["id"] in line]
    print("\n".join(lines))
    assert not [line for line in lines if "dropped" in line], lines
    assert [line for line in lines if "ready" in line and "probe" in line], lines
