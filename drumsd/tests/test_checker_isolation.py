"""Issue 39, D2: a getter's command reads the agent's files as data, never runs them as code.

A module planted in the home directory (the working directory the command used to get) or a
`.pth` in the user site turned the unsolved writer example from 0 into 1. Here the writer's own
result getter runs over a directory slot with both planted; it must still read "False". The live
proof on a restored desktop (another uid too) is tests/live/test_checker_isolation_live.py.
"""

from __future__ import annotations

import shutil
import sysconfig
import zipfile
from pathlib import Path

import pytest
from drumsd.linux.checker_exec import CHECKER_ENV, checker_argv
from drumsd.tasks.getters import GetterEnv, get_value
from drumsd.tasks.model import TaskContext, resolve_task
from drumsd.tasks.testing import DirSlot

WRITER = Path(__file__).resolve().parents[2] / "examples" / "tasks" / "writer.json"
# The image's python3 is the system one (its user site is on); a venv's python has none.
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")

FORGED_ZIPFILE = """
class ZipFile:
    def __init__(self, *a, **k): pass
    def read(self, name): return b'Drums restore desktops.'
"""
FORGING_PTH = "import sys; sys.modules['zipfile'] = __import__('types').SimpleNamespace(" \
    "ZipFile=lambda *a: __import__('types').SimpleNamespace(" \
    "read=lambda n: b'Drums restore desktops.'))\n"  # fmt: skip


def plant(home: Path) -> None:
    """What the issue's attacker planted: ~/zipfile.py and a .pth in ~/.local's user site."""
    (home / "zipfile.py").write_text(FORGED_ZIPFILE)
    version = sysconfig.get_python_version()
    site = home / ".local" / "lib" / f"python{version}" / "site-packages"
    site.mkdir(parents=True)
    (site / "forge.pth").write_text(FORGING_PTH)
    (home / "Documents").mkdir(exist_ok=True)
    with zipfile.ZipFile(home / "Documents" / "note.odt", "w") as z:
        z.writestr("content.xml", "<p>nothing written</p>")


async def writer_result(slot: DirSlot) -> str:
    task = resolve_task(str(WRITER), [])
    config = task.evaluator.result
    assert isinstance(config, dict) and config["type"] == "vm_command_line"
    ctx = TaskContext(user_home=str(slot.home))
    env = GetterEnv(slot, ctx, task, "result0", None, "result")
    return await get_value(config, env)


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="needs a system python3 in /usr/bin")
async def test_planted_module_and_pth_do_not_forge_the_writer_result(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    slot.add_fake_command("python3", f'exec {SYSTEM_PYTHON} "$@"')
    plant(slot.home)
    assert await writer_result(slot) == "False\n"
    # The command went through the isolated path, not the desktop user's.
    assert slot.checker_commands and not slot.user_commands
    # And the file is still read: the solved document answers True.
    with zipfile.ZipFile(slot.home / "Documents" / "note.odt", "w") as z:
        z.writestr("content.xml", "<p>Drums restore desktops.</p>")
    assert await writer_result(slot) == "True\n"


def test_the_checker_argv_clears_the_environment_and_leaves_the_home() -> None:
    argv = checker_argv("python3 -c 'print(1)'")
    assert argv[:4] == ["/usr/bin/env", "-i", "-C", "/"]
    assert argv[-3:] == ["/bin/sh", "-c", "python3 -c 'print(1)'"]
    assigned = dict(a.split("=", 1) for a in argv[4:-3])
    assert assigned == CHECKER_ENV
    assert assigned["PYTHONSAFEPATH"] == "1" and assigned["PYTHONNOUSERSITE"] == "1"
    assert checker_argv(["ls", "-l"])[-2:] == ["ls", "-l"]
    with pytest.raises(ValueError):
        checker_argv([])


def test_python_scripts_of_drums_run_isolated() -> None:
    """Every python3 the getters start as the desktop user gets -I (no cwd, user site, PYTHON*)."""
    import re

    import drumsd.tasks.getters as getters

    source = Path(getters.__file__).read_text()
    calls = re.findall(r"\[env\.ctx\.python_command, (\"[^\"]+\")", source)
    assert calls and all(c == '"-I"' for c in calls), calls
