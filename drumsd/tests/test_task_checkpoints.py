"""Task checkpoints: the key (every input changes it), which setups may be cached, the LRU cap,
and creates and resets on a task through the API over the in-memory runtime with the real task
bridge (the first setup replays and is captured; later episodes restore it and run no step)."""

from __future__ import annotations

import dataclasses
import os
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from drumsd.core.admission import HostSample
from drumsd.core.records import CheckpointKind, CheckpointRecord
from drumsd.core.seams import CheckpointRef, SaveParent, SlotFacts, SlotHandle, SlotLimits
from drumsd.core.task_checkpoints import (
    PER_EPISODE_STEPS,
    SetupFingerprint,
    find_task_checkpoint,
    held_watch_s,
    judge_held_processes,
    setup_cacheable,
    source_identity,
    task_checkpoint_key,
    task_checkpoints_over_cap,
)
from drumsd.runtime import ops_task_checkpoints
from drumsd.runtime.memory_runtime import MemoryRuntime
from drumsd.tasks.bridge import TaskBridge
from drumsd.tasks.model import Task, TaskContext
from drumsd.tasks.setup_cache import FileHashes, setup_fingerprint
from harness import create, error_of, open_api, wait_for, wait_valid

# ---- the key (pure) --------------------------------------------------------------------------


def _cp(**kw: Any) -> CheckpointRecord:
    base: dict[str, Any] = {
        "id": "tpl-1",
        "kind": CheckpointKind.template,
        "created_at": 1.0,
        "last_used_at": 1.0,
        "dir": "/x",
        "image": "office",
        "image_sha256": "a" * 64,
        "upper_sha256": "b" * 64,
    }
    return CheckpointRecord(**{**base, **kw})


def _fp(**kw: Any) -> SetupFingerprint:
    base: dict[str, Any] = {
        "task_id": "t1",
        "task_json": {"id": "t1", "config": [{"type": "launch", "parameters": {"command": "x"}}]},
        "files": {"/cache/t1/a.xlsx": "1" * 64},
        "context": {"placeholders": {"{SCREEN_WIDTH}": "1920"}, "user_home": "/home/user"},
        "cacheable": True,
    }
    return SetupFingerprint(**{**base, **kw})


BASE_KEY = task_checkpoint_key(source_identity(_cp()), _fp())


@pytest.mark.parametrize(
    ("source", "fp"),
    [
        (_cp(id="tpl-2"), _fp()),  # a rebuilt template
        (_cp(image_sha256="c" * 64), _fp()),  # another image
        (_cp(upper_sha256="d" * 64), _fp()),
        (_cp(kind=CheckpointKind.saved), _fp()),
        (_cp(image="base"), _fp()),
        (_cp(profile="trusted"), _fp()),
        (_cp(), _fp(task_json={"id": "t1", "config": []})),  # the task's JSON
        (_cp(), _fp(files={"/cache/t1/a.xlsx": "2" * 64})),  # a file's bytes
        (_cp(), _fp(files={"/cache/t1/a.xlsx": "1" * 64, "/cache/t1/b": "3" * 64})),
        (_cp(), _fp(files={})),
        (_cp(), _fp(context={"placeholders": {"{SCREEN_WIDTH}": "1280"}})),  # screen size
        (_cp(), _fp(context={"placeholders": {"{SCREEN_WIDTH}": "1920"}, "user_home": "/h"})),
    ],
)
def test_every_input_changes_the_key(source: CheckpointRecord, fp: SetupFingerprint) -> None:
    assert task_checkpoint_key(source_identity(source), fp) != BASE_KEY


def test_the_key_does_not_depend_on_dict_order() -> None:
    fp = _fp()
    shuffled = _fp(task_json=dict(reversed(list(fp.task_json.items()))))
    assert task_checkpoint_key(source_identity(_cp()), shuffled) == BASE_KEY
    assert len(BASE_KEY) == 64


