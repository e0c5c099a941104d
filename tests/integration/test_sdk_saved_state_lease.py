"""A state saved through the SDK lives as the design says (issue 38): until its lease on the daemon
runs out (its slot's idle timeout, lease.env_idle_timeout_s, unused), not until the client
closes; `save(keep=False)` is the opt-in tie to the client. Against a real `drumsd serve` (memory
runtime) with a short lease."""

from __future__ import annotations

import json
from pathlib import Path

import drums
from drumsd_process import make_daemon
from harness import poll

IDLE_S = 2


def test_a_saved_state_outlives_its_client_until_its_lease_runs_out(tmp_path: Path) -> None:
    d = make_daemon(
        tmp_path,
        # A saved state's idle timeout is its slot's (the env's), else the state default.
        lease={
            "env_idle_timeout_s": IDLE_S,
            "state_idle_timeout_s": IDLE_S,
            "reap_interval_s": 0.5,
        },
        forgotten_dir=str(tmp_path / "forgotten"),
    ).start()
    try:
        with drums.connect(d.url, token=d.token) as client:
            env = client.create()
            leased = env.save()
            tied = env.save(keep=False)
        with d.client() as http:
            states = {c["id"] for c in http.get("/v1/checkpoints").json()["checkpoints"]}
            assert leased.id in states, "the default save went with its client"
            assert tied.id not in states, "save(keep=False) outlived its client"
            poll(
                f"the reaper deleting {leased.id} after {IDLE_S}s unused",
                lambda: http.get(f"/v1/checkpoints/{leased.id}").status_code == 404,
                IDLE_S + 10,
            )
        (record,) = [
            json.loads(p.read_text())
            for p in (tmp_path / "forgotten" / "states").glob("*.json")
            if leased.id in p.name
        ]
        assert "lease" in record["why"], record
    finally:
        d.stop()
