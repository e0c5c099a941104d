"""Several drumsd on one host (issue 14 finding 4, issue 17): a second `drumsd serve` on a config
whose state dir, journal dir or port another daemon holds refuses before it touches anything."""

from __future__ import annotations

import json
import time
from pathlib import Path

from drumsd_process import base_config, free_port, make_daemon, run_drumsd, write_token


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes: what a second daemon must leave as it was."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".drumsd.lock"
    }


def assert_untouched(before: dict[str, bytes], after: dict[str, bytes]) -> None:
    """Same files with the same bytes, except that the first daemon's own event logs may have
    grown (appended, never rewritten or compacted)."""
    assert set(after) == set(before)
    for name, old in before.items():
        if name.endswith(".jsonl"):
            assert after[name].startswith(old), f"{name} was rewritten"
        else:
            assert after[name] == old, f"{name} changed"


def test_second_daemon_on_the_same_config_refuses_touching_nothing(tmp_path: Path) -> None:
    first = make_daemon(tmp_path).start()
    try:
        with first.client() as c:
            kept = c.post("/v1/slots", json={}).json()["id"]
            gone = c.post("/v1/slots", json={}).json()["id"]
            assert c.delete(f"/v1/slots/{gone}").status_code in (200, 204)
        journal = snapshot(tmp_path / "journal")
        state = snapshot(tmp_path / "state")

        started = time.monotonic()
        second = run_drumsd("serve", "--config", str(first.config_path), timeout=30)
        took = time.monotonic() - started

        assert second.returncode == 1, second.stderr
        assert "in use by another drumsd" in second.stderr
        assert "state_dir" in second.stderr
        assert took < 10, f"the refusal took {took:.1f}s"
        # Nothing reconciled, swept or compacted: the first daemon's files are byte for byte
        # what they were, and its slot still answers.
        assert_untouched(journal, snapshot(tmp_path / "journal"))
        assert_untouched(state, snapshot(tmp_path / "state"))
        with first.client() as c:
            assert c.get(f"/v1/slots/{kept}").json()["state"] == "ready"
            step = c.post(f"/v1/slots/{kept}/step", json={"action": {"type": "wait", "seconds": 0}})
            assert step.status_code == 200, step.text
    finally:
        first.stop()


def test_own_dirs_but_a_taken_port_refuses_before_reconcile(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    first = make_daemon(tmp_path / "a").start()
    try:
        other = tmp_path / "b"
        other.mkdir()
        write_token(other / "token")
        port = int(first.url.rsplit(":", 1)[1])
        config = base_config(other, port)
        (other / "drumsd.json").write_text(json.dumps(config))
        second = run_drumsd("serve", "--config", str(other / "drumsd.json"), timeout=30)
        assert second.returncode == 1, second.stderr
        assert "cannot listen" in second.stderr and "another drumsd" in second.stderr
        # It stopped before the runtime or the supervisor started: no journal record, no slot
        # dir, no marker.
        assert snapshot(other / "journal") == {}
        assert snapshot(other / "state") == {}
    finally:
        first.stop()


def test_journal_dir_shared_by_two_configs_refuses(tmp_path: Path) -> None:
    first = make_daemon(tmp_path).start()
    try:
        other = tmp_path / "b"
        other.mkdir()
        write_token(other / "token")
        config = base_config(other, free_port(), journal_dir=str(tmp_path / "journal"))
        (other / "drumsd.json").write_text(json.dumps(config))
        second = run_drumsd("serve", "--config", str(other / "drumsd.json"), timeout=30)
        assert second.returncode == 1, second.stderr
        assert "journal_dir" in second.stderr and "in use by another drumsd" in second.stderr
    finally:
        first.stop()
