"""Forgotten records of the three classes: destroyed slots (incl. fork children destroyed with a
gate still pending), deleted saved states and rejected dumps; their caps; the console listing;
and a saved state's lease (deleted after lease.state_idle_timeout_s unused, kept with null)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from drumsd.core.config import Config
from drumsd.core.records import CheckpointKind, CheckpointRecord, SlotRecord
from drumsd.core.retention import (
    GIB,
    Archived,
    checkpoint_gone,
    checkpoint_summary,
    files_to_delete,
    keep_kind,
    slot_outcome,
)
from drumsd.linux.forgotten import scan_forgotten, write_checkpoint_record
from harness import Api, create, error_of, open_api, wait_valid
from test_api_console import console_client, login
from test_capture_bounds import _upper


def cp(**kw) -> CheckpointRecord:
    base = dict(id="st-1", kind=CheckpointKind.saved, created_at=0, last_used_at=0, dir="/x")
    return CheckpointRecord(**{**base, **kw})


def records(api: Api, sub: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in (api.config.forgotten_dir / sub).glob("*.json")]


def test_which_checkpoints_leave_which_record() -> None:
    assert checkpoint_gone(cp(ready=True)) == "state"
    assert checkpoint_gone(cp(kind=CheckpointKind.task, ready=True)) == "state"
    assert checkpoint_gone(cp(ready=False)) == "dump"
    assert checkpoint_gone(cp(kind=CheckpointKind.prefork, ready=False)) == "dump"
    assert checkpoint_gone(cp(kind=CheckpointKind.prefork, ready=True)) is None
    summary = checkpoint_summary(
        cp(ready=True, size_mib=12.5, source_slot="s-1"), "state", "api", 9
    )
    assert summary["what"] == "saved state deleted" and summary["why"] == "api"
    assert (summary["at"], summary["id"], summary["source_slot"], summary["size_mib"]) == (
        9,
        "st-1",
        "s-1",
        12.5,
    )


def test_state_and_dump_records_are_capped_with_the_summaries(tmp_path: Path) -> None:
    for i, gone in enumerate(("state", "dump")):
        summary = checkpoint_summary(cp(id=f"c{i}"), gone, "why", 1_700_000_000 + i)
        write_checkpoint_record(tmp_path, gone, summary)
    found = scan_forgotten(tmp_path)
    assert sorted(Path(f.path).parent.name for f in found) == ["dumps", "states"]
    assert {f.kind for f in found} == {"summary"}
    config = Config.model_validate({"token_file": "/t", "retention": {"summary_max_gib": 1}})
    big = [Archived(f.path, f.kind, GIB, f.mtime) for f in found]
    assert len(files_to_delete(big, config)) == 1  # oldest first, like any summary


def test_a_child_destroyed_with_its_gate_pending_is_a_summary_not_a_failure() -> None:
    pending = SlotRecord(id="s", created_at=0, last_used_at=0, checkpoint="c", verdicts=["pending"])
    assert keep_kind(pending, "failures_full") == "summary"
    assert slot_outcome(pending) == "pending_at_destroy"
    valid = pending.model_copy(update={"verdicts": ["valid"]})
    assert slot_outcome(valid) == "valid"
    invalid = pending.model_copy(update={"verdicts": ["pending", "invalid"]})
    assert keep_kind(invalid, "failures_full") == "full"


async def test_fork_children_destroyed_before_their_alive_gate_leave_summaries(
    tmp_path: Path,
) -> None:
    async with open_api(tmp_path, alive_after_s=600) as api:
        maker = (await create(api))["id"]
        r = await api.client.post(f"/v1/slots/{maker}/fork", json={"n": 2})
        assert r.status_code == 201, r.text
        children = [c["id"] for c in r.json()["children"]]
        for child in children:
            assert (await api.client.delete(f"/v1/slots/{child}")).status_code == 200
        forgotten = api.config.forgotten_dir
        for child in children:
            assert not list((forgotten / "full").glob(f"*-{child}.tar.zst"))
            (path,) = (forgotten / "summary").glob(f"*-{child}.json")
            summary = json.loads(path.read_text())
            assert summary["verdicts"] == ["pending"] and summary["outcome"] == "pending_at_destroy"
            assert "alive_after_resume" in summary["pending_gates"]


async def test_a_deleted_state_leaves_a_record_the_console_lists(api: Api) -> None:
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    state = (await api.client.post(f"/v1/slots/{sid}/capture", json={})).json()["id"]
    size = api.sup.get_checkpoint(state).size_mib
    assert (await api.client.delete(f"/v1/checkpoints/{state}")).status_code == 200
    (record,) = records(api, "states")
    assert record["id"] == state and record["why"] == "api" and record["source_slot"] == sid
    assert record["what"] == "saved state deleted" and record["size_mib"] == size
    async with console_client(api) as c:
        await login(c)
        rows = (await c.get("/console/api/records")).json()["records"]
        (row,) = [r for r in rows if r["slot"] == state]
        assert row["kind"] == "state"
        body = (await c.get(f"/console/api/records/{row['name']}")).json()
        assert body["kind"] == "state" and body["record"]["id"] == state


async def test_a_deleted_states_record_is_written_before_the_state_leaves_the_table(
    api: Api,
) -> None:
    """Once the API answers 404 for a deleted state, its record is in forgotten_dir (a client
    that polls for the 404, then reads the record, must find it)."""
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    state = (await api.client.post(f"/v1/slots/{sid}/capture", json={})).json()["id"]
    seen_at_removal: list[list[dict]] = []

    class Watched(dict):  # the table's checkpoints: note the records when one is removed
        def pop(self, key, *default):
            if key == state:
                seen_at_removal.append(records(api, "states"))
            return super().pop(key, *default)

    api.sup.table.checkpoints = Watched(api.sup.table.checkpoints)
    assert (await api.client.delete(f"/v1/checkpoints/{state}")).status_code == 200
    assert (await api.client.get(f"/v1/checkpoints/{state}")).status_code == 404
    ((record,),) = seen_at_removal
    assert record["id"] == state and record["why"] == "api"


async def test_rejected_dumps_leave_a_record_with_the_reason(api: Api) -> None:
    sid = (await create(api))["id"]
    await wait_valid(api, sid)
    api.runtime.quiet = False
    error_of(await api.client.post(f"/v1/slots/{sid}/capture", json={}), 409, "not_quiescent")
    api.runtime.quiet = True
    api.runtime.fail_captures = api.config.quiesce.max_attempts
    r = await api.client.post(f"/v1/slots/{sid}/capture", json={})
    assert r.status_code >= 500, r.text
    dumps = sorted(records(api, "dumps"), key=lambda d: d["at"])
    assert [d["what"] for d in dumps] == ["dump rejected"] * 2
    assert all(d["source_slot"] == sid and d["kind"] == "saved" for d in dumps)
    assert "not_quiescent" in dumps[0]["why"] or "did not go quiet" in dumps[0]["why"]
    assert "injected" in dumps[1]["why"]
    assert not records(api, "states")


async def test_a_saved_state_unused_for_the_idle_timeout_is_deleted_with_a_record(
    tmp_path: Path,
) -> None:
    """Lease-bound by default (lease.state_idle_timeout_s 1800): restoring from it renews it;
    unused past the timeout it goes, leaving its record."""
    async with open_api(tmp_path) as api:
        assert api.config.lease.state_idle_timeout_s == 1800
        maker = (await create(api))["id"]
        await wait_valid(api, maker)
        state = (await api.client.post(f"/v1/slots/{maker}/capture", json={})).json()["id"]
        assert (await api.client.delete(f"/v1/slots/{maker}")).status_code == 200
        api.clock[0] += 1700
        user = (await create(api, from_state=state))["id"]  # a restore renews it
        assert (await api.client.delete(f"/v1/slots/{user}")).status_code == 200
        api.clock[0] += 1700
        assert state not in (await api.sup.reap_once())["checkpoints"]
        api.clock[0] += 200
        assert state in (await api.sup.reap_once())["checkpoints"]
        error_of(await api.client.get(f"/v1/checkpoints/{state}"), 404, "not_found")
        (record,) = records(api, "states")
        assert record["id"] == state and record["why"].startswith("lease: idle for")


async def test_keep_forever_is_opt_in_with_a_null_state_idle_timeout(tmp_path: Path) -> None:
    lease = {"reap_interval_s": 3600, "state_idle_timeout_s": None, "env_idle_timeout_s": None}
    async with open_api(tmp_path, lease=lease) as api:
        maker = (await create(api))["id"]
        await wait_valid(api, maker)
        state = (await api.client.post(f"/v1/slots/{maker}/capture", json={})).json()["id"]
        assert (await api.client.delete(f"/v1/slots/{maker}")).status_code == 200
        api.clock[0] += 40 * 86400
        assert (await api.sup.reap_once())["checkpoints"] == []
        assert (await api.client.get(f"/v1/checkpoints/{state}")).status_code == 200


async def test_a_capture_refused_for_its_size_leaves_a_dump_record(tmp_path: Path) -> None:
    async with open_api(tmp_path, admission={"capture_max_mib": 2}) as api:
        sid = (await create(api))["id"]
        (_upper(api, sid) / "data.bin").write_bytes(os.urandom(3 << 20))
        error_of(await api.client.post(f"/v1/slots/{sid}/capture", json={}), 409, "conflict")
        (record,) = records(api, "dumps")
        assert record["why"].startswith("refused before dumping") and record["size_mib"] >= 3
        assert "admission.capture_max_mib=2" in record["why"]
