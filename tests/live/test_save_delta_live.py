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
from drumsd.linux.write_track import criu_tracks_writes
from gate_daemons import create, destroy, execute, put_file, settled_gates, shared_daemon, state_of
from live_daemon import CRIU, http_client, require_live


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


def _assert_linked_only_unchanged(state: Path, parent_id: str, child_id: str) -> None:
    """The child's upper: the file its slot never touched is the parent's (hard-linked by the
    post-dump copy); the one it rewrote after the restore, same length and mtime set back, is
    its own, with the new bytes."""
    meta = _meta(state, child_id)
    assert meta["upper_links"] and meta["upper_links"]["files"] >= 1, meta.get("upper_links")
    up = {c: state / "checkpoints" / c / "upper" for c in (parent_id, child_id)}
    found = {
        c: {p.name: p for p in up[c].rglob("*.txt") if p.parent.name == "Documents"} for c in up
    }
    kept = {c: found[c]["kept.txt"].lstat() for c in up}
    notes = {c: found[c]["notes.txt"].lstat() for c in up}
    assert kept[parent_id].st_ino == kept[child_id].st_ino
    assert notes[parent_id].st_ino != notes[child_id].st_ino
    assert notes[parent_id].st_mtime_ns == notes[child_id].st_mtime_ns  # touch -d took
    assert found[child_id]["notes.txt"].read_bytes() == b"draft 2\n"


def _restores_with(http: Any, state_id: str, text: str) -> str:
    slot = create(http, from_state=state_id)
    report = settled_gates(http, slot["id"])
    assert all(g["status"] == "pass" for g in report.values()), report
    out = execute(http, slot["id"], "cat ~/Documents/notes.txt")["output"]
    assert (out.get("stdout") or "").strip() == text
    return str(slot["id"])


def test_a_save_after_one_document_changed_stores_what_changed_and_restores_whole() -> None:
    require_live()
    daemon = shared_daemon("tracked", linux={"track_writes": True})
    state = state_of(daemon)
    with http_client(daemon) as http:
        first = create(http)
        execute(http, first["id"], put_file("~/Documents/notes.txt", b"draft 1\n"))
        execute(http, first["id"], put_file("~/Documents/kept.txt", b"left alone\n"))
        a = _save(http, first["id"])
        destroy(http, first["id"])
        meta = _meta(state, a["id"])
        assert meta["delta"] is not None and meta["delta"]["depth"] == 1, meta
        # drums' CRIU tracked the writes since the restore from the template (a full
        # checkpoint): it wrote those pages only, and the save restores whole all the same
        assert meta["tracked"] is criu_tracks_writes(CRIU), meta
        # stored: what this save alone holds; the API's size_mib says the same
        full = _full_bytes(state, a["id"])
        assert a["size_mib"] * (1 << 20) < 0.3 * full, (a["size_mib"], full, meta["delta"])

        second = _restores_with(http, a["id"], "draft 1")
        # rewritten in place after the restore, same length, its mtime set back: stored anyway
        rewrite = (
            "f=~/Documents/notes.txt; m=$(stat -c %y $f); printf 'draft 2\\n' > $f; "
            'touch -d "$m" $f'
        )
        execute(http, second, rewrite)
        b = _save(http, second)
        destroy(http, second)
        assert _meta(state, b["id"])["delta"]["depth"] == 2
        assert b["size_mib"] * (1 << 20) < 0.3 * _full_bytes(state, b["id"])
        _assert_linked_only_unchanged(state, a["id"], b["id"])

        r = http.delete(f"/v1/checkpoints/{a['id']}")
        assert r.status_code in (200, 204), r.text
        assert not (state / "checkpoints" / a["id"]).exists()
        third = _restores_with(http, b["id"], "draft 2")
        destroy(http, third)
        http.delete(f"/v1/checkpoints/{b['id']}")