def test_which_setups_may_be_cached() -> None:
    assert setup_cacheable(["execute", "launch", "open", "drums_files"], None) == (True, None)
    ok, why = setup_cacheable(["launch"], False)
    assert not ok and "drums.cache_setup is false" in (why or "")
    ok, why = setup_cacheable(["launch"], None, enabled=False)
    assert not ok and "task_checkpoints.enabled" in (why or "")
    ok, why = setup_cacheable([], None)
    assert not ok and "no setup steps" in (why or "")
    for kind, reason in PER_EPISODE_STEPS.items():
        ok, why = setup_cacheable(["launch", kind], None)
        assert not ok and kind in (why or "") and reason in (why or "")
        # A task that says its setup may be cached overrides the guess by step type.
        assert setup_cacheable(["launch", kind], True) == (True, None)


def test_task_checkpoints_over_the_cap_go_least_recently_used_first() -> None:
    def tk(i: str, used: float, mib: float) -> CheckpointRecord:
        return _cp(id=i, kind=CheckpointKind.task, last_used_at=used, size_mib=mib, ready=True)

    cps = [tk("old", 1, 100), tk("mid", 2, 100), tk("new", 3, 100), _cp(size_mib=500, ready=True)]
    assert task_checkpoints_over_cap(cps, set(), None) == []
    assert task_checkpoints_over_cap(cps, set(), 300) == []
    assert [c.id for c, _ in task_checkpoints_over_cap(cps, set(), 150)] == ["old", "mid"]
    # One a live slot restores is kept (and still counts): the next oldest goes instead.
    doomed = task_checkpoints_over_cap(cps, {"old"}, 150)
    assert [c.id for c, _ in doomed] == ["mid", "new"]
    assert "task_checkpoints.max_mib=150" in doomed[0][1]


def test_find_takes_the_newest_ready_one_under_the_key() -> None:
    a = _cp(id="a", kind=CheckpointKind.task, task_key="k", ready=True, created_at=1)
    b = _cp(id="b", kind=CheckpointKind.task, task_key="k", ready=True, created_at=2)
    unready = _cp(id="c", kind=CheckpointKind.task, task_key="k", ready=False, created_at=3)
    going = _cp(id="d", kind=CheckpointKind.task, task_key="k", ready=True, created_at=4)
    going.delete_when_unused = True
    other = _cp(id="e", kind=CheckpointKind.task, task_key="x", ready=True, created_at=5)
    found = find_task_checkpoint([a, b, unready, going, other], "k")
    assert found is not None and found.id == "b"
    assert find_task_checkpoint([a], "nope") is None


# ---- the fingerprint reads the setup's files -------------------------------------------------


def _task(task_id: str = "tk-files", **extra: Any) -> dict[str, Any]:
    return {
        "id": task_id,
        "instruction": "x",
        "config": [
            {
                "type": "drums_files",
                "parameters": {"files": [{"src": "in.txt", "path": "~/in.txt"}]},
            },
            {
                "type": "execute",
                "parameters": {"command": ["python", "-c", "print(1)"], "stdout": "setup.out"},
            },
        ],
        "evaluator": {"func": "infeasible"},
        **extra,
    }


def _assets(tmp: Path, task_id: str = "tk-files", text: str = "one") -> Path:
    root = tmp / "assets"
    (root / task_id).mkdir(parents=True, exist_ok=True)
    (root / task_id / "in.txt").write_text(text)
    return root


def test_the_fingerprint_follows_the_bytes_of_the_setups_files(tmp_path: Path) -> None:
    ctx = TaskContext(assets_dir=_assets(tmp_path))
    task = Task.model_validate(_task())
    hashes = FileHashes()
    first = setup_fingerprint(task, ctx, hashes)
    assert first.cacheable and list(first.files) == [str(tmp_path / "assets/tk-files/in.txt")]
    assert setup_fingerprint(task, ctx, hashes) == first
    path = tmp_path / "assets/tk-files/in.txt"
    path.write_text("two")
    os.utime(path, ns=(1, 1))  # another mtime: the remembered hash is not reused
    assert setup_fingerprint(task, ctx, hashes).files != first.files
    wider = setup_fingerprint(task, ctx.model_copy(update={"screen_width": 1280}), hashes)
    assert wider.context != first.context


# ---- creates and resets through the API ------------------------------------------------------


