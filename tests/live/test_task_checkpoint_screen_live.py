"""A task checkpoint's restores, and a template's, inherit its encoded screen (issue 35's density
ramp).

Before a task's checkpoint is dumped the supervisor has the slot's guest encode its screen as a
full-size PNG (`ops_fork.encode_screen`, as for a fork's prefork): the dump holds the image with
the X DAMAGE state it was taken at, so a later episode of the task, restored from that checkpoint,
answers its first screenshot from it (`X-Drums-Screenshot-Cached: true`) instead of encoding the
whole screen. Every episode's first step did that encode before: ~95 ms against ~15 ms for the
next steps one at a time, and at 8 busy episodes on 2 vCPUs those first steps were most of the
steps over 300 ms (`drumsd bench episodes --ramp 4,8 --profile`). On the code before, the first
screenshot of the cached episode was encoded (cached false). A template is dumped the same way
(`Booter._encode_screen`), so a slot created without a task answers its first screenshot from the
template's image; on the code before, that screenshot was encoded too.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, shared_daemon
from harness import poll
from live_daemon import http_client

TASK = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "files.json"


def test_a_cached_episode_answers_its_first_screenshot_from_the_checkpoints_image() -> None:
    daemon = shared_daemon("hardened")  # skips (fails under DRUMS_LIVE=1) without CRIU
    task = json.loads(TASK.read_text())
    task["id"] = "screen-" + task["id"]  # a task checkpoint of this test's own
    with http_client(daemon) as http:
        slots: list[str] = []
        try:
            slots.append(create(http, task=task)["id"])  # replays the setup, captures it

            def captured() -> bool:
                body = http.get("/v1/checkpoints").json()
                return any(
                    c["kind"] == "task" and c.get("task_id") == task["id"]
                    for c in body["checkpoints"]
                )

            poll("the task checkpoint captured", captured, 120)
            cached = create(http, task=task)
            slots.append(cached["id"])
            assert cached["task_setup"] == "cached", cached
            shot = http.get(f"/v1/slots/{cached['id']}/screenshot")
            assert shot.status_code == 200, shot.text
            assert shot.headers["X-Drums-Screenshot-Cached"] == "true"
        finally:
            for slot in slots:
                destroy(http, slot)


def test_a_fresh_slot_answers_its_first_screenshot_from_the_templates_image() -> None:
    daemon = shared_daemon("hardened")
    with http_client(daemon) as http:
        slot = create(http)["id"]
        try:
            shot = http.get(f"/v1/slots/{slot}/screenshot")
            assert shot.status_code == 200, shot.text
            assert shot.headers["X-Drums-Screenshot-Cached"] == "true"
        finally:
            destroy(http, slot)
