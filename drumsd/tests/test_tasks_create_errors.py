"""A create with a bad task is a 4xx naming what is wrong, and never leaves a slot behind
(issue 14, finding 3). The API in process over the in-memory runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
from drumsd.tasks.bridge import TaskBridge
from drumsd.tasks.host_support import sum_of_sleeps
from drumsd.tasks.model import Task, TaskContext
from harness import error_of, open_api


def _with_bridge(api) -> None:
    """The real task bridge over the in-memory runtime (serve.py wires it the same way)."""
    api.sup.tasks = TaskBridge(TaskContext(), api.runtime)


def _task(config: list[dict]) -> dict:
    return {
        "id": "bad-steps",
        "instruction": "x",
        "config": config,
        "evaluator": {"func": "infeasible"},
    }


async def _live_slots(api) -> list[dict]:
    r = await api.client.get("/v1/slots")
    assert r.status_code == 200, r.text
    return [s for s in r.json()["slots"] if s["status"] not in ("destroyed", "down")]


@pytest.mark.parametrize(
    ("step", "names"),
    [
        (
            {"type": "execute", "parameters": {"command": 5}},
            "config step 1 (execute): parameter command",
        ),
        ({"type": "upload_file", "parameters": {"files": [{"path": "~/x"}]}}, "files.0.local_path"),
        ({"type": "sleep", "parameters": {"seconds": 1e9}}, "parameter seconds"),
        ({"type": "open", "parameters": {}}, "parameter path"),
    ],
)
async def test_a_malformed_step_is_422_naming_step_and_field(
    tmp_path: Path, step: dict, names: str
) -> None:
    async with open_api(tmp_path) as api:
        _with_bridge(api)
        r = await api.client.post("/v1/slots", json={"task": _task([step])})
        err = error_of(r, 422, "invalid_request")
        assert names in err["message"], err
        assert await _live_slots(api) == []


async def test_a_create_whose_setup_raises_anything_destroys_its_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_api(tmp_path) as api:

        async def broken_load(*_args, **_kwargs):
            raise KeyError("local_path")  # what a setup bug looked like (a 500 and a leaked slot)

        monkeypatch.setattr(api.sup.tasks, "load", broken_load)
        r = await api.client.post("/v1/slots", json={"task": _task([])})
        assert 400 <= r.status_code < 600 and r.status_code != 500, r.text
        assert r.json()["error"]["code"] == "setup_failed", r.text
        assert await _live_slots(api) == []


@pytest.mark.parametrize("where", ["begin_episode", "capture_after_setup"])
async def test_a_create_failing_after_its_restore_leaves_no_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """An error between the restore and the answer (the start gates' reading, the task
    checkpoint's capture) answers an error and destroys the slot the caller never saw
    (an earlier fault suite found two live slots left by creates that had answered errors)."""
    from drumsd.runtime import ops_create

    async with open_api(tmp_path) as api:
        _with_bridge(api)

        calls: list[str] = []

        async def broken(*_args, **_kwargs):
            calls.append(where)
            raise RuntimeError(f"{where} broke")

        monkeypatch.setattr(ops_create, where, broken)
        if where == "capture_after_setup":  # only a create on a cacheable task captures
            plan = type("Plan", (), {"cached": False, "restore": None, "source": None})()

            async def planned(sup, source, task):
                plan.restore = source
                return plan

            monkeypatch.setattr(ops_create, "plan_create", planned)
        r = await api.client.post("/v1/slots", json={"task": _task([])})
        assert r.status_code >= 400, r.text
        assert await _live_slots(api) == []
        assert calls == [where]


def test_task_run_dirs_are_private_to_the_daemon_and_reused_per_slot(tmp_path: Path) -> None:
    """issue 14, finding 10: not /tmp/drums-task-runs shared by every daemon."""
    import stat

    from drumsd.runtime.memory_runtime import MemoryRuntime

    one = TaskBridge(TaskContext(), MemoryRuntime(tmp_path / "a"))
    two = TaskBridge(TaskContext(), MemoryRuntime(tmp_path / "b"))
    try:
        assert one.run_root != two.run_root
        assert one.run_root.name != "drums-task-runs"
        assert stat.S_IMODE(one.run_root.stat().st_mode) == 0o700
        first = one._run_dir("s-1", fresh=True)
        (first / "leftover").write_text("last episode")
        again = one._run_dir("s-1", fresh=True)
        assert again == first and list(again.iterdir()) == []
    finally:
        import shutil

        shutil.rmtree(one.run_root, ignore_errors=True)
        shutil.rmtree(two.run_root, ignore_errors=True)


async def test_sleeps_that_outlast_the_setup_timeout_are_refused_at_create(tmp_path: Path) -> None:
    """issue 14, finding 9: each sleep within its bound, but together longer than setup may
    take: a 422 at create, not a 504 after setup_timeout_s with the slot held."""
    sleep = {"type": "sleep", "parameters": {"seconds": 250}}
    async with open_api(tmp_path) as api:
        api.sup.tasks = TaskBridge(TaskContext(setup_timeout_s=600), api.runtime)
        r = await api.client.post("/v1/slots", json={"task": _task([sleep, sleep, sleep])})
        err = error_of(r, 422, "unsupported_task")
        assert "add up to 750 s" in err["message"] and "setup_timeout_s" in err["message"], err
        assert await _live_slots(api) == []
        # Two of them fit: only the total is refused.
        assert sum_of_sleeps(Task.model_validate(_task([sleep, sleep]))) == 500


async def test_a_destroyed_slots_task_run_dir_is_removed(tmp_path: Path) -> None:
    """issue 14, finding 10: one run dir per episode stayed behind after its slot was gone."""
    async with open_api(tmp_path) as api:
        bridge = TaskBridge(TaskContext(), api.runtime, run_root=tmp_path / "runs")
        api.sup.tasks = bridge
        kept = (await api.client.post("/v1/slots", json={"task": _task([])})).json()["id"]
        gone = (await api.client.post("/v1/slots", json={"task": _task([])})).json()["id"]
        assert (tmp_path / "runs" / gone).is_dir() and (tmp_path / "runs" / kept).is_dir()
        r = await api.client.delete(f"/v1/slots/{gone}")
        assert r.status_code == 200, r.text
        assert not (tmp_path / "runs" / gone).exists()
        assert (tmp_path / "runs" / kept).is_dir()
