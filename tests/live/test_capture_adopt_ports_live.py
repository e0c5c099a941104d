"""A real office desktop (Chromium and Calc running): captures checked against the tree's
processes and threads pass again and again despite the thread pools' churn; adopting a
checkpoint dir made elsewhere is checked (images, the image it came from, the profile) and a
refusal registers nothing; a guest server port and Chromium's DevTools port are reached on the
host at port_base + N, closed on destroy. DRUMS_LIVE=1 (root, CRIU, the office image)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from drumsd.linux import procfs
from live_daemon import Daemon, http_client

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import (
    OFFICE_DEVTOOLS,
    OFFICE_GUEST_PORT,
    OFFICE_PORT_BASE,
    create,
    destroy,
    execute,
    init_pid,
    office_daemon,
    state_dir_of,
)
from harness import poll

PORT_BASE = OFFICE_PORT_BASE  # slot N's guest_port on 43000+N, DevTools (1337) on 43200+N
GUEST_PORT = OFFICE_GUEST_PORT
DEVTOOLS = OFFICE_DEVTOOLS


@pytest.fixture(scope="module")
def office() -> tuple[Daemon, Path]:
    daemon = office_daemon()  # the session's office daemon, slots numbered and ports forwarded
    return daemon, state_dir_of("office")


def start_apps(http: httpx.Client, sid: str) -> None:
    execute(http, sid, "sh -c 'google-chrome about:blank' >/dev/null 2>&1 &")
    execute(http, sid, "sh -c 'libreoffice --calc' >/dev/null 2>&1 &")

    def running() -> bool:
        out = execute(http, sid, "pgrep -c chromium; pgrep -c soffice.bin")["output"]
        counts = [int(x) for x in (out or {}).get("stdout", "").split() if x.isdigit()]
        return len(counts) == 2 and counts[0] >= 3 and counts[1] >= 1

    # running, not necessarily drawn: the capture waits for a quiet tree itself
    poll(f"slot {sid}: Chromium and Calc running", running, limit_s=120, every_s=1.0)


def slot_sample(state: Path, sid: str) -> tuple[int, int, float]:
    """(processes, threads, seconds) of one sample of the slot's tree as the dump check takes it."""
    init = init_pid(state, sid)
    pidns = procfs.namespaces(init)["pid"]
    # untimed: the daemon reads its cgroup's pids instead of scanning /proc
    hosts = [p for p in (int(x) for x in os.listdir("/proc") if x.isdigit()) if _in_ns(p, pidns)]
    t0 = time.perf_counter()
    sample = procfs.in_pid_namespace(hosts, pidns)
    took = time.perf_counter() - t0
    return len(sample), sum(len(p.threads) for p in sample.values()), took


def _in_ns(pid: int, pidns: int) -> bool:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino == pidns
    except OSError:
        return False


def test_an_office_desktop_with_chromium_dumps_with_every_thread(office) -> None:
    daemon, state = office
    with http_client(daemon, timeout=300) as http:
        sid = create(http)["id"]
        try:
            start_apps(http, sid)
            # The apps start their thread pools a moment after their processes (seen: 17
            # processes with 30 threads right after start): wait for the pools to be there.
            seen: list[tuple[int, int, float]] = []

            def pools_up() -> bool:
                seen.append(slot_sample(state, sid))
                return seen[-1][1] > 2 * seen[-1][0]

            poll(f"slot {sid}: the apps' thread pools", pools_up, limit_s=60, every_s=1.0)
            procs, threads, sample_s = seen[-1]
            print(f"slot tree: {procs} processes, {threads} threads; one sample {sample_s:.4f}s")
            dumps = []
            for _ in range(3):
                r = http.post(f"/v1/slots/{sid}/capture", json={})
                assert r.status_code == 201, r.text
                cp = r.json()["id"]
                meta = json.loads((state / "checkpoints" / cp / "meta.json").read_text())
                dumps.append(
                    (meta["processes"], meta["threads"], meta["dump_s"], meta["tree_sample_s"])
                )
                assert http.delete(f"/v1/checkpoints/{cp}").status_code == 200
            print("dumps (processes, threads, dump_s, tree_sample_s):", dumps)
            assert all(t > 2 * p for p, t, _, _ in dumps), dumps
        finally:
            destroy(http, sid)


def _copy(src: Path, dest: Path) -> Path:
    """A checkpoint dir made 'elsewhere': hard links (fast, no space), meta.json its own file."""
    subprocess.run(["cp", "-al", str(src), str(dest)], check=True)
    meta = dest / "meta.json"
    data = meta.read_text()
    meta.unlink()
    meta.write_text(data)
    return dest


