"""A deleted saved state leaves its record in forgotten_dir (a real capture of a real desktop)."""

from __future__ import annotations

import json

from live_daemon import http_client


def test_a_deleted_saved_state_leaves_its_record(live_daemon) -> None:
    with http_client(live_daemon) as http:
        slot = http.post("/v1/slots", json={}).json()["id"]
        try:
            r = http.post(f"/v1/slots/{slot}/capture", json={})
            assert r.status_code == 201, r.text
            state = r.json()["id"]
            size_mib = http.get(f"/v1/checkpoints/{state}").json()["size_mib"]
            assert http.delete(f"/v1/checkpoints/{state}").status_code == 200
        finally:
            http.delete(f"/v1/slots/{slot}")
    found = list((live_daemon.dir / "forgotten" / "states").glob(f"*-{state}.json"))
    assert len(found) == 1, found
    record = json.loads(found[0].read_text())
    assert record["what"] == "saved state deleted" and record["why"] == "api"
    assert record["source_slot"] == slot and record["size_mib"] == size_mib > 0, record