class CountingRuntime(MemoryRuntime):
    """The in-memory runtime, counting the commands setup steps run in slots."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execs = 0
        self.captured: list[str] = []  # the checkpoint ids captured, in order

    async def exec_user(self, handle, command, timeout_s):  # type: ignore[no-untyped-def]
        self.execs += 1
        done = await super().exec_user(handle, command, timeout_s)
        return type(done)(done.returncode, f"ran in {handle.slot_id}\n", done.stderr)

    async def capture(
        self,
        handle: SlotHandle,
        checkpoint_id: str,
        dest: Path,
        *,
        parent: SaveParent | None = None,
    ) -> CheckpointRef:
        ref = await super().capture(handle, checkpoint_id, dest, parent=parent)
        self.captured.append(checkpoint_id)
        self.after_capture(handle, checkpoint_id)
        return ref

    def after_capture(self, handle: SlotHandle, checkpoint_id: str) -> None:
        """A test double's hook, once a capture is done (before its probe starts)."""

    async def restore(
        self,
        slot_id: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        warm_upper: bool = True,
    ) -> SlotHandle:
        await self.before_restore(slot_id, checkpoint)
        return await super().restore(slot_id, checkpoint, limits, warm_upper=warm_upper)

    async def before_restore(self, slot_id: str, checkpoint: CheckpointRef) -> None:
        """A test double's hook, before each restore (a probe's included)."""


def _bridge(api, tmp: Path, text: str = "one") -> TaskBridge:  # type: ignore[no-untyped-def]
    bridge = TaskBridge(
        TaskContext(assets_dir=_assets(tmp, text=text)), api.runtime, run_root=tmp / "runs"
    )
    api.sup.tasks = bridge
    return bridge


async def _task_checkpoints(api) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = await api.client.get("/v1/checkpoints")
    assert r.status_code == 200, r.text
    return [c for c in r.json()["checkpoints"] if c["kind"] == "task"]


async def test_a_tasks_first_setup_is_captured_and_later_episodes_restore_it(
    tmp_path: Path,
) -> None:
    async with open_api(tmp_path, runtime_cls=CountingRuntime) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        assert first["task_setup"] == "replayed" and first["task_id"] == "tk-files"
        assert api.runtime.execs == 1
        tcps = await _task_checkpoints(api)
        assert len(tcps) == 1 and tcps[0]["task_id"] == "tk-files"
        assert first["checkpoint"] != tcps[0]["id"]  # this episode ran on the template
        setup_out = (tmp_path / "runs" / first["id"] / "setup.out").read_text()
        assert setup_out == f"ran in {first['id']}\n"

        second = await create(api, task=_task())
        assert second["task_setup"] == "cached" and second["task_id"] == "tk-files"
        assert second["checkpoint"] == tcps[0]["id"]
        assert api.runtime.execs == 1  # no setup step ran
        # The setup's host-side output (a checker may read it) came with the checkpoint.
        assert (tmp_path / "runs" / second["id"] / "setup.out").read_text() == setup_out
        gates = await wait_valid(api, second["id"])
        assert gates["valid"] is True, gates
        state_hash = next(g for g in gates["gates"] if g["name"] == "state_hash")
        assert state_hash["status"] == "pass", state_hash

        r = await api.client.post(f"/v1/slots/{first['id']}/reset")
        assert r.status_code == 200, r.text
        assert r.json()["task_setup"] == "cached" and r.json()["checkpoint"] == tcps[0]["id"]
        assert r.json()["task_id"] == "tk-files" and api.runtime.execs == 1
        assert (tmp_path / "runs" / first["id"] / "setup.out").read_text() == setup_out
        assert len(await _task_checkpoints(api)) == 1
        rec = api.sup.slots[first["id"]]
        assert rec.task_source is not None and api.sup.checkpoints[rec.task_source].kind.value == (
            "template"
        )


async def test_a_changed_asset_is_a_new_setup(tmp_path: Path) -> None:
    async with open_api(tmp_path, runtime_cls=CountingRuntime) as api:
        _bridge(api, tmp_path)
        slot = await create(api, task=_task())
        cached = await create(api, task=_task())  # waits for its probe's verdict: kept
        assert cached["task_setup"] == "cached" and api.runtime.execs == 1
        asset = tmp_path / "assets/tk-files/in.txt"
        asset.write_text("changed")
        os.utime(asset, ns=(5, 5))
        r = await api.client.post(f"/v1/slots/{slot['id']}/reset")
        assert r.json()["task_setup"] == "replayed" and api.runtime.execs == 2
        assert len(await _task_checkpoints(api)) == 2
        again = await create(api, task=_task())
        assert again["task_setup"] == "cached" and api.runtime.execs == 2