def _edit_meta(dest: Path, **fields: Any) -> None:
    meta = json.loads((dest / "meta.json").read_text())
    meta.update(fields)
    (dest / "meta.json").write_text(json.dumps(meta))


def test_adopting_a_checkpoint_dir_is_checked_and_a_refusal_registers_nothing(office) -> None:
    daemon, state = office
    outside = Path(tempfile.mkdtemp(prefix="drums-h-first-adopt-", dir="/run"))
    with http_client(daemon, timeout=300) as http:
        sid = create(http)["id"]
        try:
            r = http.post(f"/v1/slots/{sid}/capture", json={})
            assert r.status_code == 201, r.text
            source = state / "checkpoints" / r.json()["id"]
            tasks = json.loads((source / "meta.json").read_text())
            before = {c["id"] for c in http.get("/v1/checkpoints").json()["checkpoints"]}

            def refused(path: Path, needle: str) -> None:
                r = http.post("/v1/checkpoints", json={"path": str(path)})
                assert r.status_code == 422, r.text
                err = r.json()["error"]
                assert err["code"] == "invalid_request" and needle in err["message"], err
                assert "Nothing was registered" in err["message"]
                now = {c["id"] for c in http.get("/v1/checkpoints").json()["checkpoints"]}
                assert now == before, "a refused adoption registered a checkpoint"

            no_pstree = _copy(source, outside / "no-pstree")
            (no_pstree / "images" / "pstree.img").unlink()
            refused(no_pstree, "images/pstree.img is missing")

            no_core = _copy(source, outside / "no-core")
            core = sorted((no_core / "images").glob("core-*.img"))[-1]
            core.unlink()
            refused(no_core, f"lacks the core-<tid>.img of threads [{core.stem[5:]}]")

            other_image = _copy(source, outside / "other-image")
            _edit_meta(other_image, image_sha256="cd" * 32)
            refused(other_image, "that the dump was made from is not on this host")

            other_profile = _copy(source, outside / "other-profile")
            _edit_meta(other_profile, profile="trusted")
            refused(other_profile, "profile 'trusted', this daemon runs 'hardened'")

            good = _copy(source, outside / "good")
            _edit_meta(good, lower="/elsewhere/images/office/root")  # another host's path
            r = http.post("/v1/checkpoints", json={"path": str(good)})
            assert r.status_code == 201, r.text
            adopted = r.json()["id"]
            assert tasks["processes"] > 1
            child = create(http, from_state=adopted)
            assert child["state"] == "ready", child
            destroy(http, child["id"])
            assert http.delete(f"/v1/checkpoints/{adopted}").status_code == 200
        finally:
            destroy(http, sid)
            shutil.rmtree(outside, ignore_errors=True)


def _get(port: int, path: str) -> httpx.Response | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.HTTPError:
        return None


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return True
    return False


def test_guest_ports_are_reached_on_the_host_and_closed_on_destroy(office) -> None:
    daemon, _ = office
    with http_client(daemon, timeout=300) as http:
        slot = create(http)
        sid, n = slot["id"], slot["number"]
        try:
            assert slot["ports"] == {
                str(GUEST_PORT): PORT_BASE + n,
                str(DEVTOOLS): PORT_BASE + 200 + n,
            }
            assert _refused(GUEST_PORT), "the host's own port must not be what answers"
            execute(
                http,
                sid,
                "sh -c 'cd /tmp && echo forwarded > hello.txt && "
                f"python3 -m http.server {GUEST_PORT} --bind 127.0.0.1' >/dev/null 2>&1 &",
            )
            served = poll(
                "the guest's http.server through the host port",
                lambda: (
                    (r := _get(PORT_BASE + n, "/hello.txt")) is not None
                    and r.status_code == 200
                    and r
                ),
                limit_s=30,
            )
            assert served.text == "forwarded\n"
            execute(http, sid, "sh -c 'google-chrome about:blank' >/dev/null 2>&1 &")
            version = poll(
                "Chromium's DevTools /json/version through the host port",
                lambda: (
                    (r := _get(PORT_BASE + 200 + n, "/json/version")) is not None
                    and r.status_code == 200
                    and r
                ),
                limit_s=90,
                every_s=1.0,
            )
            assert "Browser" in version.json(), version.text
            # a reset is a new tree: the old server is gone, the port is still the slot's
            r = http.post(f"/v1/slots/{sid}/reset")
            assert r.status_code == 200 and r.json()["number"] == n, r.text
            assert _get(PORT_BASE + n, "/hello.txt") is None
            assert not _refused(PORT_BASE + n)
        finally:
            destroy(http, sid)
        poll("the host port closed after destroy", lambda: _refused(PORT_BASE + n), limit_s=10)
