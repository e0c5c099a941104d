"""Scenario: an app crashing mid-episode fails a gate, and the slot is quarantined until released.

Needs the Linux runtime (the crash is a real SIGSEGV seen through the kernel's process events).
"""

from __future__ import annotations

from drums_http import DrumsHttp, MachineLike, Subtest, Target, check, plain_subtest


def run(machine: MachineLike, target: Target = Target(), subtest: Subtest = plain_subtest) -> None:
    api = DrumsHttp(machine, target)
    api.wait_healthy()

    with subtest("a healthy slot"):
        slot = api.create_slot()["id"]
        check(api.wait_gates(slot)["valid"] is True, "the fresh slot's gates failed")

    with subtest("an app dies of SIGSEGV: no_app_crash fails, the slot is quarantined"):
        out = api.execute(slot, "pkill -SEGV -x xterm; echo $?")
        check(out["stdout"].strip() == "0", f"no xterm to crash in {slot}: {out!r}")
        state = api.wait_slot_state(slot, "quarantined", timeout_s=60)
        check(bool(state.get("quarantine_reason")), f"no quarantine reason: {state!r}")
        report = api.ok("GET", f"/v1/slots/{slot}/gates")
        check(report["valid"] is False, f"the episode is still valid: {report!r}")
        check("no_app_crash" in report["failed"], f"failed gates: {report['failed']}")

    with subtest("a quarantined slot refuses steps with `quarantined`"):
        reply = api.step(slot, {"type": "key", "key": "a"})
        check(
            400 <= reply.status < 500 and reply.error_code == "quarantined",
            f"a step on a quarantined slot answered {reply.status}: {reply.raw}",
        )

    with subtest("release, then reset: a valid episode again"):
        api.ok("POST", f"/v1/slots/{slot}/release", {})
        api.ok("POST", f"/v1/slots/{slot}/reset", {})
        report = api.wait_gates(slot)
        check(report["valid"] is True, f"gates after release+reset: {report.get('failed')}")
        check(api.slot(slot).body["state"] == "ready", "the slot is not ready after reset")

    with subtest("destroy"):
        api.destroy(slot)
