"""The profile is never silent (issue 7): a hardened daemon says "hardened" in /v1/health and in
every gate report (create, reset, fork child); one started with profile "trusted" (config) or
`--trusted-unhardened` (command line) says "trusted" in the same places, and its slots really
are unhardened (identity-mapped ids), so the label matches what runs.

Without DRUMS_LIVE=1 these skip; with it a host that cannot run the runtime is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_daemon import Daemon, http_client, live_config, require_live, start_live_daemon

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from drumsd_process import free_port, write_token

pytestmark = pytest.mark.live


def _episode_reports(http: httpx.Client) -> tuple[list[tuple[str, dict]], list[str]]:
    """Gate reports of a created slot, of the same slot after a reset and of a fork child; and
    the slot's uid_map as its desktop user reads it."""
    r = http.post("/v1/slots", json={})
    assert r.status_code in (200, 201), r.text
    slot = r.json()
    sid = slot["id"]
    children: list[str] = []
    try:
        reports = [("create", slot, http.get(f"/v1/slots/{sid}/gates").json())]
        r = http.post(f"/v1/slots/{sid}/reset")
        assert r.status_code == 200, r.text
        reports.append(("reset", r.json(), http.get(f"/v1/slots/{sid}/gates").json()))
        r = http.post(f"/v1/slots/{sid}/fork", json={"n": 1})
        assert r.status_code in (200, 201), r.text
        child = r.json()["children"][0]
        children.append(child["id"])
        reports.append(("fork", child, http.get(f"/v1/slots/{child['id']}/gates").json()))
        uid_map = http.post(
            f"/v1/slots/{sid}/step",
            json={"action": {"type": "execute", "command": "cat /proc/self/uid_map"}},
        )
        assert uid_map.status_code == 200, uid_map.text
        uid_map_text = uid_map.json()["output"]["stdout"].split()
        return [(what, {"slot": sl, "gates": g}) for what, sl, g in reports], uid_map_text
    finally:
        for cid in children:
            http.delete(f"/v1/slots/{cid}")
        http.delete(f"/v1/slots/{sid}")


def _assert_profile_everywhere(reports: list[tuple[str, dict]], profile: str) -> None:
    for what, body in reports:
        assert body["gates"]["profile"] == profile, f"{what} gate report: {body['gates']}"
        assert body["slot"]["profile"] == profile, f"{what} slot: {body['slot']}"


def test_hardened_daemon_says_so_in_health_and_every_gate_report(live_daemon: Daemon) -> None:
    with http_client(live_daemon) as http:
        assert http.get("/v1/health").json()["profile"] == "hardened"
        reports, uid_map = _episode_reports(http)
    _assert_profile_everywhere(reports, "hardened")
    assert uid_map[0] == "0" and int(uid_map[1]) >= 100_000, f"not a host uid range: {uid_map}"


def _lock_of_every_process(netns: int) -> dict[int, dict[str, str]]:
    """Host view: NoNewPrivs, Seccomp and CapBnd of every process in the slot's netns."""
    out: dict[int, dict[str, str]] = {}
    for d in Path("/proc").iterdir():
        try:
            if not d.name.isdigit() or os.stat(d / "ns" / "net").st_ino != netns:
                continue
            status = (d / "status").read_text()
        except OSError:
            continue  # a short-lived process ended
        fields = dict(ln.split(":\t", 1) for ln in status.splitlines() if ":\t" in ln)
        out[int(d.name)] = {
            k: fields.get(k, "").strip() for k in ("Name", "NoNewPrivs", "Seccomp", "CapBnd")
        }
    return out


def test_hardened_gate_report_confirms_the_lock_truthfully(live_daemon: Daemon) -> None:
    """lock_applied passes in the hardened profile, and only when it is true: every process of
    the slot (init included) runs with no_new_privs, the seccomp filter and an empty bounding
    set. A gate that passed on the uid range alone would let an unlocked slot train."""
    with http_client(live_daemon) as http:
        r = http.post("/v1/slots", json={})
        assert r.status_code in (200, 201), r.text
        sid = r.json()["id"]
        try:
            gates = http.get(f"/v1/slots/{sid}/gates").json()
            netns = next(g for g in gates["gates"] if g["name"] == "netns")["evidence"]["net"]
            procs = _lock_of_every_process(int(netns))
        finally:
            http.delete(f"/v1/slots/{sid}")
    lock = next(g for g in gates["gates"] if g["name"] == "lock_applied")
    assert lock["status"] == "pass", f"lock_applied is {lock['status']}: {lock['evidence']}"
    assert procs, f"no process of slot {sid} found on the host"
    unlocked = {
        pid: f
        for pid, f in procs.items()
        if f["NoNewPrivs"] != "1" or f["Seccomp"] != "2" or int(f["CapBnd"] or "0", 16) != 0
    }
    assert not unlocked, (
        f"lock_applied passed ({lock['evidence']}) but these processes are not locked: "
        f"{dict(list(unlocked.items())[:6])}"
    )


@pytest.fixture(scope="module")
def trusted_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    daemon = start_live_daemon(Path(tmp_path_factory.mktemp("trusted-drumsd")), profile="trusted")
    try:
        yield daemon
    finally:
        daemon.stop(limit_s=60)


def test_trusted_daemon_says_so_in_health_and_every_gate_report(trusted_daemon: Daemon) -> None:
    with http_client(trusted_daemon) as http:
        assert http.get("/v1/health").json()["profile"] == "trusted"
        reports, uid_map = _episode_reports(http)
    _assert_profile_everywhere(reports, "trusted")
    # The label is the truth: ids are identity-mapped, root in the slot is host root.
    assert uid_map == ["0", "0", "4294967295"]


def test_trusted_unhardened_flag_overrides_a_hardened_config(
    tmp_path: Path,
) -> None:
    """`drumsd serve --trusted-unhardened` with a config that says nothing (hardened by default)
    serves the trusted profile and says so in /v1/health."""
    require_live()
    port = free_port()
    token = write_token(tmp_path / "token")
    config = live_config(tmp_path, port)
    assert "profile" not in config
    (tmp_path / "drumsd.json").write_text(json.dumps(config))
    log = open(tmp_path / "drumsd.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "drumsd.cli",
            "serve",
            "--config",
            str(tmp_path / "drumsd.json"),
            "--trusted-unhardened",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        health = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                r = httpx.get(
                    f"{url}/v1/health", timeout=2, headers={"Authorization": f"Bearer {token}"}
                )
                if r.status_code == 200:
                    health = r.json()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        assert health is not None, (tmp_path / "drumsd.log").read_text()[-3000:]
        assert health["profile"] == "trusted", health
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
