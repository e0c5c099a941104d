"""kill -9 mid-operation loses no record; restart reconciles. Signals drain, twice stops."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx
from drumsd_process import make_daemon
from harness import poll


def journal_slots(tmp: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (tmp / "journal" / "slots").glob("*.json")}


def post_ignoring_disconnect(url: str, token: str, timeout: float) -> None:
    """A request whose daemon is killed under it: the disconnect is the expected outcome."""
    try:
        httpx.post(url, json={}, timeout=timeout, headers={"Authorization": f"Bearer {token}"})
    except httpx.HTTPError:
        pass


def test_kill9_mid_create_then_restart_reconciles(tmp_path: Path) -> None:
    slow = {"DRUMS_MEMORY_RESTORE_DELAY_S": "0.5"}
    d = make_daemon(tmp_path, env=slow).start()
    with d.client() as c:
        ready = [c.post("/v1/slots", json={}).json()["id"] for _ in range(2)]
        saved = c.post(f"/v1/slots/{ready[0]}/capture").json()["id"]
        c.post(f"/v1/slots/{ready[1]}/step", json={"action": {"type": "done"}})
        c.delete(f"/v1/slots/{ready[1]}")
        # A create in flight: its record is on disk (creating) before the restore answers.
        threading.Thread(
            target=post_ignoring_disconnect, args=(d.url + "/v1/slots", d.token, 5), daemon=True
        ).start()
        poll(
            "a creating record",
            lambda: any(r["status"] == "creating" for r in journal_slots(tmp_path).values()),
            10,
            every_s=0.02,
        )
    d.kill9()
    before = journal_slots(tmp_path)
    (in_flight,) = [sid for sid, r in before.items() if r["status"] == "creating"]

    d.env = {}
    d.start()
    try:
        with d.client() as c:
            assert c.get(f"/v1/slots/{ready[0]}").json()["state"] == "ready"
            assert c.post(f"/v1/slots/{ready[0]}/step", json={"action": "x"}).status_code == 200
            assert c.get(f"/v1/slots/{ready[1]}").json()["error"]["code"] == "env_gone"
            assert c.get(f"/v1/checkpoints/{saved}").status_code == 200
            gone = c.get(f"/v1/slots/{in_flight}")
            assert gone.status_code == 410
            every = {s["id"]: s for s in c.get("/v1/slots", params={"all": "1"}).json()["slots"]}
            assert set(before) <= set(every), "a record was lost"
            assert every[in_flight]["state"] == "destroyed"
            health = c.get("/v1/health").json()
            assert health["pools"]["reconciled"]["down"] == 1
        after = journal_slots(tmp_path)
        assert "down after daemon restart" in after[in_flight]["failure"]
        markers = {p.stem for p in (tmp_path / "state" / "memory-runtime").glob("*.json")}
        assert markers == {ready[0]}, "the runtime side of dead slots was cleaned"
        assert list((tmp_path / "forgotten" / "full").glob(f"*-{in_flight}.tar.zst"))
    finally:
        assert d.stop() == 0


def test_sigterm_drains_an_in_flight_request(tmp_path: Path) -> None:
    d = make_daemon(tmp_path, env={"DRUMS_MEMORY_RESTORE_DELAY_S": "1.0"}).start()
    result: dict = {}

    def create() -> None:
        r = httpx.post(
            d.url + "/v1/slots", json={}, timeout=10, headers={"Authorization": f"Bearer {d.token}"}
        )
        result["status"] = r.status_code

    t = threading.Thread(target=create)
    t.start()
    poll("the create to start", lambda: journal_slots(tmp_path), 10, every_s=0.02)
    started = time.monotonic()
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(timeout=15) == 0
    t.join(5)
    assert result["status"] == 201, "the in-flight create finished during the drain"
    assert time.monotonic() - started < 5 + 3, "stopped within drain_timeout_s"
    (rec,) = journal_slots(tmp_path).values()
    assert rec["status"] == "ready"


def test_second_signal_stops_at_once(tmp_path: Path) -> None:
    d = make_daemon(
        tmp_path, env={"DRUMS_MEMORY_RESTORE_DELAY_S": "20"}, drain_timeout_s=60
    ).start()
    threading.Thread(
        target=post_ignoring_disconnect, args=(d.url + "/v1/slots", d.token, 30), daemon=True
    ).start()
    poll("the create to start", lambda: journal_slots(tmp_path), 10, every_s=0.02)
    d.proc.send_signal(signal.SIGTERM)
    # Not "sleep, then it is still running": wait until it says it drains, then check it is.
    poll("the drain", lambda: "SIGTERM: draining requests" in d.log(), 10, every_s=0.02)
    assert d.proc.poll() is None, "the first signal drains (the create is still running)"
    started = time.monotonic()
    d.proc.send_signal(signal.SIGINT)
    d.proc.wait(timeout=10)
    assert time.monotonic() - started < 5
    (rec,) = journal_slots(tmp_path).values()
    assert rec["status"] in ("creating", "destroyed"), "the record survives for reconcile"
    # The cancelled create discards its slot after the supervisor's nursery closed: that runs
    # inline, not as a RuntimeError ("Nursery is closed to new arrivals") and a 500.
    assert "Traceback" not in d.log(), d.log()
