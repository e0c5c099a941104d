"""Journal folding (pure) and the journal on disk (atomic records, fsync'd events)."""

from __future__ import annotations

import json
from pathlib import Path

from drumsd.core.journal import Event, fold, parse_event_lines, snapshot_events
from drumsd.core.records import SlotRecord, SlotStatus
from drumsd.linux.journal_io import Journal


def slot_json(rev: int, status: str = "ready", sid: str = "s-1") -> dict:
    return SlotRecord(
        id=sid, rev=rev, created_at=1, last_used_at=1, checkpoint="c", status=SlotStatus(status)
    ).model_dump(mode="json")


def ev(seq: int, record: dict | None, sid: str = "s-1", kind: str = "slot") -> Event:
    return Event(seq=seq, ts=0, kind=kind, id=sid, event="x", record=record)


def test_highest_rev_wins_between_files_and_events() -> None:
    state = fold([("slot", slot_json(3, "busy"))], [ev(1, slot_json(2)), ev(2, slot_json(4))])
    assert state.slots["s-1"].rev == 4 and state.slots["s-1"].status is SlotStatus.ready
    state = fold([("slot", slot_json(5, "quarantined"))], [ev(1, slot_json(4))])
    assert state.slots["s-1"].status is SlotStatus.quarantined
    assert state.last_seq == 1


def test_delete_event_removes_the_record_even_if_its_file_survived() -> None:
    state = fold(
        [
            (
                "checkpoint",
                {
                    "id": "c",
                    "kind": "saved",
                    "created_at": 1,
                    "last_used_at": 1,
                    "dir": "/d",
                    "rev": 9,
                },
            )
        ],
        [ev(1, None, "c", "checkpoint")],
    )
    assert state.checkpoints == {} and state.deleted_checkpoints == {"c"}


def test_torn_lines_are_skipped_and_counted() -> None:
    good = ev(1, slot_json(1)).model_dump_json()
    events, skipped = parse_event_lines([good, '{"seq": 2, "ts": 0, "kind": "sl', ""])
    assert len(events) == 1 and skipped == 1


def test_journal_round_trip_and_compaction(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.save("slot", slot_json(1, "creating"), "created", 1.0)
    j.save("slot", slot_json(2, "ready"), "ready", 2.0)
    j.save("slot", slot_json(1, "ready", sid="s-2"), "created", 3.0)
    j.delete("slot", "s-2", "forgotten", 4.0)
    assert not (tmp_path / "slots" / "s-2.json").exists()
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(ln)["seq"] for ln in lines] == [1, 2, 3, 4]
    # A kill -9 mid-append leaves a torn tail; a crash mid-write leaves a temp file.
    with open(tmp_path / "events.jsonl", "a") as fh:
        fh.write('{"seq": 5, "kind": "slot", "id": "s-1", "rec')
    (tmp_path / "slots" / ".s-1.json.tmp-1").write_text("{")
    state = Journal(tmp_path).load()
    assert list(state.slots) == ["s-1"] and state.slots["s-1"].rev == 2
    assert state.skipped_lines == 1
    assert not list((tmp_path / "slots").glob(".*"))
    j2 = Journal(tmp_path)
    state = j2.load()
    j2.compact(snapshot_events(state, 5.0))
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["event"] == "snapshot"
    j2.save("slot", slot_json(3, "quarantined"), "quarantined", 6.0)
    assert Journal(tmp_path).load().slots["s-1"].status is SlotStatus.quarantined


def test_record_file_alone_recovers_when_the_event_was_lost(tmp_path: Path) -> None:
    j = Journal(tmp_path)
    j.save("slot", slot_json(1), "created", 1.0)
    (tmp_path / "events.jsonl").write_text("")
    assert "s-1" in Journal(tmp_path).load().slots
