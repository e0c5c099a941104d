"""An in-memory SlotRuntime for tests of the control plane only: no desktops, no root.

Slots are dicts plus a marker file per slot under `<state_dir>/memory-runtime/`, so a restarted
daemon can adopt the slots a killed one left (the markers play the part of live process trees).
Facts are synthesized so every gate passes unless a test injects a fault with `inject`.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from drumsd.core.seams import (
    CheckpointRef,
    CommandResult,
    Quiescence,
    RuntimeError_,
    SaveParent,
    Screenshot,
    SlotFacts,
    SlotHandle,
    SlotLimits,
    StepOutcome,
)

if TYPE_CHECKING:
    from drumsd.guest.protocol import ShotSpec

MOUNTS = ("/ overlay", "/proc proc", "/dev tmpfs", "/tmp tmpfs")
FAKE_NAMESPACE_BASE = 9_000_000_000  # far from real nsfs inodes (~4026531835)


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid solid-colour PNG, built with the standard library."""
    row = b"\x00" + bytes(rgb) * width
    raw = row * height

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def _write_meta(dest: Path, meta: str) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "meta.json").write_text(meta)


class MemoryRuntime:
    def __init__(
        self,
        state_dir: Path,
        *,
        restore_delay_s: float | None = None,
        screen: tuple[int, int] = (64, 36),
    ) -> None:
        self.state_dir = state_dir
        self.markers = state_dir / "memory-runtime"
        self.markers.mkdir(parents=True, exist_ok=True)
        self.restore_delay_s = restore_delay_s or 0.0
        self.screen = screen
        self.slots: dict[str, dict[str, Any]] = {}
        self.faults: dict[str, dict[str, Any]] = {}  # slot id -> facts overrides
        self.faults_for_new: dict[str, Any] = {}  # overrides for every slot (start-gate tests)
        self.fail_next_restore: str | None = None
        self.fail_template_builds = 0  # this many make_template calls raise before one succeeds
        self.quiet = True  # False: every slot keeps moving (quiescent waits out its timeout)
        self.fail_captures = 0  # this many captures raise runtime_error before one succeeds
        self.fail_adopt_check: list[str] = []  # problems checkpoint_problems reports
        self.captures = 0
        self.save_parents: list[SaveParent | None] = []  # what each capture was stored against
        self.template_builds = 0
        self._next_pid = 10_000
        self._ns = FAKE_NAMESPACE_BASE
        self._exits: dict[str, trio.Event] = {}
        self.calls: list[tuple[str, str]] = []
        # slot id -> whether its last restore let a warm upper be prepared (none is built here)
        self.warm_upper: dict[str, bool] = {}

    # --- test hooks ---------------------------------------------------------------------------

    def inject(self, slot_id: str, **facts: Any) -> None:
        """Override facts of a slot (e.g. oom_kills=1, extra={"crash_exits": [...]})."""
        self.faults.setdefault(slot_id, {}).update(facts)

    def kill(self, slot_id: str) -> None:
        """Simulate the slot's init dying."""
        if slot_id in self.slots:
            self.slots[slot_id]["alive"] = False
            self._exits.setdefault(slot_id, trio.Event()).set()

    # --- helpers --------------------------------------------------------------------------------

    def _marker(self, slot_id: str) -> Path:
        return self.markers / f"{slot_id}.json"

    def _start(self, slot_id: str, checkpoint: CheckpointRef, actions: int = 0) -> SlotHandle:
        self._next_pid += 7
        namespaces = {}
        for name in ("pid", "mnt", "net", "ipc", "uts"):
            self._ns += 1
            namespaces[name] = self._ns
        upper = self.state_dir / "memory-slots" / slot_id
        handle = SlotHandle(
            slot_id=slot_id,
            init_pid=self._next_pid,
            init_starttime=int(trio.current_time() * 100) % 10_000_000,
            root=upper / "root",
            upper=upper / "upper",
            checkpoint_id=checkpoint.id,
            cgroups={"memory": f"/sys/fs/cgroup/memory/drums/{slot_id}"},
            namespaces=namespaces,
            restore_s=self.restore_delay_s,
            extra={"upper_sha256": checkpoint.upper_sha256},
        )
        self.slots[slot_id] = {
            "handle": handle,
            "alive": True,
            "actions": actions,
            "files": {},
            "upper_sha256": checkpoint.upper_sha256,
        }
        self._exits[slot_id] = trio.Event()
        marker = {"init_pid": handle.init_pid, "init_starttime": handle.init_starttime}
        self._marker(slot_id).write_text(json.dumps(marker))
        return handle

    def _slot(self, handle: SlotHandle) -> dict[str, Any]:
        slot = self.slots.get(handle.slot_id)
        if slot is None or not slot["alive"]:
            raise RuntimeError_(
                "runtime_error", f"slot {handle.slot_id} has no live process tree; destroy it"
            )
        return slot

    # --- SlotRuntime ----------------------------------------------------------------------------

    async def restore(
        self,
        slot_id: str,
        checkpoint: CheckpointRef,
        limits: SlotLimits,
        *,
        warm_upper: bool = True,
    ) -> SlotHandle:
        self.calls.append(("restore", slot_id))
        self.warm_upper[slot_id] = warm_upper
        if self.restore_delay_s:
            await trio.sleep(self.restore_delay_s)
        if self.fail_next_restore:
            message, self.fail_next_restore = self.fail_next_restore, None
            raise RuntimeError_("restore_failed", message, slot=slot_id)
        return self._start(slot_id, checkpoint)

    async def reset(
        self, handle: SlotHandle, checkpoint: CheckpointRef, limits: SlotLimits
    ) -> SlotHandle:
        self.calls.append(("reset", handle.slot_id))
        await self.destroy(handle.slot_id)
        if self.restore_delay_s:
            await trio.sleep(self.restore_delay_s)
        return self._start(handle.slot_id, checkpoint)

    async def destroy(self, slot_id: str) -> None:
        self.calls.append(("destroy", slot_id))
        self.slots.pop(slot_id, None)
        self.faults.pop(slot_id, None)
        event = self._exits.pop(slot_id, None)
        if event is not None:
            event.set()
        self._marker(slot_id).unlink(missing_ok=True)

    async def step(
        self, handle: SlotHandle, action: Mapping[str, Any], shot: ShotSpec | None = None
    ) -> StepOutcome:
        slot = self._slot(handle)
        kind = str(action.get("type", "pyautogui"))
        if kind == "pyautogui" and "raise" in str(action.get("code", "")):
            raise RuntimeError_("action_failed", "the pyautogui code raised (simulated)")
        slot["actions"] += 1
        output = None
        if kind == "execute":
            command = action.get("command")
            text = command if isinstance(command, str) else " ".join(command or [])
            output = CommandResult(0, f"ran: {text}\n", "")
        screenshot = await self.grab(handle, shot) if shot is not None else None
        return StepOutcome(kind, 0.0, output, screenshot)

    async def screenshot(self, handle: SlotHandle) -> bytes:
        slot = self._slot(handle)
        shade = (slot["actions"] * 37) % 256
        return png(self.screen[0], self.screen[1], (shade, 128, 255 - shade))

    async def grab(self, handle: SlotHandle, spec: ShotSpec) -> Screenshot:
        """Encoded by the guest's own encoder; `cached` while no action ran since the last
        grab of this spec (the guest's change check, with the action count as the frame)."""
        from PIL import Image

        from drumsd.guest.screen import encode

        slot = self._slot(handle)
        frame = (slot["actions"], spec)
        cached = slot.get("last_grab") == frame
        slot["last_grab"] = frame
        if spec.to_request() == {}:  # the full PNG: the same bytes as screenshot()
            data = await self.screenshot(handle)
            return Screenshot(data, spec.content_type, self.screen[0], self.screen[1], cached)
        shade = (slot["actions"] * 37) % 256
        image = Image.new("RGB", self.screen, (shade, 128, 255 - shade))
        data, w, h = encode(image, spec)
        return Screenshot(data, spec.content_type, w, h, cached)

    async def capture(
        self,
        handle: SlotHandle,
        checkpoint_id: str,
        dest: Path,
        *,
        parent: SaveParent | None = None,
    ) -> CheckpointRef:
        slot = self._slot(handle)
        self.calls.append(("capture", handle.slot_id))
        self.save_parents.append(parent)
        self.captures += 1
        if self.fail_captures:
            self.fail_captures -= 1
            raise RuntimeError_("runtime_error", f"criu dump of {handle.slot_id} failed (injected)")
        upper_hash = hashlib.sha256(f"{checkpoint_id}:{slot['actions']}".encode()).hexdigest()
        meta = json.dumps({"id": checkpoint_id, "actions": slot["actions"]})
        await trio.to_thread.run_sync(_write_meta, dest, meta)
        return CheckpointRef(
            id=checkpoint_id,
            dir=dest,
            lower=Path("/nonexistent/lower"),
            image_sha256="0" * 64,
            upper_sha256=upper_hash,
        )

    async def fork(
        self,
        handle: SlotHandle,
        source: CheckpointRef,
        child_ids: Sequence[str],
        limits: SlotLimits,
    ) -> list[SlotHandle]:
        parent = self._slot(handle)
        if self.restore_delay_s:
            await trio.sleep(self.restore_delay_s)
        return [self._start(cid, source, parent["actions"]) for cid in child_ids]

    async def quiescent(
        self, handle: SlotHandle, window_s: float, timeout_s: float, poll_ms: int
    ) -> Quiescence:
        self._slot(handle)
        # window 0 is a fork's settle check (zombies, D state), not a quiet wait
        self.calls.append(("quiescent" if window_s > 0 else "settle", handle.slot_id))
        if not self.quiet:
            await trio.sleep(min(timeout_s, 0.01))
            return Quiescence(False, ("sh(4242) started",))
        await trio.sleep(min(window_s, 0.01))
        return Quiescence(True)

    async def exec_user(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        self._slot(handle)
        return CommandResult(0, "", "")

    async def exec_checker(
        self, handle: SlotHandle, command: str | Sequence[str], timeout_s: float
    ) -> CommandResult:
        self._slot(handle)
        return CommandResult(0, "", "")

    async def exec_trusted(
        self, handle: SlotHandle, command: str, timeout_s: float
    ) -> CommandResult:
        self._slot(handle)
        return CommandResult(0, "", "")

    async def read_file(self, handle: SlotHandle, path: str, max_bytes: int) -> bytes:
        data = self._slot(handle)["files"].get(path)
        if data is None:
            raise RuntimeError_("not_found", f"no file {path} in slot {handle.slot_id}")
        return data[:max_bytes]

    async def write_file(
        self, handle: SlotHandle, path: str, data: bytes, *, user: bool = True
    ) -> None:
        self._slot(handle)["files"][path] = data

    async def facts(self, handle: SlotHandle) -> SlotFacts:
        slot = self.slots.get(handle.slot_id)
        alive = bool(slot and slot["alive"])
        base = handle.init_pid
        extra: dict[str, Any] = {
            "lock_applied": True,
            "guest_ready": alive,
            "upper_sha256": slot["upper_sha256"] if slot else None,
            "expected_mounts": list(MOUNTS),
            "proc_names": {str(base): "init", str(base + 1): "Xvfb", str(base + 2): "openbox"},
            "crash_exits": [],
            "crash_watch": True,
            "display_server": {
                "display": ":0",
                "pid": base + 1,
                "start": 1,
                "uid": 1000,
                "sockets": {"/tmp/.X11-unix/X0": base + 100},
            },
        }
        fields: dict[str, Any] = {
            "alive": alive,
            "init_identity_ok": alive,
            "limits_in_force": {"memory_mib": 2048, "pids_max": 1024, "vcpus": 1.0},
            "mounts": list(MOUNTS),
            "net_links": ["lo"],
            "namespaces": dict(handle.namespaces),
            "oom_kills": 0,
            "pids": [base, base + 1, base + 2] if alive else [],
        }
        fault = {**self.faults_for_new, **self.faults.get(handle.slot_id, {})}
        for key, value in fault.items():
            if key == "extra":
                extra.update(value)
            else:
                fields[key] = value
        return SlotFacts(extra=extra, **fields)

    async def wait_exit(self, handle: SlotHandle) -> str:
        event = self._exits.get(handle.slot_id)
        if event is not None:
            await event.wait()
        return "killed by SIGKILL"  # what its kill() stands for

    async def make_template(
        self, image_root: Path, image_sha256: str, checkpoint_id: str, dest: Path
    ) -> CheckpointRef:
        self.template_builds += 1
        if self.template_builds <= self.fail_template_builds:
            raise RuntimeError_("timeout", "the agent listed no windows (injected)")
        await trio.to_thread.run_sync(_write_meta, dest, json.dumps({"id": checkpoint_id}))
        return CheckpointRef(
            id=checkpoint_id,
            dir=dest,
            lower=image_root,
            image_sha256=image_sha256,
            upper_sha256=hashlib.sha256(checkpoint_id.encode()).hexdigest(),
        )

    async def connect_guest(self, handle: SlotHandle, port: int) -> trio.SocketStream:
        # This fake's slots share the host's network: a guest port is the host's loopback port.
        self._slot(handle)
        return await trio.open_tcp_stream("127.0.0.1", port)

    async def checkpoint_problems(self, path: Path, meta: dict[str, Any]) -> list[str]:
        # This fake's checkpoints are a meta.json with the id it wrote; a restore reads nothing
        # else. `fail_adopt_check` plays a runtime that finds the dir's images wanting.
        return list(self.fail_adopt_check)

    async def adopt(self, handle: SlotHandle) -> bool:
        marker = self._marker(handle.slot_id)
        try:
            data = json.loads(marker.read_text())
        except (OSError, json.JSONDecodeError):
            return False
        if data.get("init_pid") != handle.init_pid:
            return False
        self.slots[handle.slot_id] = {
            "handle": handle,
            "alive": True,
            "actions": 0,
            "files": {},
            "upper_sha256": handle.extra.get("upper_sha256"),
        }
        self._exits[handle.slot_id] = trio.Event()
        return True

    async def sweep(self, live_slot_ids: Sequence[str]) -> list[str]:
        live = set(live_slot_ids)
        cleaned = []
        for marker in self.markers.glob("*.json"):
            if marker.stem not in live:
                marker.unlink(missing_ok=True)
                self.slots.pop(marker.stem, None)
                cleaned.append(marker.stem)
        return cleaned