@pytest.mark.parametrize("how", ["task_opts_out", "per_episode_step", "daemon_off"])
async def test_setups_that_must_run_per_episode_are_replayed(tmp_path: Path, how: str) -> None:
    task = _task()
    cfg: dict[str, Any] = {}
    if how == "task_opts_out":
        task["drums"] = {"cache_setup": False}
    elif how == "per_episode_step":
        task["config"].append(
            {"type": "update_browse_history", "parameters": {"history": []}},
        )
    else:
        cfg["task_checkpoints"] = {"enabled": False}
    async with open_api(tmp_path, runtime_cls=CountingRuntime, **cfg) as api:
        _bridge(api, tmp_path)
        if how == "per_episode_step":  # the step itself needs a History file in the slot
            (tmp_path / "hist").mkdir()
            api.sup.tasks.ctx = api.sup.tasks.ctx.model_copy(
                update={"cache_dir": tmp_path / "hist"}
            )
            _empty_history(tmp_path / "hist" / "history_empty.sqlite")
        slot = await create(api, task=task)
        assert slot["task_setup"] == "replayed"
        r = await api.client.post(f"/v1/slots/{slot['id']}/reset")
        assert r.status_code == 200, r.text
        assert r.json()["task_setup"] == "replayed" and api.runtime.execs == 2
        assert await _task_checkpoints(api) == []


def _empty_history(path: Path) -> None:
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute(
        "CREATE TABLE urls (id INTEGER PRIMARY KEY, url, title, visit_count,"
        " typed_count, last_visit_time, hidden)"
    )
    conn.execute(
        "CREATE TABLE visits (id INTEGER PRIMARY KEY, url, visit_time, from_visit,"
        " transition, segment_id, visit_duration)"
    )
    conn.commit()
    conn.close()


async def test_a_cache_setup_that_is_not_a_bool_is_refused_naming_it(tmp_path: Path) -> None:
    async with open_api(tmp_path) as api:
        _bridge(api, tmp_path)
        r = await api.client.post("/v1/slots", json={"task": _task(drums={"cache_setup": "no"})})
        err = error_of(r, 422, "invalid_request")
        assert "drums.cache_setup must be true or false" in err["message"], err


async def test_task_checkpoints_past_their_cap_are_reaped(tmp_path: Path) -> None:
    async with open_api(tmp_path, task_checkpoints={"max_mib": 1e-9}) as api:
        _bridge(api, tmp_path)
        slot = await create(api, task=_task())
        assert slot["task_setup"] == "replayed"
        (tcp,) = await _task_checkpoints(api)
        # Captured, made ready after its probe (which this create waits for), then over the
        # cap at once (it is not what a live slot restores): deleted, so this one replays.
        again = await create(api, task=_task())
        assert again["task_setup"] == "replayed"
        assert tcp["id"] not in api.sup.checkpoints


async def test_a_task_checkpoint_named_as_the_state_is_a_cached_episode(tmp_path: Path) -> None:
    async with open_api(tmp_path, runtime_cls=CountingRuntime) as api:
        _bridge(api, tmp_path)
        await create(api, task=_task())
        (tcp,) = await _task_checkpoints(api)
        slot = await create(api, from_state=tcp["id"])
        assert slot["task_setup"] == "cached" and slot["task_id"] == "tk-files"
        r = await api.client.post(f"/v1/slots/{slot['id']}/reset")
        assert r.json()["task_setup"] == "cached" and api.runtime.execs == 1


async def test_a_tree_that_never_goes_quiet_is_not_waited_for_every_episode(
    tmp_path: Path,
) -> None:
    async with open_api(tmp_path, runtime_cls=CountingRuntime, quiesce={"timeout_s": 0.2}) as api:
        _bridge(api, tmp_path)
        api.runtime.quiet = False
        first = await create(api, task=_task())
        assert first["task_setup"] == "replayed" and await _task_checkpoints(api) == []
        waits = [c for c in api.runtime.calls if c[0] == "quiescent"]
        assert waits, "the capture did not wait for a quiet tree"
        second = await create(api, task=_task())
        assert second["task_setup"] == "replayed" and api.runtime.execs == 2
        assert [c for c in api.runtime.calls if c[0] == "quiescent"] == waits  # not tried again


