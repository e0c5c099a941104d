"""Test doubles for the task bridge: a SlotAccess over a host directory, and the checker venv.

`DirSlot` is the seam's unit-test stand-in, not a desktop: commands run on the host in the
directory (HOME is its user home, PATH starts with its `fakebin/`), background launches and GUI
actions are only recorded (they would act on the host), and root steps run as the caller.
The live proof on restored desktops uses the runtime's SlotAccess instead.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import trio

from drumsd.linux.checker_exec import CHECKER_ENV

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
        self.checker_commands: list[list[str] | str] = []
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

    async def exec_checker(
        self, argv_or_shell: list[str] | str, timeout_s: float
    ) -> tuple[int, str, str]:
        """As the runtime runs it (checker_exec), but as the caller's uid: a clean environment
        (fakebin first on PATH), `/` as working directory, Python isolated from both."""
        self.checker_commands.append(argv_or_shell)
        if self.hang:
            with trio.fail_after(timeout_s):
                await trio.sleep_forever()
        env = {**CHECKER_ENV, "HOME": str(self.home), "PATH": self._env()["PATH"]}
        inner = ["sh", "-c", argv_or_shell] if isinstance(argv_or_shell, str) else argv_or_shell
        argv = ["env", "-i", "-C", "/", *(f"{k}={v}" for k, v in env.items()), *inner]
        return await self._run(argv, timeout_s)

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


def png_image(width: int, height: int, slope: tuple[int, int] = (7, 3)) -> bytes:
    """A grey-gradient PNG (image metrics such as SSIM need some structure; slope (0, 0) is
    flat black)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = struct.pack(">I", zlib.crc32(kind + data))
        return struct.pack(">I", len(data)) + kind + data + crc

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    dx, dy = slope
    rows = b"".join(
        b"\x00" + bytes((x * dx + y * dy) % 256 for x in range(width)) for y in range(height)
    )
    idat = zlib.compress(rows)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


_P = "http://schemas.openxmlformats.org/presentationml/2006/main"
_A = "http://schemas.openxmlformats.org/drawingml/2006/main"
_R = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
_PR = "http://schemas.openxmlformats.org/package/2006/relationships"
Rel = tuple[str, str, str, str | None]  # rId, relationship type, target, TargetMode


def pptx_with_media(slides: list[tuple[str, list[Rel]]], image: bytes | None = None) -> bytes:
    """A .pptx laid out as PowerPoint writes one, with ppt/media/image1.png and media1.wav; per
    slide (the background's rId or "", its relationships)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr("ppt/media/image1.png", image or png_image(4, 4))
        z.writestr("ppt/media/media1.wav", b"RIFF....WAVEfmt ")
        for i, (bg, rels) in enumerate(slides, 1):
            fill = f'<a:blipFill><a:blip r:embed="{bg}"/></a:blipFill>'
            background = f"<p:bg><p:bgPr>{fill}</p:bgPr></p:bg>" if bg else ""
            z.writestr(
                f"ppt/slides/slide{i}.xml",
                f'<p:sld xmlns:p="{_P}" xmlns:a="{_A}" xmlns:r="{_R}"><p:cSld>{background}'
                "<p:spTree/></p:cSld></p:sld>",
            )
            items = "".join(
                f'<Relationship Id="{rid}" Type="{_R}/{kind}" Target="{target}"'
                + (f' TargetMode="{mode}"' if mode else "")
                + "/>"
                for rid, kind, target, mode in rels
            )
            z.writestr(
                f"ppt/slides/_rels/slide{i}.xml.rels",
                f'<Relationships xmlns="{_PR}">{items}</Relationships>',
            )
    return out.getvalue()
