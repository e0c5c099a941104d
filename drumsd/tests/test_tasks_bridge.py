"""The bridge behind the supervisor's TaskCatalog and Verifier seams, over a fake runtime whose
slot is a host directory (the live runtime is proven elsewhere)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from drumsd.core.config import TasksConfig
from drumsd.core.errors import DrumsdError
from drumsd.core.records import SlotRecord
from drumsd.core.seams import CommandResult, RuntimeError_, SlotHandle
from drumsd.runtime.verifier import TaskCatalog, Verifier
from drumsd.tasks.bridge import TaskBridge, context_from_config, lookup_task, parse_wmctrl
from drumsd.tasks.model import TaskContext
from drumsd.tasks.testing import DirSlot, checker_context

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "osworld"


class DirRuntime:
    """Only the SlotRuntime operations the bridge uses, over a DirSlot."""

    def __init__(self, slot: DirSlot) -> None:
        self.slot = slot

    async def exec_user(self, handle: SlotHandle, command: Any, timeout_s: float) -> CommandResult:
        rc, out, err = await self.slot.exec_user(command, timeout_s)
        return CommandResult(rc, out, err)

    async def exec_checker(
        self, handle: SlotHandle, command: Any, timeout_s: float
    ) -> CommandResult:
        rc, out, err = await self.slot.exec_checker(command, timeout_s)
        return CommandResult(rc, out, err)

    async def exec_trusted(self, handle: SlotHandle, command: str, timeout_s: float):
        rc, out, err = await self.slot.exec_trusted(command, timeout_s)
        return CommandResult(rc, out, err)

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes:
        try:
            return await self.slot.read_file(path)
        except FileNotFoundError:
            raise RuntimeError_("not_found", f"{path} does not exist") from None

    async def write_file(self, handle: SlotHandle, path: str, data: bytes, *, user: bool = True):
        await self.slot.write_file(path, data, user)

    async def step(self, handle: SlotHandle, action: Any) -> None:
        await self.slot.step(dict(action))

    async def screenshot(self, handle: SlotHandle) -> bytes:
        return await self.slot.screenshot()


@pytest.fixture(scope="session")
def venv_ctx() -> TaskContext:
    return checker_context()


def record(task: dict | None = None, terminal: str | None = None) -> SlotRecord:
    now = time.time()
    return SlotRecord(
        id="s1", created_at=now, last_used_at=now, checkpoint="cp", task=task, terminal=terminal
    )


def handle(tmp_path: Path) -> SlotHandle:
    return SlotHandle("s1", 1, 1, tmp_path / "root", tmp_path / "upper", "cp")


def test_bridge_fits_the_supervisor_seams(venv_ctx: TaskContext, tmp_path: Path) -> None:
    bridge = TaskBridge(venv_ctx, DirRuntime(DirSlot(tmp_path)))  # type: ignore[arg-type]
    assert isinstance(bridge, TaskCatalog) and isinstance(bridge, Verifier)


@pytest.mark.integration  # runs the checker program in the real checker venv
async def test_load_then_verify_e0df059f(venv_ctx: TaskContext, tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    ctx = venv_ctx.model_copy(update={"user_home": str(slot.home), "task_dirs": [SHARED]})
    bridge = TaskBridge(ctx, DirRuntime(slot), run_root=tmp_path / "runs")  # type: ignore[arg-type]
    rec = record()
    info, task_json = await bridge.load(
        rec, handle(tmp_path), "e0df059f-28a6-4169-924f-b9623e7184cc"
    )
    assert info.supported and info.domain == "os"
    assert (slot.home / "Desktop" / "todo_list_Jan_1").is_dir()
    rec = record(task=task_json, terminal="done")
    before = await bridge.verify(rec, handle(tmp_path))
    assert before.score == 0.0 and before.checker_error is None
    assert before.audit.flags == ["scope_unchecked"]
    desktop = slot.home / "Desktop"
    (desktop / "todo_list_Jan_1").rename(desktop / "todo_list_Jan_2")
    after = await bridge.verify(rec, handle(tmp_path))
    assert after.score == 1.0
    failed = await bridge.verify(record(task=task_json, terminal="fail"), handle(tmp_path))
    assert failed.score == 0.0


async def test_load_refuses_unsupported_and_unknown(venv_ctx: TaskContext, tmp_path: Path) -> None:
    ctx = venv_ctx.model_copy(update={"task_dirs": [SHARED], "cache_dir": tmp_path / "cache"})
    bridge = TaskBridge(ctx, DirRuntime(DirSlot(tmp_path / "slot")))  # type: ignore[arg-type]
    with pytest.raises(DrumsdError) as info:
        await bridge.load(record(), handle(tmp_path), "01b269ae-2111-4a07-81fd-3fcd711993b0")
    assert info.value.code == "unsupported_task"
    assert "Student_Level_Fill_Blank.xlsx" in info.value.message
    with pytest.raises(DrumsdError) as info:
        await bridge.load(record(), handle(tmp_path), "nope")
    assert info.value.code == "not_found"
    listed = {t.id: t for t in bridge.list_tasks()}
    assert len(listed) == 15 and not listed["01b269ae-2111-4a07-81fd-3fcd711993b0"].supported
    assert bridge.get_task("nope") is None


async def test_verify_without_a_task(venv_ctx: TaskContext, tmp_path: Path) -> None:
    bridge = TaskBridge(venv_ctx, DirRuntime(DirSlot(tmp_path)))  # type: ignore[arg-type]
    result = await bridge.verify(record(), handle(tmp_path))
    assert result.score is None and "no task loaded" in (result.checker_error or "")


def test_context_from_config(tmp_path: Path) -> None:
    cfg = TasksConfig(dirs=[tmp_path], eval_timeout_s=7, client_password="pw", checker_uid=4242)
    ctx = context_from_config(cfg, None)
    assert ctx.task_dirs == [tmp_path] and ctx.eval_timeout_s == 7 and ctx.checker is None
    assert ctx.client_password == "pw"


def test_parse_wmctrl() -> None:
    listing = (
        "0x03a00007  0 libreoffice.libreoffice-calc  host Data.xlsx - LibreOffice Calc\n"
        "0x01000003 -1 xterm.XTerm  host \n"
    )
    assert parse_wmctrl(listing) == [
        {"id": "0x03a00007", "wm_class": "libreoffice.libreoffice-calc",
         "title": "Data.xlsx - LibreOffice Calc"},
        {"id": "0x01000003", "wm_class": "xterm.XTerm", "title": ""},
    ]  # fmt: skip


def test_agent_windows_take_the_shape_the_setup_steps_match() -> None:
    from drumsd.tasks.bridge import agent_window, parse_wmctrl

    agent = {"id": 0x3A00007, "name": "Untitled 1 - LibreOffice Calc", "instance": "libreoffice",
             "class": "libreoffice-calc", "x": 0, "y": 0, "width": 10, "height": 10}  # fmt: skip
    wmctrl = parse_wmctrl(
        "0x03a00007  0 libreoffice.libreoffice-calc  drums Untitled 1 - LibreOffice Calc"
    )
    assert [agent_window(agent)] == wmctrl


def write_task(directory: Path, task_id: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    evaluator = {"func": "infeasible"}
    body = {"id": task_id, "instruction": f"task {task_id}", "config": [], "evaluator": evaluator}
    (directory / f"{task_id}.json").write_text(json.dumps(body))


def test_a_task_is_named_by_a_unique_prefix_of_its_id(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    write_task(dirs[0], "e0df059f-28a6-4169-924f-b9623e7184cc")
    write_task(dirs[0], "e0aa0000-0000-4000-8000-000000000000")
    write_task(dirs[1], "e0aa1111-0000-4000-8000-000000000000")
    assert lookup_task("e0df059f", dirs).id == "e0df059f-28a6-4169-924f-b9623e7184cc"
    assert lookup_task("e0aa1", dirs).id == "e0aa1111-0000-4000-8000-000000000000"
    full = "e0aa0000-0000-4000-8000-000000000000"
    assert lookup_task(full, dirs).id == full  # a whole id is never ambiguous
    with pytest.raises(DrumsdError) as ambiguous:
        lookup_task("e0aa", dirs)
    assert ambiguous.value.code == "invalid_request"  # a 4xx, listing the matches
    assert ambiguous.value.detail["matches"] == [full, "e0aa1111-0000-4000-8000-000000000000"]
    assert full in ambiguous.value.message and "give more of the id" in ambiguous.value.message
    with pytest.raises(DrumsdError) as unknown:
        lookup_task("ffff", dirs)
    assert unknown.value.code == "not_found" and "GET /v1/tasks" in unknown.value.message


def test_get_task_by_prefix_and_an_ambiguous_one(tmp_path: Path) -> None:
    write_task(tmp_path, "aa11")
    write_task(tmp_path, "aa22")
    ctx = TaskContext(task_dirs=[tmp_path], cache_dir=tmp_path / "c", assets_dir=tmp_path / "x")
    bridge = TaskBridge(ctx, runtime=None)  # type: ignore[arg-type]  # no slot is touched
    info = bridge.get_task("aa1")
    assert info is not None and info.id == "aa11"
    assert bridge.get_task("zz") is None
    with pytest.raises(DrumsdError, match="matches 2 tasks: aa11, aa22"):
        bridge.get_task("aa")


class _Freezer:
    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.calls: list[str] = []

    async def freeze(self, handle) -> None:
        self.calls.append("freeze")
        if self.fails:
            raise RuntimeError_("runtime_error", "did not freeze in 2 s")

    async def thaw(self, handle) -> None:
        self.calls.append("thaw")


async def test_slot_access_freezes_for_the_block_and_always_thaws(tmp_path: Path) -> None:
    from drumsd.tasks.bridge import RuntimeSlotAccess

    ok = _Freezer(fails=False)
    access = RuntimeSlotAccess(ok, handle(tmp_path))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        async with access.frozen() as frozen:
            assert frozen is True and ok.calls == ["freeze"]
            raise ValueError("a read failed")
    assert ok.calls == ["freeze", "thaw"]  # thawed even when the block raised
    failing = _Freezer(fails=True)
    async with RuntimeSlotAccess(failing, handle(tmp_path)).frozen() as frozen:  # type: ignore[arg-type]
        assert frozen is False  # verify reads anyway, and the audit flags not_frozen
    assert failing.calls == ["freeze"]
