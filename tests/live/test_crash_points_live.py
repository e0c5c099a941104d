"""kill -9 of drumsd at a random point of a task-checkpoint capture and of a verify, then a restart:
after its reconcile every checkpoint directory has a record, every slot instance belongs to a
live slot, and no desktop of this daemon outlives its slots once they are destroyed.

An earlier fault suite saw, once in two runs, a task checkpoint's directory left with no record
after a kill -9 during a verify: rare, so CI runs one kill per point (random delay, the seed
printed) and DRUMS_CRASH_LOOP=N runs N per point (opt-in; the issue asked for 20).
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_daemon import Daemon, http_client, start_live_daemon, stop_and_clean

pytestmark = pytest.mark.live

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tasks"
TASK = json.loads((EXAMPLES / "files.json").read_text())["id"]  # an "os" task: the base image
ITERATIONS = int(os.environ.get("DRUMS_CRASH_LOOP", "1"))
SEED = int(os.environ.get("DRUMS_CRASH_SEED", str(int(time.time()))))


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Path]]:
    root = Path(tmp_path_factory.mktemp("crash"))
    # Admission's memory-pressure bound off: a loaded host (PSI some avg10 at 24 under other
    # jobs) refused the loop's creates, which is not what these kills test.
    daemon = start_live_daemon(
        root,
        spares={"enabled": False},
        tasks={"dirs": [str(EXAMPLES)]},
        admission={"max_memory_psi_some_avg10": 100},
        start_limit_s=120,
    )
    try:
        yield daemon, root
    finally:
        stop_and_clean(daemon, root / "state", root / "journal", root / "forgotten")


def in_background(fn: Any) -> threading.Thread:
    def run() -> None:
        try:
            fn()
        except httpx.HTTPError:
            pass  # the daemon died under it: that is the point

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def slot_inits(state: Path) -> dict[int, int]:
    """The inits of this daemon's slot instances (pid -> starttime, from each instance's
    owner.json). Not from /proc/<pid>/root: a slot's processes are in their own mount namespace
    and their root reads "/" from here."""
    found = {}
    for owner in (state / "slots").glob("*/owner.json"):
        init = json.loads(owner.read_text()).get("init")
        if isinstance(init, list) and len(init) == 2:
            found[int(init[0])] = int(init[1])
    return found


def process_state(pid: int, start: int) -> str | None:
    """That process's state letter (R, S, Z, ...), None when it is gone (or the pid reused)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0] if int(fields[19]) == start else None


def wait_while(predicate: Any, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while predicate() and time.monotonic() < deadline:
        time.sleep(0.05)


def restart_and_check(daemon: Daemon, root: Path, what: str, *, had_slot: bool = False) -> None:
    state = root / "state"
    survivors = slot_inits(state)  # the killed daemon's desktops, still running
    if had_slot:  # so the checks below cannot pass by finding nothing
        assert survivors, f"{what}: no slot init found running after the kill (owner.json)"
    daemon.start(limit_s=120)
    with http_client(daemon) as http:
        ids = {c["id"] for c in http.get("/v1/checkpoints").json()["checkpoints"]}
        ckpt_root = state / "checkpoints"
        dirs = {p.name for p in ckpt_root.iterdir() if p.is_dir()} if ckpt_root.is_dir() else set()
        assert dirs <= ids, f"{what}: checkpoint dirs {sorted(dirs - ids)} have no record"
        slots = {s["id"] for s in http.get("/v1/slots").json()["slots"]}
        owners = set()
        for owner in (state / "slots").glob("*/owner.json"):
            owners.add(json.loads(owner.read_text()).get("owner", ""))
        strays = sorted(o for o in owners if o.partition(":")[2] not in slots)
        assert not strays, f"{what}: instances {strays} belong to no live slot ({sorted(slots)})"
        for slot_id in slots:
            http.delete(f"/v1/slots/{slot_id}")

    def states() -> list[str | None]:
        return [process_state(pid, start) for pid, start in survivors.items()]

    wait_while(lambda: any(s not in (None, "Z") for s in states()), 15)
    assert all(s in (None, "Z") for s in states()), f"{what}: desktops outlived their slots"
    # Their inits' parent (the launcher's process) outlived the killed daemon: each is reaped
    # the moment it exits, not whenever pid 1 gets to it (this sandbox's pid 1 reaps every
    # ~1.7 s, measured).
    wait_while(lambda: "Z" in states(), 0.3)
    assert "Z" not in states(), f"{what}: inits of the killed daemon left unreaped"


def forget_task_checkpoints(daemon: Daemon) -> None:
    """So the next create on the task captures its checkpoint anew."""
    with http_client(daemon) as http:
        for cp in http.get("/v1/checkpoints").json()["checkpoints"]:
            if cp["kind"] == "task":
                http.delete(f"/v1/checkpoints/{cp['id']}")


def test_kill9_during_a_task_checkpoint_capture(host: tuple[Daemon, Path]) -> None:
    daemon, root = host
    rng = random.Random(SEED)
    print(f"DRUMS_CRASH_SEED={SEED}")
    for i in range(ITERATIONS):
        forget_task_checkpoints(daemon)
        delay = rng.uniform(0.05, 4.0)
        with http_client(daemon) as http:
            in_background(lambda: http.post("/v1/slots", json={"task": TASK}))
            time.sleep(delay)
            daemon.kill9()
        if i == 0:
            # What a capture killed between its dump and its record leaves, made for certain
            # (the random kill lands in that window rarely): the reconcile must remove it.
            orphan = root / "state" / "checkpoints" / "tk-killed-before-its-record"
            (orphan / "images").mkdir(parents=True)
            (orphan / "images" / "pages-1.img").write_bytes(b"\0" * 4096)
        restart_and_check(daemon, root, f"capture kill {i} at {delay:.2f} s")


def test_kill9_during_a_verify(host: tuple[Daemon, Path]) -> None:
    daemon, root = host
    rng = random.Random(SEED + 1)
    for i in range(ITERATIONS):
        with http_client(daemon) as http:
            made = http.post("/v1/slots", json={"task": TASK})
            assert made.status_code == 201, made.text
            slot = made.json()["id"]
            delay = rng.uniform(0.0, 1.5)
            in_background(lambda s=slot: http.post(f"/v1/slots/{s}/verify", json={}))
            time.sleep(delay)
            daemon.kill9()
        restart_and_check(daemon, root, f"verify kill {i} at {delay:.2f} s", had_slot=True)
