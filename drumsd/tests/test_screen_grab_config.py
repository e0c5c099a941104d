"""`linux.screen_grab`: under `full`, every screenshot the daemon asks a guest for (a grab, the
bare screenshot, the one riding a step or a batch) asks for the grab path before issue 35, and the
guest's step answers it on that path; under `damage` (the default) none does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
from drumsd.core.config import Config
from drumsd.core.seams import SlotHandle
from drumsd.guest import agent as guest_agent
from drumsd.guest.protocol import PNG_FULL, ShotSpec
from drumsd.guest.screen import Shot
from drumsd.runtime.linux import LinuxRuntimeConfig
from drumsd.runtime.linux.slot_io import SlotIO

HANDLE = SlotHandle("s1", 1, 1, Path("/nonexistent"), Path("/nonexistent"), "c1")


class RecordingIO(SlotIO):
    """SlotIO whose agent calls are recorded and answered with a small PNG shot."""

    def __init__(self, config: LinuxRuntimeConfig) -> None:  # no instances, no supervision
        self.config = config
        self.requests: list[dict[str, Any]] = []

    async def _agent(
        self, handle: SlotHandle, request: dict[str, Any], limit_s: float
    ) -> tuple[dict[str, Any], bytes]:
        self.requests.append(request)
        return {"ok": True, "result": {}, "content_type": "image/png"}, b"png"


async def every_kind_of_screenshot(io: RecordingIO) -> list[dict[str, Any]]:
    handle = HANDLE
    move = {"type": "move", "x": 5, "y": 5}
    await io.step(handle, move, PNG_FULL)
    await io.step_batch(handle, [move, move], PNG_FULL)
    await io.grab(handle, PNG_FULL)
    await io.screenshot(handle)
    return io.requests


async def test_full_makes_every_screenshot_take_the_path_before(tmp_path: Path) -> None:
    io = RecordingIO(LinuxRuntimeConfig(state_dir=tmp_path, screen_grab="full"))
    requests = await every_kind_of_screenshot(io)
    assert len(requests) == 4
    assert all(r.get("fresh") is True for r in requests), requests


async def test_damage_asks_no_screenshot_for_the_path_before(tmp_path: Path) -> None:
    io = RecordingIO(LinuxRuntimeConfig(state_dir=tmp_path))
    assert io.config.screen_grab == "damage", "the default"
    requests = await every_kind_of_screenshot(io)
    assert not any("fresh" in r for r in requests), requests
    await io.grab(HANDLE, PNG_FULL, fresh=True)  # the bench's explicit baseline
    assert io.requests[-1]["fresh"] is True


async def test_a_step_without_a_screenshot_carries_no_flag(tmp_path: Path) -> None:
    io = RecordingIO(LinuxRuntimeConfig(state_dir=tmp_path, screen_grab="full"))
    await io.step(HANDLE, {"type": "move", "x": 1, "y": 1})
    assert "fresh" not in io.requests[0]


def test_the_key_takes_only_its_two_values(tmp_path: Path) -> None:
    cfg = Config(token_file=tmp_path / "t", linux={"screen_grab": "full"})
    assert LinuxRuntimeConfig.from_config(cfg).screen_grab == "full"
    with pytest.raises(pydantic.ValidationError) as err:
        Config(token_file=tmp_path / "t", linux={"screen_grab": "fast"})
    assert "screen_grab" in str(err.value) and "'damage' or 'full'" in str(err.value)


class GrabRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[ShotSpec, bool]] = []

    def grab(self, spec: ShotSpec = PNG_FULL, fresh: bool = False) -> Shot:
        self.calls.append((spec, fresh))
        return Shot(b"png", 1, 1, False, 0.0, 0.0, "legacy" if fresh else "shm")


@pytest.mark.parametrize("fresh", [True, False])
def test_the_guest_answers_a_steps_screenshot_on_the_path_asked(fresh: bool) -> None:
    agent = guest_agent.Agent.__new__(guest_agent.Agent)  # no socket, no worker, no X
    agent.screen = GrabRecorder()  # type: ignore[assignment]
    replies: list[dict[str, Any]] = []
    agent.reply = lambda conn, header, payload=b"": replies.append(header)  # type: ignore[method-assign]
    agent.dispatch_step = lambda: None  # type: ignore[method-assign]
    request: dict[str, Any] = {"op": "step", "screenshot_spec": PNG_FULL}
    if fresh:
        request["fresh"] = True
    agent.current_step = guest_agent.Conn(sock=None, request=request)  # type: ignore[arg-type]
    agent.on_worker_message({"ok": True, "result": {}, "elapsed_s": 0.01})
    assert agent.screen.calls == [(PNG_FULL, fresh)]  # type: ignore[attr-defined]
    assert replies[0]["grab_method"] == ("legacy" if fresh else "shm")
