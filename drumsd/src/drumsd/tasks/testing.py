"""Test doubles for the task bridge: a SlotAccess over a host directory, and the checker venv.

`DirSlot` is the seam's unit-test stand-in, not a desktop: commands run on the host in the
directory (HOME is its user home, PATH starts with its `fakebin/`), background launches and GUI
actions are only recorded (they would act on the host), and root steps run as the caller.
The live proof on restored desktops uses the runtime's SlotAccess instead.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

import trio

from .checker_venv import context_for_checker, ensure_checker_venv
from .model import TaskContext
from .setup import WindowInfo


class DirSlot:
    """A SlotAccess whose "slot" is a directory tree of the host."""

    def __init__(self, root: Path, windows: list[WindowInfo] | None = None) -> None:
        self.root = root
        self.home = root / "home" / "user"
        (self.home / "Desktop").mkdir(parents=True, exist_ok=True)  # as in the desktop image
        self.fakebin = root / "fakebin"
        self.fakebin.mkdir(exist_ok=True)
        self.user_commands: list[list[str] | str] = []
        self.trusted_commands: list[str] = []
        self.launched: list[str] = []
        self.actions: list[dict[str, Any]] = []
        self._windows = list(windows or [])
        self.hang = False  # exec_user never answers (until its deadline)

    def add_fake_command(self, name: str, script: str) -> None:
        path = self.fakebin / name
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)

    def _env(self) -> dict[str, str]:
        return {
            "HOME": str(self.home),
            "PATH": f"{self.fakebin}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "DRUMS_SLOT_ROOT": str(self.root),
        }

    async def _run(self, argv: list[str], timeout_s: float) -> tuple[int, str, str]:
        with trio.fail_after(timeout_s):
            done = await trio.run_process(
                argv,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                cwd=str(self.home),
                env=self._env(),
            )
        return (
            done.returncode,
            done.stdout.decode(errors="replace"),
            done.stderr.decode(errors="replace"),
        )

    async def exec_user(
        self, argv_or_shell: list[str] | str, timeout_s: float
    ) -> tuple[int, str, str]:
        self.user_commands.append(argv_or_shell)
        if self.hang:
            with trio.fail_after(timeout_s):
                await trio.sleep_forever()
        if isinstance(argv_or_shell, str) and argv_or_shell.startswith("setsid -f"):
            self.launched.append(argv_or_shell)
            return 0, "", ""
        if isinstance(argv_or_shell, str):
            return await self._run(["sh", "-c", argv_or_shell], timeout_s)
        return await self._run(list(argv_or_shell), timeout_s)

    async def exec_trusted(self, shell: str, timeout_s: float) -> tuple[int, str, str]:
        self.trusted_commands.append(shell)
        return await self._run(["sh", "-c", shell], timeout_s)

    async def read_file(self, path: str) -> bytes:
        return await trio.Path(path).read_bytes()

    async def write_file(self, path: str, data: bytes, owner_user: bool = True) -> None:
        target = trio.Path(path)
        await target.parent.mkdir(parents=True, exist_ok=True)
        await target.write_bytes(data)

    async def step(self, action: dict[str, Any]) -> None:
        self.actions.append(action)

    async def windows(self) -> list[WindowInfo]:
        return list(self._windows)

    async def screenshot(self) -> bytes:
        return b"\x89PNG\r\n\x1a\n"


def checker_root() -> Path:
    """Where tests build (and reuse) the checker venv: the daemon's default cache when root."""
    configured = os.environ.get("DRUMS_CHECKER_VENV_ROOT")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/drums")
    return Path.home() / ".cache" / "drums"


@cache
def checker_context(root: Path | None = None) -> TaskContext:
    """A TaskContext with the real checker venv (built on first use, then reused)."""
    venv = trio.run(ensure_checker_venv, root or checker_root())
    uid = 65534 if os.geteuid() == 0 else os.geteuid()
    return context_for_checker(TaskContext(), venv, uid=uid, gid=uid)
