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
    daemon = start_live_daemon(
        root, spares={"enabled": False}, tasks={"dirs": [str(EXAMPLES)]}, start_limit_s=120
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


def inits_rooted_under(state: Path) -> list[int]:
    """Processes whose root is a slot overlay of this daemon (its desktops' trees)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            root = os.readlink(proc / "root")
        except OSError:
            continue
        if root.startswith(str(state)):
            found.append(int(proc.name))
    return found


def restart_and_check(daemon: Daemon, root: Path, what: str) -> None:
    daemon.start(limit_s=120)
    state = root / "state"
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
    deadline = time.monotonic() + 15
    while inits_rooted_under(state) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert inits_rooted_under(state) == [], f"{what}: desktops outlived their slots"


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
        restart_and_check(daemon, root, f"verify kill {i} at {delay:.2f} s")
