"""A getter command that reads GNOME settings sees the desktop user's settings database (issue
32): it runs as `nobody`, which cannot enter ~/.config/dconf, so gsettings read the schemas'
defaults (a4d98375 scored 1 untouched on the osworld image). A copy made by root, in a directory
nobody owns, is the command's XDG config dir, and goes after."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from drumsd.tasks.getters import GetterEnv, get_value
from drumsd.tasks.model import TaskContext, resolve_task
from drumsd.tasks.settings_copy import reads_settings, with_settings
from drumsd.tasks.testing import DirSlot

# A stand-in gsettings: prints the database it was given and who owns its directory.
# XDG_RUNTIME_DIR apart from it: dconf writes a flag byte into $XDG_RUNTIME_DIR/dconf/user, which
# with one directory for both was the copy itself (and the live test read defaults again).
FAKE_GSETTINGS = (
    'cat "$XDG_CONFIG_HOME/dconf/user"; echo; stat -c %u "$XDG_CONFIG_HOME"; '
    'test "$XDG_RUNTIME_DIR/dconf/user" -ef "$XDG_CONFIG_HOME/dconf/user" && echo same; '
    'test -d "$XDG_RUNTIME_DIR" -a -d "$XDG_CACHE_HOME" && echo dirs\n'
)


def _env(slot: DirSlot) -> GetterEnv:
    context = TaskContext(user_home=str(slot.home))
    task = resolve_task({"id": "t", "evaluator": {"func": "exact_match"}}, [])
    return GetterEnv(slot, context, task, "result0", None, "result")


def test_which_commands_read_settings() -> None:
    assert reads_settings("gsettings get org.gnome.desktop.screensaver lock-enabled")
    assert reads_settings(["dconf", "read", "/org/gnome/x"])
    assert not reads_settings(["cat", "/home/user/.bashrc"])
    assert with_settings(["gsettings", "get", "a", "b"], None) == ["gsettings", "get", "a", "b"]
    assert with_settings(["gsettings"], "/tmp/d") == [
        "/usr/bin/env",
        "XDG_CONFIG_HOME=/tmp/d/config",
        "XDG_RUNTIME_DIR=/tmp/d/run",
        "XDG_CACHE_HOME=/tmp/d/cache",
        "gsettings",
    ]
    assert with_settings("gsettings get a b", "/tmp/d").startswith("export XDG_CONFIG_HOME=/tmp/d/")


@pytest.mark.skipif(os.geteuid() != 0, reason="the copy is chowned to nobody: needs root")
async def test_a_settings_getter_reads_the_users_database(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    db = slot.home / ".config" / "dconf" / "user"
    db.parent.mkdir(parents=True)
    db.write_text("lock-enabled=false")
    slot.add_fake_command("gsettings", FAKE_GSETTINGS)
    for command in ("gsettings get org.gnome.desktop.screensaver lock-enabled", ["gsettings"]):
        got = await get_value({"type": "vm_command_line", "command": command}, _env(slot))
        assert got == "lock-enabled=false\n65534\ndirs\n", command
    made = [c for c in slot.trusted_commands if "mktemp" in c]
    assert len(made) == 2
    left = [name for name in os.listdir("/tmp") if name.startswith("drums-settings-")]
    assert not left, f"the copies were not removed: {left}"
    # Any other command runs as it was given, with no copy made.
    slot.add_fake_command("cat", 'echo "$XDG_CONFIG_HOME"\n')
    got = await get_value({"type": "vm_command_line", "command": ["cat", "x"]}, _env(slot))
    assert got == "\n" and len(slot.trusted_commands) == 8
