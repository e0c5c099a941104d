"""Scenario: create a desktop, act on it, see the screen change, reset it back to the checkpoint.

Needs the Linux runtime (a real restored desktop).
"""

from __future__ import annotations

import time

from drums_http import (
    DrumsHttp,
    MachineLike,
    ScenarioFailure,
    Subtest,
    Target,
    check,
    plain_subtest,
)

MARKER = "/tmp/drums-vm-test-marker"


def wait_screen(api: DrumsHttp, slot: str, want: str, sha: str, timeout_s: float = 30.0) -> str:
    """Poll screenshots until the hash is (want="same") or is not (want="different") `sha`."""
    deadline = time.monotonic() + timeout_s
    while True:
        shot = api.screenshot(slot)
        check(shot.status == 200 and shot.is_png, f"screenshot of {slot}: {shot!r}")
        if (shot.sha256 == sha) == (want == "same"):
            return shot.sha256
        if time.monotonic() > deadline:
            raise ScenarioFailure(
                f"screen of {slot} is not {want} from {sha[:12]} after {timeout_s}s"
            )
        time.sleep(0.3)


def run(machine: MachineLike, target: Target = Target(), subtest: Subtest = plain_subtest) -> None:
    api = DrumsHttp(machine, target)
    api.wait_healthy()

    with subtest("create a slot: every gate passes"):
        slot = api.create_slot()
        slot_id = slot["id"]
        report = api.wait_gates(slot_id)
        check(report["valid"] is True, f"gates of a fresh slot failed: {report.get('failed')}")
        first_episode = report["episode"]

    with subtest("screenshot: a 1920x1080 PNG"):
        shot = api.screenshot(slot_id)
        check(shot.status == 200 and shot.is_png, f"screenshot: {shot!r}")
        check(shot.size > 1000, f"screenshot is only {shot.size} bytes")
        original = shot.sha256

    with subtest("step: typing into the xterm changes the screen"):
        for action in (
            {"type": "click", "x": 400, "y": 300},
            {"type": "type", "text": "echo drums-vm-test"},
            {"type": "key", "key": "enter"},
        ):
            reply = api.step(slot_id, action)
            check(reply.status == 200, f"step {action} answered {reply.status}: {reply.raw}")
        wait_screen(api, slot_id, "different", original)

    with subtest("step: execute runs as the desktop user and writes into the slot"):
        out = api.execute(slot_id, f"id -un; echo hello > {MARKER}; cat {MARKER}")
        check(out["returncode"] == 0, f"execute failed: {out!r}")
        check(out["stdout"].split() == ["user", "hello"], f"execute stdout: {out['stdout']!r}")

    with subtest("a malformed action is a 4xx, never a 5xx"):
        reply = api.step(slot_id, {"type": "click", "x": -5})
        check(400 <= reply.status < 500, f"bad action answered {reply.status}: {reply.raw}")

    with subtest("reset: a new episode, the original screen, the marker gone"):
        after = api.ok("POST", f"/v1/slots/{slot_id}/reset", {})
        check(after["episode"] > first_episode, f"reset kept episode {after['episode']}")
        report = api.wait_gates(slot_id)
        check(report["valid"] is True, f"gates after reset failed: {report.get('failed')}")
        wait_screen(api, slot_id, "same", original)
        out = api.execute(slot_id, f"test -e {MARKER}; echo $?")
        check(out["stdout"].strip() == "1", f"{MARKER} survived the reset: {out!r}")

    with subtest("destroy: gone, and later requests say env_gone"):
        api.destroy(slot_id)
        reply = api.slot(slot_id)
        check(
            reply.status == 410 and reply.error_code == "env_gone",
            f"a destroyed slot answered {reply.status}: {reply.raw}",
        )
        check(slot_id not in api.live_slot_ids(), f"{slot_id} still listed after destroy")
