"""Saves that store what changed (issue 35), on a real desktop through the API: a save after one
document changed stores a fraction of the dump, a desktop restored from it passes every gate
(state_hash among them) and holds the document; a save of that desktop chains on it, and once
its parent is deleted the child still restores. DRUMS_LIVE=1 (root, CRIU, the base image)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from gate_daemons import create, destroy, execute, put_file, settled_gates, shared_daemon, state_of
from live_daemon import http_client, require_live


def _save(http: Any, slot_id: str) -> dict[str, Any]:
    r = http.post(f"/v1/slots/{slot_id}/capture", json={})
    assert r.status_code == 201, r.text
    return r.json()


def _meta(state: Path, checkpoint_id: str) -> dict[str, Any]:
    return json.loads((state / "checkpoints" / checkpoint_id / "meta.json").read_text())


def _full_bytes(state: Path, checkpoint_id: str) -> int:
    """What the save would hold stored whole: its page images as CRIU wrote them, its other
    images and its upper layer's files."""
    d = state / "checkpoints" / checkpoint_id
    delta = _meta(state, checkpoint_id)["delta"]
    others = sum(p.stat().st_size for p in (d / "images").iterdir() if p.is_file())
    return int(delta["pages_bytes"]) + others + int(delta["upper_bytes"])


def _restores_with(http: Any, state_id: str, text: str) -> str:
    slot = create(http, from_state=state_id)
    report = settled_gates(http, slot["id"])
    assert all(g["status"] == "pass" for g in report.values()), report
    out = execute(http, slot["id"], "cat ~/Documents/notes.txt")["output"]
    assert (out.get("stdout") or "").strip() == text
    return str(slot["id"])


def test_a_save_after_one_document_changed_stores_what_changed_and_restores_whole() -> None:
    require_live()
    daemon = shared_daemon("hardened")
    state = state_of(daemon)
    with http_client(daemon) as http:
        first = create(http)
        execute(http, first["id"], put_file("~/Documents/notes.txt", b"draft 1\n"))
        a = _save(http, first["id"])
        destroy(http, first["id"])
        meta = _meta(state, a["id"])
        assert meta["delta"] is not None and meta["delta"]["depth"] == 1, meta
        # stored: what this save alone holds; the API's size_mib says the same
        full = _full_bytes(state, a["id"])
        assert a["size_mib"] * (1 << 20) < 0.3 * full, (a["size_mib"], full, meta["delta"])

        second = _restores_with(http, a["id"], "draft 1")
        execute(http, second, put_file("~/Documents/notes.txt", b"draft 2\n"))
        b = _save(http, second)
        destroy(http, second)
        assert _meta(state, b["id"])["delta"]["depth"] == 2
        assert b["size_mib"] * (1 << 20) < 0.3 * _full_bytes(state, b["id"])

        r = http.delete(f"/v1/checkpoints/{a['id']}")
        assert r.status_code in (200, 204), r.text
        assert not (state / "checkpoints" / a["id"]).exists()
        third = _restores_with(http, b["id"], "draft 2")
        destroy(http, third)
        http.delete(f"/v1/checkpoints/{b['id']}")
