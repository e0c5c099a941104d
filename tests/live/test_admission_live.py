"""Admission counts the real charge of live slots, not a fixed env_mib (real restored desktops)."""

from __future__ import annotations

import time

from harness import poll
from live_daemon import http_client


def _wait_valid(http, slot: str, limit_s: float = 60) -> None:
    def valid() -> bool:
        report = http.get(f"/v1/slots/{slot}/gates").json()
        assert report.get("valid") is not False, report
        return report.get("valid") is True

    poll(f"slot {slot} valid", valid, limit_s)


def test_slot_cost_is_the_live_slots_measured_charge(live_daemon) -> None:
    with http_client(live_daemon) as http:
        env_mib = http.get("/v1/health").json()["admission"]["slot_cost_mib"]
        slots = [http.post("/v1/slots", json={}).json()["id"] for _ in range(2)]
        try:
            for slot in slots:
                _wait_valid(http, slot)
            deadline = time.monotonic() + 30
            while True:
                cost = http.get("/v1/health").json()["admission"]["slot_cost_mib"]
                charged = [http.get(f"/v1/slots/{s}/metrics").json()["memory_mib"] for s in slots]
                if cost < env_mib or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            # An idle xterm desktop is charged tens of MiB, far below the configured 1024.
            assert cost < env_mib, (cost, env_mib, charged)
            assert all(c is not None and 0 < c < env_mib for c in charged), charged
            mean = sum(charged) / len(charged)
            assert abs(cost - mean) < 0.5 * mean, (cost, charged)  # charges move between reads
        finally:
            for slot in slots:
                http.delete(f"/v1/slots/{slot}")
