"""Two real drumsd on one host (issue 17; issue 14 findings 4 and 5): their slots get disjoint
host uid ranges, cgroups and mounts; a kill -9 and restart of one adopts only its own slots and
leaves the other's working; a second serve on a running config refuses and touches nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from live_daemon import http_client, mounts_under, require_live, start_live_daemon, stop_and_clean
from test_escape_hardened import host_view

pytestmark = pytest.mark.live


def test_two_daemons_side_by_side(tmp_path: Path) -> None:
    require_live("base")
    dirs = {name: tmp_path / name for name in ("a", "b")}
    # No spares: four desktops are enough on a 2-core CI host.
    daemons = {name: start_live_daemon(d, spares={"enabled": False}) for name, d in dirs.items()}
    try:
        slots: dict[str, list[str]] = {}
        for name, daemon in daemons.items():
            with http_client(daemon) as http:
                made = [http.post("/v1/slots", json={}) for _ in range(2)]
                assert all(r.status_code == 201 for r in made), [r.text for r in made]
                slots[name] = [r.json()["id"] for r in made]
        views = {}
        for name, daemon in daemons.items():
            with http_client(daemon) as http:
                for sid in slots[name]:
                    views[sid] = (name, host_view(http, sid))
        bases = [view.uid_base for _, view in views.values()]
        assert len(set(bases)) == 4, f"host uid ranges overlap: {bases}"
        assert len({view.pids_cgroup for _, view in views.values()}) == 4
        for name, view in views.values():
            # Each slot's root lives under its own daemon's state dir, its cgroup in its group.
            assert str(view.upper).startswith(str(dirs[name] / "state")), view.upper
            other = dirs["b" if name == "a" else "a"] / "state"
            assert not str(view.upper).startswith(str(other))
        groups = {name: {views[s][1].pids_cgroup.parent for s in slots[name]} for name in slots}
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

        # kill -9 of a: b's slots work on; a restarted adopts exactly its own two.
        daemons["a"].kill9()
        with http_client(daemons["b"]) as http:
            for sid in slots["b"]:
                shot = http.get(f"/v1/slots/{sid}/screenshot")
                assert shot.status_code == 200 and shot.content[:4] == b"\x89PNG"
        daemons["a"].start(limit_s=120)
        for name, daemon in daemons.items():
            with http_client(daemon) as http:
                live = {s["id"] for s in http.get("/v1/slots").json()["slots"]}
                assert live == set(slots[name]), (name, live)
        with http_client(daemons["a"]) as http:
            for sid in slots["a"]:
                assert host_view(http, sid).uid_base == views[sid][1].uid_base
        with http_client(daemons["b"]) as http:
            for sid in slots["b"]:
                step = http.post(
                    f"/v1/slots/{sid}/step", json={"action": {"type": "wait", "seconds": 0}}
                )
                assert step.status_code == 200, step.text
    finally:
        for name, daemon in daemons.items():
            stop_and_clean(daemon, dirs[name] / "state", dirs[name] / "journal")
    for d in dirs.values():
        assert mounts_under(d) == []
