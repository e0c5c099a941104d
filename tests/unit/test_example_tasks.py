"""The example tasks (examples/tasks/, one per app of the office image) load, are supported, set
up, and their checkers score the unsolved desktop 0 and a solved one 1 (over a host directory as
the slot; the live first episode runs the terminal one against a real daemon)."""

from __future__ import annotations

import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from drumsd.core.records import SlotRecord
from drumsd.core.seams import CommandResult, SlotHandle
from drumsd.tasks.bridge import TaskBridge
from drumsd.tasks.host_support import support
from drumsd.tasks.model import TaskContext, list_tasks
from drumsd.tasks.testing import DirSlot, checker_context
from PIL import Image

TASKS = Path(__file__).resolve().parents[2] / "examples" / "tasks"


class DirRuntime:
    """The SlotRuntime operations the bridge uses, over a DirSlot."""

    def __init__(self, slot: DirSlot) -> None:
        self.slot = slot

    async def exec_user(self, handle: SlotHandle, command: Any, timeout_s: float) -> CommandResult:
        return CommandResult(*await self.slot.exec_user(command, timeout_s))

    async def exec_checker(
        self, handle: SlotHandle, command: Any, timeout_s: float
    ) -> CommandResult:
        return CommandResult(*await self.slot.exec_checker(command, timeout_s))

    async def exec_trusted(self, handle: SlotHandle, command: str, timeout_s: float):
        return CommandResult(*await self.slot.exec_trusted(command, timeout_s))

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes:
        return await self.slot.read_file(path)

    async def write_file(self, handle: SlotHandle, path: str, data: bytes, user: bool) -> None:
        await self.slot.write_file(path, data, user)

    async def step(self, handle: SlotHandle, action: dict[str, Any]) -> None:
        await self.slot.step(action)

    async def screenshot(self, handle: SlotHandle) -> bytes:
        return await self.slot.screenshot()


def odf(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("content.xml", f"<office:document-content>{content}</office:document-content>")


def solve_files(home: Path) -> None:
    (home / "Desktop" / "drafts").rename(home / "Desktop" / "final")


def solve_gimp(home: Path) -> None:
    Image.new("RGB", (64, 64), (0, 255, 255)).save(home / "Pictures" / "inverted.png")


SOLUTIONS: dict[str, Callable[[Path], None]] = {
    "files": solve_files,
    "calc": lambda home: odf(home / "Documents" / "sales.ods", "<text:p>Total</text:p>"),
    "writer": lambda home: odf(home / "Documents" / "note.odt", "<p>Drums restore desktops.</p>"),
    "impress": lambda home: odf(home / "Documents" / "review.odp", "<p>Quarterly review</p>"),
    "gimp": solve_gimp,
}
APPS = {"os", "libreoffice_calc", "libreoffice_writer", "libreoffice_impress", "chrome", "gimp"}


@pytest.fixture(scope="module")
def venv_ctx() -> TaskContext:
    return checker_context()


def test_one_example_task_per_app_of_the_office_image() -> None:
    tasks, broken = list_tasks([TASKS])
    assert broken == {}
    assert sorted(t.snapshot for t in tasks) == sorted(APPS)
    assert len({t.id for t in tasks}) == len(tasks) == len(APPS)


@pytest.mark.parametrize("name", sorted(p.stem for p in TASKS.glob("*.json")))
async def test_example_task_sets_up_and_its_checker_scores(
    name: str, venv_ctx: TaskContext, tmp_path: Path
) -> None:
    slot = DirSlot(tmp_path / "slot")
    slot.add_fake_command("python3", f'exec {sys.executable} "$@"')  # Pillow, as in the image
    ctx = venv_ctx.model_copy(update={"user_home": str(slot.home), "task_dirs": [TASKS]})
    assert support(list_tasks([TASKS])[0][0], ctx)[0]
    bridge = TaskBridge(ctx, DirRuntime(slot), run_root=tmp_path / "runs")  # type: ignore[arg-type]
    now = time.time()
    rec = SlotRecord(id="s1", created_at=now, last_used_at=now, checkpoint="cp")
    handle = SlotHandle("s1", 1, 1, tmp_path / "root", tmp_path / "upper", "cp")
    info, task_json = await bridge.load(rec, handle, str(TASKS / f"{name}.json"))
    assert info.supported, info.reason
    done = rec.model_copy(update={"task": task_json, "terminal": "done"})
    before = await bridge.verify(done, handle)
    assert before.score == 0.0 and before.checker_error is None, before
    if name not in SOLUTIONS:  # chromium: its checker asks the browser's DevTools (live only)
        return
    SOLUTIONS[name](slot.home)
    after = await bridge.verify(done, handle)
    assert after.score == 1.0 and after.checker_error is None, after


# Runs real processes (a trainer in its own venv, vf-eval, the office apps): the integration
# tier, not the fast unit tier (conftest.py).
pytestmark = pytest.mark.integration
