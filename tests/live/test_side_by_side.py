"""Two real drumsd on one host (issue 17; issue 14 findings 4 and 5, and "two daemons run side by
side through a load test and a kill -9 of one, and neither touches the other"), in one pair of
daemons: their slots get disjoint host uid ranges, cgroups and mounts; a second serve on a running
config refuses and touches nothing; a kill -9 of one mid-load leaves the other's clients seeing
only 200s; the killed one restarted adopts exactly its own slots, with the same uid ranges.

Short by default (DRUMS_LOAD_S, 8 s of load): 2 client threads per daemon, each stepping and
screenshotting its own slot. Set DRUMS_LOAD_S=120 for the longer form.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from live_daemon import http_client, mounts_under, require_live, start_live_daemon, stop_and_clean
from test_escape_hardened import host_view

pytestmark = pytest.mark.live

LOAD_S = float(os.environ.get("DRUMS_LOAD_S", "8"))
CLIENTS = 2  # per daemon, one slot each: four desktops fit a 2-core CI host


def hammer(daemon, sid: str, until: float, seen: Counter, stop: threading.Event) -> None:
    with http_client(daemon, timeout=60) as http:
        while time.monotonic() < until and not stop.is_set():
            try:
                step = http.post(
                    f"/v1/slots/{sid}/step", json={"action": {"type": "wait", "seconds": 0}}
                )
                seen[step.status_code] += 1
                shot = http.get(f"/v1/slots/{sid}/screenshot")
                seen[shot.status_code] += 1
            except httpx.HTTPError as exc:
                seen[type(exc).__name__] += 1
                if stop.is_set():
                    return


def test_two_daemons_side_by_side_under_load_and_a_kill_9_of_one(tmp_path: Path) -> None:
    require_live("base")
    dirs = {name: tmp_path / name for name in ("a", "b")}
    daemons = {name: start_live_daemon(d, spares={"enabled": False}) for name, d in dirs.items()}
    try:
        slots: dict[str, list[str]] = {}
        for name, daemon in daemons.items():
            with http_client(daemon) as http:
                made = [http.post("/v1/slots", json={}) for _ in range(CLIENTS)]
                assert all(r.status_code == 201 for r in made), [r.text for r in made]
                slots[name] = [r.json()["id"] for r in made]
        before = {}
        for name, daemon in daemons.items():
            with http_client(daemon) as http:
                for sid in slots[name]:
                    before[sid] = host_view(http, sid)
        groups = {name: {before[s].pids_cgroup.parent for s in slots[name]} for name in slots}
        assert len(groups["a"]) == len(groups["b"]) == 1 and groups["a"] != groups["b"]

        # A second serve on a's config: refused before it touches a's slots.
        again = subprocess.run(
            [
                sys.executable,
                "-m",
                "drumsd.cli",
                "serve",
                "--config",
                str(dirs["a"] / "drumsd.json"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert again.returncode == 1 and "in use by another drumsd" in again.stderr, again.stderr

        seen = {name: Counter() for name in daemons}
        stop_a = threading.Event()
        never = threading.Event()
        until = time.monotonic() + LOAD_S
        threads = [
            threading.Thread(
                target=hammer,
                args=(daemons[name], sid, until, seen[name], stop_a if name == "a" else never),
            )
            for name in daemons
            for sid in slots[name]
        ]
        for t in threads:
            t.start()
        time.sleep(LOAD_S / 2)
        stop_a.set()
        daemons["a"].kill9()  # mid-load: b's clients must not notice
        for t in threads:
            t.join(timeout=LOAD_S + 120)
        b = seen["b"]
        assert b[200] > 0 and set(b) == {200}, f"b's clients saw {dict(b)}"
        assert not [k for k in seen["a"] if isinstance(k, int) and k >= 500], dict(seen["a"])
        print(f"load {LOAD_S:g}s: a {dict(seen['a'])} (killed halfway), b {dict(b)}")

        # Nothing shared: uid ranges, cgroups and mounts of each daemon's slots are its own.
        daemons["a"].start(limit_s=120)
        views = {}
        for name, daemon in daemons.items():
            with http_client(daemon) as http:
                live = {s["id"] for s in http.get("/v1/slots").json()["slots"]}
                assert live == set(slots[name]), (name, live)
                for sid in slots[name]:
                    views[sid] = (name, host_view(http, sid))
                    # Adopted, not remade: the same host uid range as before the kill.
                    assert views[sid][1].uid_base == before[sid].uid_base, sid
                    step = http.post(
                        f"/v1/slots/{sid}/step", json={"action": {"type": "wait", "seconds": 0}}
                    )
                    assert step.status_code == 200, step.text
        assert len({v.uid_base for _, v in views.values()}) == len(views)
        assert len({v.pids_cgroup for _, v in views.values()}) == len(views)
        for name, view in views.values():
            other = dirs["b" if name == "a" else "a"]
            assert str(view.upper).startswith(str(dirs[name] / "state")), view.upper
            assert not str(view.upper).startswith(str(other))
        mounts = {name: set(mounts_under(d)) for name, d in dirs.items()}
        assert not mounts["a"] & mounts["b"]
    finally:
        for name, daemon in daemons.items():
            stop_and_clean(daemon, dirs[name] / "state", dirs[name] / "journal")
    for d in dirs.values():
        assert mounts_under(d) == []
