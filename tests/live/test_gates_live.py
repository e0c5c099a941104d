"""Validity gates on real restored desktops, through the API: a healthy episode is valid in both
profiles, and each gate that can fail does (app crash, OOM kill, tampered upper layer, extra
mount), making the episode invalid, quarantining the slot and refusing its reward; release then
reset brings the slot back. DRUMS_LIVE=1 (root, CRIU, the base image)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from drums.vocabulary import GATES

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import (
    create,
    destroy,
    execute,
    gates,
    init_pid,
    nsenter_mount_tmpfs,
    settled_gates,
    shared_daemon,
    state_of,
    verify,
)
from harness import poll
from live_daemon import http_client

ALL_GATES = set(GATES)


@pytest.fixture(scope="module")
def hardened():
    return shared_daemon("hardened")


@pytest.fixture(scope="module")
def trusted_small():
    # Trusted profile, and a memory limit small enough for one step to exceed it; a short
    # quiesce.timeout_s so a capture (or a prefork: prefork_quiesce_window_s) of a desktop that
    # keeps moving is refused within seconds.
    return shared_daemon(
        "trusted",
        profile="trusted",
        memory_mib=320,
        quiesce={"timeout_s": 4.0, "window_s": 1.0},
        prefork_quiesce_window_s=1.0,
    )


def _assert_quarantined_no_reward(http, slot_id: str, gate: str) -> None:
    slot = poll(
        f"slot {slot_id} quarantined",
        lambda: (s := http.get(f"/v1/slots/{slot_id}").json())["state"] == "quarantined" and s,
        limit_s=20,
    )
    assert gate in slot["quarantine_reason"], slot
    report = gates(http, slot_id)
    assert report[gate]["status"] == "fail", report[gate]
    assert report["not_quarantined"]["status"] == "fail"
    r = verify(http, slot_id)
    assert r.status_code == 423, r.text
    err = r.json()["error"]
    assert err["code"] == "quarantined" and gate in err["detail"]["failed_gates"], err
    r = http.post(f"/v1/slots/{slot_id}/step", json={"action": {"type": "done"}})
    assert r.status_code == 423 and r.json()["error"]["code"] == "quarantined", r.text


@pytest.mark.parametrize("profile", ["hardened", "trusted"])
def test_healthy_episode_is_valid(profile, request):
    daemon = request.getfixturevalue("hardened" if profile == "hardened" else "trusted_small")
    with http_client(daemon) as http:
        health = http.get("/v1/health").json()
        assert health["crash_watch"]["available"] is True, health["crash_watch"]
        slot = create(http)
        try:
            report = settled_gates(http, slot["id"])
            assert set(report) == ALL_GATES
            failed = {n: g["evidence"] for n, g in report.items() if g["status"] != "pass"}
            assert not failed, failed
            assert report["no_app_crash"]["evidence"]["watched"] is True
            if profile == "hardened":
                assert report["lock_applied"]["evidence"]["lock_applied"] is True
            body = http.get(f"/v1/slots/{slot['id']}/gates").json()
            assert body["valid"] is True
            # A reset starts a new episode that is valid again (state hash of a fresh copy).
            r = http.post(f"/v1/slots/{slot['id']}/reset")
            assert r.status_code == 200, r.text
            report = settled_gates(http, slot["id"])
            assert all(g["status"] == "pass" for g in report.values()), report
        finally:
            destroy(http, slot["id"])


def test_app_crash_mid_episode_quarantines_then_release_and_reset(hardened):
    with http_client(hardened) as http:
        slot = create(http)
        sid = slot["id"]
        try:
            settled_gates(http, sid)
            # xterm runs as the desktop user: the agent's own step can crash it.
            execute(http, sid, "pkill -SEGV -x xterm")
            _assert_quarantined_no_reward(http, sid, "no_app_crash")
            crash = gates(http, sid)["no_app_crash"]["evidence"]["crash_exits"][0]
            assert crash["name"] == "xterm" and crash["signal_name"] == "SIGSEGV", crash

            r = http.post(f"/v1/slots/{sid}/release")
            assert r.status_code == 200, r.text
            r = http.post(f"/v1/slots/{sid}/reset")
            assert r.status_code == 200, r.text
            report = settled_gates(http, sid)
            assert all(g["status"] == "pass" for g in report.values()), report
            assert http.get(f"/v1/slots/{sid}").json()["state"] == "ready"
        finally:
            destroy(http, sid)


def test_extra_mount_fails_mount_table(hardened):
    with http_client(hardened) as http:
        sid = create(http)["id"]
        try:
            settled_gates(http, sid)
            nsenter_mount_tmpfs(init_pid(state_of(hardened), sid), "/mnt")
            _assert_quarantined_no_reward(http, sid, "mount_table")
            evidence = gates(http, sid)["mount_table"]["evidence"]
            assert evidence["unexpected"] == ["/mnt tmpfs"], evidence
        finally:
            destroy(http, sid)


def test_tampered_upper_fails_state_hash(hardened):
    with http_client(hardened) as http:
        source = create(http)["id"]
        try:
            r = http.post(f"/v1/slots/{source}/capture", json={})
            assert r.status_code == 201, r.text
            checkpoint = r.json()
        finally:
            destroy(http, source)
        # The snapshot a restore copies into the slot's upper layer no longer matches the hash
        # recorded when it was dumped.
        upper = state_of(hardened) / "checkpoints" / checkpoint["id"] / "upper"
        (upper / "home" / "user").mkdir(parents=True, exist_ok=True)
        (upper / "home" / "user" / "planted.txt").write_text("not from the dump\n")
        sid = create(http, from_state=checkpoint["id"])["id"]
        try:
            _assert_quarantined_no_reward(http, sid, "state_hash")
            evidence = gates(http, sid)["state_hash"]["evidence"]
            assert evidence["restored"] != evidence["recorded"], evidence
        finally:
            destroy(http, sid)
            http.delete(f"/v1/checkpoints/{checkpoint['id']}")


def test_memory_limit_exceeded_fails_no_oom_kill(trusted_small):
    with http_client(trusted_small) as http:
        sid = create(http)["id"]
        try:
            settled_gates(http, sid)
            out = execute(
                http,
                sid,
                "python3 -c \"b = bytearray(600 * 2**20); b[::4096] = b'x' * len(b[::4096])\"",
            )
            assert out["output"]["returncode"] != 0, out  # the allocating process was killed
            _assert_quarantined_no_reward(http, sid, "no_oom_kill")
            assert gates(http, sid)["no_oom_kill"]["evidence"]["oom_kills"] >= 1
        finally:
            destroy(http, sid)


def test_branch_children_start_valid_episodes(hardened):
    with http_client(hardened) as http:
        parent = create(http)["id"]
        children: list[str] = []
        try:
            execute(http, parent, "echo forked > ~/Desktop/state.txt")
            r = http.post(f"/v1/slots/{parent}/fork", json={"n": 2})
            assert r.status_code == 201, r.text
            children = [c["id"] for c in r.json()["children"]]
            for child in children:
                report = settled_gates(http, child)
                failed = {n: g["evidence"] for n, g in report.items() if g["status"] != "pass"}
                assert not failed, (child, failed)
                # Restored from the prefork, whose recorded hash covers the parent's new file.
                assert (
                    report["state_hash"]["evidence"]["upper_sha256"]
                    != gates(http, parent)["state_hash"]["evidence"]["upper_sha256"]
                )
        finally:
            for sid in [*children, parent]:
                destroy(http, sid)


SPIN = "sh -c 'echo $$ > /tmp/spin.pid; while :; do /bin/true; done' >/dev/null 2>&1 &"


def test_quiescent_and_a_capture_refused_while_a_process_keeps_forking(trusted_small):
    with http_client(trusted_small) as http:
        sid = create(http)["id"]
        try:
            r = http.post(f"/v1/slots/{sid}/quiescent", json={"window_s": 1, "timeout_s": 20})
            assert r.status_code == 200 and r.json()["quiescent"] is True, r.text
            execute(http, sid, SPIN)
            r = http.post(f"/v1/slots/{sid}/quiescent", json={"window_s": 0.5, "timeout_s": 2})
            assert r.status_code == 200 and r.json()["quiescent"] is False, r.text
            r = http.post(f"/v1/slots/{sid}/capture", json={})
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert err["code"] == "not_quiescent" and f"/v1/slots/{sid}/quiescent" in err["message"]
            assert http.get(f"/v1/slots/{sid}").json()["state"] == "ready"
            execute(http, sid, "kill $(cat /tmp/spin.pid)")
            r = http.post(f"/v1/slots/{sid}/capture", json={})  # quiet again: the dump goes
            assert r.status_code == 201, r.text
            http.delete(f"/v1/checkpoints/{r.json()['id']}")
        finally:
            destroy(http, sid)


@pytest.mark.parametrize("window", ["set", "null"])
def test_prefork_waits_its_quiet_window_when_set(window, request):
    """prefork_quiesce_window_s set (trusted_small): a prefork of a slot whose loop keeps
    starting processes is refused with 409 not_quiescent naming them; null (hardened, today's):
    the same prefork dumps the tree as it is."""
    daemon = request.getfixturevalue("trusted_small" if window == "set" else "hardened")
    with http_client(daemon) as http:
        sid = create(http)["id"]
        try:
            execute(http, sid, SPIN)
            r = http.post(f"/v1/slots/{sid}/prefork", json={})
            if window == "null":
                assert r.status_code == 200, r.text
                http.delete(f"/v1/checkpoints/{r.json()['id']}")
                return
            assert r.status_code == 409, r.text
            err = r.json()["error"]
            assert err["code"] == "not_quiescent", err
            assert "prefork_quiesce_window_s=1s" in err["message"], err
            # named whether a sample or the kernel's process events saw the loop move
            assert any(("true(" in m or "sh(" in m) for m in err["detail"]["moving"]), err
            execute(http, sid, "kill $(cat /tmp/spin.pid)")
            r = http.post(f"/v1/slots/{sid}/prefork", json={})  # quiet again: the dump goes
            assert r.status_code == 200, r.text
            http.delete(f"/v1/checkpoints/{r.json()['id']}")
        finally:
            destroy(http, sid)


# A child that lives for microseconds every 0.3 s: a sample of the tree every 50 ms never sees
# it (the tree's shape holds still), only the kernel's fork and exit events do (quiesce.events).
BLINK = (
    "python3 -c 'import os, time\n"
    'open("/tmp/blink.pid", "w").write(str(os.getpid()))\n'
    "while True:\n"
    "    pid = os.fork()\n"
    "    if pid == 0: os._exit(0)\n"
    "    os.waitpid(pid, 0); time.sleep(0.3)' >/dev/null 2>&1 &"
)


def test_a_process_that_forks_between_samples_is_not_quiescent(trusted_small):
    with http_client(trusted_small) as http:
        sid = create(http)["id"]
        try:
            execute(http, sid, BLINK)
            poll(
                "the blinking loop runs",
                lambda: execute(http, sid, "cat /tmp/blink.pid")["output"]["returncode"] == 0,
                limit_s=20,
            )
            r = http.post(f"/v1/slots/{sid}/quiescent", json={"window_s": 1, "timeout_s": 4})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["quiescent"] is False, body
            assert any(m.startswith("process events: ") for m in body["moving"]), body
            execute(http, sid, "kill $(cat /tmp/blink.pid)")
            r = http.post(f"/v1/slots/{sid}/quiescent", json={"window_s": 1, "timeout_s": 20})
            assert r.status_code == 200 and r.json()["quiescent"] is True, r.text
        finally:
            destroy(http, sid)