def test_a_snapshots_hash_and_manifest_are_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every episode start of a task checkpoint judged state_hash from a fresh walk and hash of
    its immutable upper snapshot; now once per snapshot directory (inode, mtime)."""
    from drumsd.runtime import gate_evidence as ge

    snap = tmp_path / "cp" / "upper"
    (snap / "home").mkdir(parents=True)
    (snap / "home" / "a.txt").write_text("a")
    reads: list[Path] = []
    real = ge.snapshot_facts
    monkeypatch.setattr(ge, "snapshot_facts", lambda p, v: reads.append(p) or real(p, v))
    evidence = ge.GateEvidence(volatile=())
    first = evidence.snapshot(snap)
    assert evidence.snapshot(snap) == first and reads == [snap]
    assert first is not None and first[0] == ge._tree_sha256(snap)
    live = tmp_path / "live"
    (live / "home").mkdir(parents=True)
    (live / "home" / "a.txt").write_text("a")
    assert ge.state_hash_evidence(live, snap, (), None, first)["upper_sha256"] == first[0]
    (live / "home" / "a.txt").write_text("changed")
    assert ge.state_hash_evidence(live, snap, (), None, first)["upper_diff"]["changed"]
    (snap / "new").write_text("n")  # a rewritten snapshot dir (another mtime) is read again
    os.utime(snap, ns=(7, 7))
    assert evidence.snapshot(snap) != first and len(reads) == 2
    assert evidence.snapshot(tmp_path / "missing") is None


# ---- a new task checkpoint is proven on a probe restore before it serves episodes ------------


def _facts(pids: list[int], names: dict[int, str], alive: bool = True) -> SlotFacts:
    return SlotFacts(
        alive=alive,
        init_identity_ok=alive,
        limits_in_force={},
        mounts=[],
        net_links=[],
        namespaces={},
        oom_kills=0,
        pids=pids,
        extra={"proc_names": {str(p): n for p, n in names.items()}},
    )


HELD = {
    "pids": [1, 50, 51, 60],
    "proc_names": {"1": "init", "50": "gimp-2.10", "51": "warp", "60": "python3"},
    "guest_workers": [60],
}


def test_a_held_process_that_exits_in_the_probe_drops_the_checkpoint() -> None:
    names = {1: "init", 50: "gimp-2.10"}
    verdict = judge_held_processes(HELD, _facts([1, 50], names), [])
    assert not verdict.keep and verdict.retry_later and verdict.exited == ("warp(51)",)
    assert "warp(51)" in verdict.reason and "alive_after_resume" in verdict.reason


def test_a_checkpoint_whose_processes_all_live_on_is_kept() -> None:
    names = {1: "init", 50: "gimp-2.10", 51: "warp", 60: "python3", 70: "sh"}
    verdict = judge_held_processes(HELD, _facts([1, 50, 51, 60, 70], names), [])
    assert verdict.keep, verdict  # a process started after the restore is not held: no matter


def test_the_gates_allowed_exits_do_not_drop_it() -> None:
    # The guest's action worker (restarted by the agent) and a natural exit of the image.
    verdict = judge_held_processes(HELD, _facts([1, 50], {1: "init", 50: "gimp-2.10"}), ["warp"])
    assert verdict.keep, verdict


def test_an_unread_probe_leaves_it_unproven_and_a_dead_one_refused() -> None:
    verdict = judge_held_processes(HELD, None, [])
    assert not verdict.keep and not verdict.retry_later  # tried again at the next episode
    dead = judge_held_processes(HELD, _facts([], {}, alive=False), [])
    assert not dead.keep and dead.retry_later  # its own restore died: the checkpoint's fault


def test_exits_without_names_drop_it() -> None:
    baseline = {"pids": [1, 51], "proc_names": {"1": "init"}, "guest_workers": []}
    verdict = judge_held_processes(baseline, _facts([1], {1: "init"}), [])
    assert not verdict.keep and verdict.retry_later


def test_the_probe_covers_the_gates_window_and_a_margin() -> None:
    assert held_watch_s(0.0) == 0.0
    assert held_watch_s(0.05) == pytest.approx(0.1)
    assert held_watch_s(1.0) == 2.0
    assert held_watch_s(5.0) == 6.0


class LateExitRuntime(CountingRuntime):
    """A setup that leaves a process (`warp`) running when its slot is dumped, which exits by
    itself `lives_s` after each start of it: in the source after the capture, and in every
    restore of a checkpoint captured here (facts list it until then)."""

    lives_s = 0.3  # well after a probe's first read, well before its last (1 s)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exits_at: dict[str, float] = {}
        self.holding: set[str] = set()  # checkpoints captured with warp in them

    def after_capture(self, handle: SlotHandle, checkpoint_id: str) -> None:
        self.exits_at[handle.slot_id] = trio.current_time() + self.lives_s
        self.holding.add(checkpoint_id)

    def _start(self, slot_id: str, checkpoint: CheckpointRef, actions: int = 0) -> SlotHandle:
        handle = super()._start(slot_id, checkpoint, actions)
        if checkpoint.id in self.holding:
            self.exits_at[slot_id] = trio.current_time() + self.lives_s
        else:
            self.exits_at.pop(slot_id, None)
        return handle

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        facts = await super().facts(handle)
        if trio.current_time() >= self.exits_at.get(handle.slot_id, 0.0):
            return facts
        warp = handle.init_pid + 3
        names = {**facts.extra["proc_names"], str(warp): "warp"}
        return dataclasses.replace(
            facts, pids=[*facts.pids, warp], extra={**facts.extra, "proc_names": names}
        )


def _probes(api) -> list[str]:  # type: ignore[no-untyped-def]
    """The slot ids the runtime restored that are no slot of the daemon (probes)."""
    return [s for op, s in api.runtime.calls if op == "restore" and s not in api.sup.slots]


async def test_a_checkpoint_holding_a_process_that_exits_is_dropped_and_not_restored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_api(tmp_path, runtime_cls=LateExitRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        assert first["task_setup"] == "replayed"
        (tcp,) = await _task_checkpoints(api)
        assert not api.sup.checkpoints[tcp["id"]].ready  # being proven: not restored yet
        # An episode arriving meanwhile waits for the verdict: dropped, so it replays.
        second = await create(api, task=_task())
        assert second["task_setup"] == "replayed" and api.runtime.execs == 2
        assert await _task_checkpoints(api) == []
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 1 and first["id"] in dropped[0], dropped
        assert "warp" in dropped[0] and tcp["id"] in dropped[0] and "tk-files" in dropped[0]
        assert "probe" in dropped[0], dropped
        # One probe, restored from the checkpoint and destroyed; no slot of the daemon.
        (probe,) = _probes(api)
        assert ("destroy", probe) in api.runtime.calls and probe not in api.runtime.slots
        # Refused for a while, as a capture that never went quiet: the second did not capture.
        assert len(api.sup.task_capture_refused) == 1
        r = await api.client.post(f"/v1/slots/{first['id']}/reset")
        assert r.status_code == 200 and r.json()["task_setup"] == "replayed", r.text
        for slot in (first, second):
            gates = await wait_valid(api, slot["id"])
            assert gates["valid"] is True, gates
        r = await api.client.get("/v1/slots")
        assert {s["id"] for s in r.json()["slots"]} == {first["id"], second["id"]}


class UnrestorableCaptureRuntime(CountingRuntime):
    """Captures that do not restore (a dump CRIU cannot restore)."""

    async def before_restore(self, slot_id: str, checkpoint: CheckpointRef) -> None:
        if checkpoint.id in self.captured:
            self.fail_next_restore = "criu restore failed: no such file"


async def test_a_probe_that_does_not_restore_drops_the_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_api(tmp_path, runtime_cls=UnrestorableCaptureRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        second = await create(api, task=_task())
        assert second["task_setup"] == "replayed" and api.runtime.execs == 2
        assert await _task_checkpoints(api) == [] and len(api.runtime.captured) == 1
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 1 and first["id"] in dropped[0], dropped
        assert "a probe restore of it failed: criu restore failed" in dropped[0], dropped


class SlowProbeRestoreRuntime(CountingRuntime):
    """A probe's restore (and only it) takes a minute: a host far too loaded."""

    async def before_restore(self, slot_id: str, checkpoint: CheckpointRef) -> None:
        if slot_id.startswith("probe-"):
            await trio.sleep(60)


