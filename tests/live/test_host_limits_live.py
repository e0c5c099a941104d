"""The kernel limits slots share, on real office desktops through the API of a real daemon.

The daemon raises fs.inotify.max_user_instances (and watches, open files) at start for the slots
it admits; a fork whose restores hit the instance limit answers restore_failed naming the limit
(not `runtime_error: unexpected ...`), without retries; with the limit back, the same fork works.

Opt-in (DRUMS_LIVE_HOST_LIMITS=1; DRUMS_LIVE=1 follows): it lowers a host-wide sysctl for a few
seconds, which would fail restores of any other daemon on the host in that window.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from drumsd.core import host_limits
from drumsd.linux.host_limits import read_sysctl, slot_use
from gate_daemons import create, destroy
from live_daemon import Daemon, http_client, start_live_daemon, stop_and_clean

if os.environ.get("DRUMS_LIVE_HOST_LIMITS") != "1":
    pytest.skip(
        "lowers fs.inotify.max_user_instances host-wide for seconds: opt-in with "
        "DRUMS_LIVE_HOST_LIMITS=1 (with DRUMS_LIVE=1, root, CRIU and the office image)",
        allow_module_level=True,
    )
os.environ.setdefault("DRUMS_LIVE", "1")  # opted in: a missing prerequisite fails

INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


@pytest.fixture(scope="module")
def office() -> Iterator[tuple[Daemon, Path]]:
    state = Path(f"/run/drums-limits-{os.getpid()}")
    state.mkdir(mode=0o755, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="drums-limits-"))
    daemon = start_live_daemon(tmp, image="office", state_dir=str(state), spares={"enabled": False})
    try:
        yield daemon, state
    finally:
        stop_and_clean(daemon, state, tmp)


def slot_pids(state: Path) -> list[int]:
    """Processes in the daemon's cgroup group (named after its state dir): its slots' trees."""
    group = "drums-" + hashlib.sha256(str(state.resolve()).encode()).hexdigest()[:8]
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if f"/{group}/" in Path(f"/proc/{entry}/cgroup").read_text():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def test_a_fork_on_a_lowered_inotify_limit_names_it_and_works_once_raised(office):
    daemon, state = office
    # Raised at start for the slots this host admits (the test host's default is 128).
    assert (read_sysctl(host_limits.INOTIFY_INSTANCES) or 0) >= host_limits.HOST_INOTIFY_INSTANCES
    with http_client(daemon) as http:
        parent = create(http)["id"]
        children: list[str] = []
        try:
            use = slot_use(slot_pids(state))
            print(f"one office slot holds {use}")  # the per-slot budget's measure
            assert use.inotify_instances >= 1, use  # else this test could not fail
            assert use.inotify_instances <= host_limits.SLOT_INOTIFY_INSTANCES, use
            assert use.inotify_watches <= host_limits.SLOT_INOTIFY_WATCHES, use

            # A first fork dumps the prefork (CRIU's own start-up probes inotify too, so the
            # limit is lowered only for the restores that follow).
            r = http.post(f"/v1/slots/{parent}/fork", json={"n": 1})
            assert r.status_code == 201, r.text
            prefork = r.json()["checkpoint"]
            children = [c["id"] for c in r.json()["children"]]
            body = {"n": 2, "prefork": prefork}

            before = INSTANCES.read_text()
            INSTANCES.write_text("1\n")  # root's instances (every slot's) are already past 1
            try:
                r = http.post(f"/v1/slots/{parent}/fork", json=body)
            finally:
                INSTANCES.write_text(before)
            assert r.status_code == 502, r.text
            err = r.json()["error"]
            assert err["code"] == "restore_failed", err
            assert err["detail"]["limit"] == "fs.inotify.max_user_instances", err
            assert "fs.inotify.max_user_instances=1 reached" in err["message"], err
            assert "sysctl -w fs.inotify.max_user_instances" in err["message"], err
            log = daemon.log()
            assert "restore_limit" in log, log[-3000:]
            assert "restore_retry" not in log, log[-3000:]  # retrying cannot help

            r = http.post(f"/v1/slots/{parent}/fork", json=body)
            assert r.status_code == 201, r.text
            children += [c["id"] for c in r.json()["children"]]
        finally:
            for sid in [*children, parent]:
                destroy(http, sid)