async def test_a_probe_restore_over_its_bound_drops_it_and_refuses_captures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Capturing again at the next episode would only add a dump and a probe to that load.
    monkeypatch.setattr(ops_task_checkpoints, "PROBE_RESTORE_TIMEOUT_S", 1.0)
    async with open_api(tmp_path, runtime_cls=SlowProbeRestoreRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        await create(api, task=_task())
        second = await create(api, task=_task())  # waits for the verdict: dropped
        assert second["task_setup"] == "replayed" and api.runtime.execs == 2
        assert api.runtime.captures == 1 and await _task_checkpoints(api) == []
        assert len(api.sup.task_capture_refused) == 1
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 1 and "took over 1 s" in dropped[0], dropped
        assert "after 600 s" in dropped[0], dropped


async def test_a_source_destroyed_right_after_its_create_keeps_the_checkpoint(
    tmp_path: Path,
) -> None:
    # A short episode (a bench warm-up, an agent done at once) ends before the gate's window:
    # what its source did says nothing of the checkpoint, which a probe proves.
    async with open_api(tmp_path, runtime_cls=CountingRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        await trio.sleep(0.1)
        r = await api.client.delete(f"/v1/slots/{first['id']}")
        assert r.status_code == 200, r.text
        second = await create(api, task=_task())  # waits for the probe's verdict: kept
        assert second["task_setup"] == "cached" and api.runtime.execs == 1
        (tcp,) = await _task_checkpoints(api)
        assert api.sup.checkpoints[tcp["id"]].ready and second["checkpoint"] == tcp["id"]
        gates = await wait_valid(api, second["id"])
        assert gates["valid"] is True, gates


async def test_a_reset_of_the_source_waits_for_the_probe_and_restores_the_kept_checkpoint(
    tmp_path: Path,
) -> None:
    async with open_api(tmp_path, runtime_cls=CountingRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        (tcp,) = await _task_checkpoints(api)
        assert not api.sup.checkpoints[tcp["id"]].ready
        t0 = trio.current_time()
        r = await api.client.post(f"/v1/slots/{first['id']}/reset")
        assert r.status_code == 200, r.text
        assert r.json()["task_setup"] == "cached" and r.json()["checkpoint"] == tcp["id"]
        assert trio.current_time() - t0 < held_watch_s(0.5) + 0.5
        (tcp,) = await _task_checkpoints(api)
        assert api.sup.checkpoints[tcp["id"]].ready and api.runtime.execs == 1


async def test_a_verify_of_the_source_does_not_wait_for_the_probe(tmp_path: Path) -> None:
    # Its episode is the user's: it waits for its own alive_after_resume (0.5 s), not for the
    # probe (a restore, then 1 s). Its checker may quit apps the checkpoint holds: no matter.
    async with open_api(tmp_path, runtime_cls=CountingRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        (tcp,) = await _task_checkpoints(api)
        assert not api.sup.checkpoints[tcp["id"]].ready
        r = await api.client.post(f"/v1/slots/{first['id']}/verify", json={})
        assert r.status_code == 200 and r.json()["valid"] is True, r.text
        assert not api.sup.checkpoints[tcp["id"]].ready  # answered before the verdict
        r = await api.client.delete(f"/v1/slots/{first['id']}")
        assert r.status_code == 200, r.text
        again = await create(api, task=_task())
        assert again["task_setup"] == "cached" and api.runtime.execs == 1


class FullHost:
    """Admission's samples of a host with room until `fill` (a capture, below) and again after
    `free`: in between, none for a probe (MemAvailable 1,000 MiB, below the 4,096 floor)."""

    def __init__(self) -> None:
        self.available_mib = 20_000.0

    def sample(self, _: Path) -> HostSample:
        return HostSample(time.time(), self.available_mib, 24_000, 0.0, 50_000, 100_000)

    def fill(self, api) -> None:  # type: ignore[no-untyped-def]
        self.available_mib = 1000.0
        api.sup.admission_book.sample = self.sample(Path())  # before the probe asks

    def free(self) -> None:
        self.available_mib = 20_000.0


class FullAfterCaptureRuntime(CountingRuntime):
    """Calls `on_capture` once a capture is done (before its probe starts)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_capture = lambda: None

    def after_capture(self, handle: SlotHandle, checkpoint_id: str) -> None:
        self.on_capture()


def _full_api(tmp_path: Path, host: FullHost) -> open_api:
    return open_api(
        tmp_path,
        runtime_cls=FullAfterCaptureRuntime,
        sampler=host.sample,
        admission={"sample_interval_s": 0.05},
        alive_after_s=0.5,
    )


async def test_a_probe_that_finds_no_room_waits_for_it(tmp_path: Path) -> None:
    host = FullHost()
    async with _full_api(tmp_path, host) as api:
        _bridge(api, tmp_path)
        api.runtime.on_capture = partial(host.fill, api)
        await create(api, task=_task())
        (tcp,) = api.runtime.captured
        await trio.sleep(1.0)  # within the probe's wait for room (PROBE_ROOM_WAIT_S)
        assert tcp in api.sup.checkpoints and not api.sup.checkpoints[tcp].ready
        assert _probes(api) == []
        host.free()
        await wait_for(lambda: api.sup.sample and api.sup.sample.mem_available_mib == 20_000)
        second = await create(api, task=_task())  # waits for the verdict: kept
        assert second["task_setup"] == "cached" and second["checkpoint"] == tcp
        assert api.runtime.execs == 1 and api.runtime.captures == 1 and len(_probes(api)) == 1


async def test_a_checkpoint_deleted_while_its_probe_waits_for_room_is_not_restored(
    tmp_path: Path,
) -> None:
    host = FullHost()
    async with _full_api(tmp_path, host) as api:
        _bridge(api, tmp_path)
        api.runtime.on_capture = partial(host.fill, api)
        await create(api, task=_task())
        (tcp,) = api.runtime.captured
        r = await api.client.delete(f"/v1/checkpoints/{tcp}")
        assert r.status_code == 200, r.text
        host.free()
        await wait_for(lambda: not api.sup.task_checkpoint_probes, what="the probe's end")
        assert _probes(api) == [] and tcp not in api.sup.checkpoints


async def test_a_probe_with_no_room_for_its_whole_wait_drops_it_and_refuses_captures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host at its admission limit: without the refusal, every episode of the task dumped its
    # setup again and probed it, to no end.
    monkeypatch.setattr(ops_task_checkpoints, "PROBE_ROOM_WAIT_S", 1.0)
    host = FullHost()
    async with _full_api(tmp_path, host) as api:
        _bridge(api, tmp_path)
        api.runtime.on_capture = partial(host.fill, api)
        first = await create(api, task=_task())
        (tcp,) = api.runtime.captured
        await wait_for(lambda: tcp not in api.sup.checkpoints, what="the drop")
        host.free()
        await wait_for(lambda: api.sup.sample and api.sup.sample.mem_available_mib == 20_000)
        second = await create(api, task=_task())
        assert second["task_setup"] == "replayed" and api.runtime.execs == 2
        assert api.runtime.captured == [tcp] and await _task_checkpoints(api) == []
        assert _probes(api) == [] and len(api.sup.task_capture_refused) == 1
        dropped = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
        assert len(dropped) == 1, dropped
        for part in (first["id"], "tk-files", tcp, "after 600 s", "no room", "within 1 s"):
            assert part in dropped[0], dropped
        assert "admission.min_available_mib" in dropped[0], dropped


async def test_a_probe_prepares_no_warm_upper(tmp_path: Path) -> None:
    # It is destroyed seconds after its restore: an upper made for its next restore is waste.
    async with open_api(tmp_path, runtime_cls=CountingRuntime, alive_after_s=0.5) as api:
        _bridge(api, tmp_path)
        first = await create(api, task=_task())
        second = await create(api, task=_task())  # waits for the verdict: kept
        assert second["task_setup"] == "cached"
        (probe,) = _probes(api)
        assert api.runtime.warm_upper == {first["id"]: True, probe: False, second["id"]: True}
