"""Vendors' computer-tool calls, built with the official `anthropic` and `openai` SDK types (no
network), run through the step API on a real desktop, with their effect read back from the X
server: an event recorder (fixtures/x_events.py) logs every button and key with its position,
modifier state and time, so each row of docs/dialects.md is checked by what the desktop saw.

The model's screen is 1280x800 on the 1920x1080 desktop (a different aspect ratio), so every
coordinate is scaled in and cursor positions and screenshots out. One slot, a few dozen actions.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic.types.beta as beta
import drums
import pytest
from drums.dialects import Scale
from live_daemon import Daemon

oa = pytest.importorskip("openai.types.responses", reason="the openai SDK is a dev dependency")
from openai.types.responses import computer_action as ca  # noqa: E402

MODEL = (1280, 800)
SCALE = Scale(*MODEL, 1920, 1080)
RECORDER = (Path(__file__).parent / "fixtures" / "x_events.py").read_text()
LOG = "/tmp/x-events.jsonl"
SHIFT, CTRL = 1, 4  # X modifier state bits


@pytest.fixture(scope="module")
def env(live_daemon: Daemon) -> Iterator[drums.Env]:
    with drums.connect(live_daemon.url, token=live_daemon.token) as client:
        with client.create(image="base") as env:
            write = f"open('/tmp/x_events.py', 'w').write({RECORDER!r})"
            env.step({"type": "execute", "command": ["python3", "-c", write]})
            start = f"setsid python3 /tmp/x_events.py {LOG} >/tmp/x-events.err 2>&1 &"
            env.step({"type": "execute", "command": ["bash", "-c", start]})
            deadline = time.monotonic() + 20
            while "ready" not in events_text(env):
                assert time.monotonic() < deadline, events_text(env, "/tmp/x-events.err")
                time.sleep(0.2)
            yield env


def events_text(env: drums.Env, path: str = LOG) -> str:
    out = env.step({"type": "execute", "command": ["sh", "-c", f"cat {path} 2>/dev/null; true"]})
    assert out.output is not None
    return out.output.stdout


def new_events(env: drums.Env, seen: list[int]) -> list[dict]:
    """The recorder's events since the last call (the X server has delivered them by then: the
    worker syncs after each action, and the recorder writes as it reads)."""
    time.sleep(0.3)
    lines = [json.loads(line) for line in events_text(env).splitlines() if line.strip()]
    fresh = [e for e in lines[seen[0] :] if e["t"] != "ready"]
    seen[0] = len(lines)
    return fresh


def at(x: int, y: int) -> tuple[int, int]:
    return SCALE.to_screen(x, y)


def presses(events: list[dict]) -> list[tuple]:
    return [(e["d"], e["x"], e["y"], e["s"] & (SHIFT | CTRL)) for e in events if e["t"] == "press"]


def test_openai_calls_from_the_sdk_types(env: drums.Env) -> None:
    seen = [0]
    new_events(env, seen)
    call = oa.ResponseComputerToolCall(
        id="cu_1",
        call_id="call_1",
        pending_safety_checks=[],
        status="completed",
        type="computer_call",
        actions=[
            ca.Click(type="click", button="left", x=320, y=200, keys=["CTRL"]),
            ca.Click(type="click", button="wheel", x=400, y=200),
            ca.Click(type="click", button="right", x=400, y=220),
            ca.Click(type="click", button="back", x=400, y=240),
            ca.Click(type="click", button="forward", x=400, y=260),
            ca.DoubleClick(type="double_click", x=500, y=300),
            ca.Scroll(type="scroll", x=500, y=300, scroll_x=0, scroll_y=300, keys=["SHIFT"]),
            ca.Scroll(type="scroll", x=500, y=300, scroll_x=-200, scroll_y=0),
            ca.Drag(type="drag", path=[ca.DragPath(x=300, y=300), ca.DragPath(x=420, y=360)]),
            ca.Move(type="move", x=640, y=400),
            ca.Keypress(type="keypress", keys=["CTRL", "A"]),
            ca.Type(type="type", text="a<B"),
            ca.Screenshot(type="screenshot"),
        ],
    )
    assert call.actions is not None
    result = env.step(call.actions, dialect="openai", screen=MODEL, screenshot={"format": "jpeg"})
    assert (result.screenshot_width, result.screenshot_height) == MODEL
    assert result.screenshot_content_type == "image/jpeg"
    shot = result.results[-1]
    assert (shot.image_width, shot.image_height) == MODEL
    events = new_events(env, seen)
    got = presses(events)
    x, y = at(500, 300)
    assert got[:5] == [
        (1, *at(320, 200), CTRL),
        (2, *at(400, 200), 0),
        (3, *at(400, 220), 0),
        (8, *at(400, 240), 0),
        (9, *at(400, 260), 0),
    ]
    assert got[5:7] == [(1, x, y, 0)] * 2  # double click
    assert got[7:10] == [(5, x, y, SHIFT)] * 3  # 300 px down = 3 wheel clicks, shift held
    assert got[10:12] == [(6, x, y, 0)] * 2  # 200 px left = 2 clicks of the horizontal wheel
    drag_release = [e for e in events if e["t"] == "release" and e["d"] == 1][-1]
    assert got[12] == (1, *at(300, 300), 0)
    assert (drag_release["x"], drag_release["y"]) == at(420, 360)
    keys = [(e["d"], e["s"] & (SHIFT | CTRL)) for e in events if e["t"] == "key"]
    typed = [k for k, _ in keys if k not in ("Shift_L", "Control_L")]
    assert typed == ["a", "a", "<", "B"], keys
    assert ("a", CTRL) in keys


def test_anthropic_toolset_calls_from_the_sdk_types(env: drums.Env) -> None:
    seen = [0]
    new_events(env, seen)

    def block(cls: type, name: str, **input: object) -> dict:
        made = cls(id=f"toolu_{name}", type="tool_use", name=name, toolset_name="computer",
                   input=input)  # fmt: skip
        return made.model_dump(exclude_none=True)

    B = beta
    calls = [
        block(
            B.BetaComputerLeftClickToolUseBlock, "left_click", coordinate=[100, 100], text="shift"
        ),
        block(B.BetaComputerTripleClickToolUseBlock, "triple_click", coordinate=[200, 100]),
        block(B.BetaComputerMiddleClickToolUseBlock, "middle_click", coordinate=[300, 100]),
        block(B.BetaComputerRightClickToolUseBlock, "right_click", coordinate=[400, 100]),
        block(B.BetaComputerDoubleClickToolUseBlock, "double_click", coordinate=[500, 100]),
        block(B.BetaComputerMouseMoveToolUseBlock, "mouse_move", coordinate=[100, 200]),
        block(B.BetaComputerLeftMouseDownToolUseBlock, "left_mouse_down"),
        block(B.BetaComputerMouseMoveToolUseBlock, "mouse_move", coordinate=[150, 250]),
        block(B.BetaComputerLeftMouseUpToolUseBlock, "left_mouse_up"),
        block(
            B.BetaComputerLeftClickDragToolUseBlock,
            "left_click_drag",
            start_coordinate=[200, 300],
            coordinate=[260, 330],
            text="ctrl",
        ),
        block(
            B.BetaComputerScrollToolUseBlock,
            "scroll",
            scroll_direction="up",
            scroll_amount=2,
            coordinate=[600, 400],
            text="ctrl",
        ),
        block(
            B.BetaComputerScrollToolUseBlock,
            "scroll",
            scroll_direction="right",
            scroll_amount=1,
            coordinate=[600, 400],
        ),
        block(B.BetaComputerHoldKeyToolUseBlock, "hold_key", text="shift", duration=1),
        block(B.BetaComputerKeyToolUseBlock, "key", text="ctrl+shift+Escape"),
        block(B.BetaComputerTypeToolUseBlock, "type", text="é<"),
        block(B.BetaComputerMouseMoveToolUseBlock, "mouse_move", coordinate=[700, 500]),
        block(B.BetaComputerCursorPositionToolUseBlock, "cursor_position"),
        block(B.BetaComputerZoomToolUseBlock, "zoom", region=[0, 0, 128, 80]),
        block(B.BetaComputerWaitToolUseBlock, "wait", duration=0),
        block(B.BetaComputerScreenshotToolUseBlock, "screenshot"),
    ]
    result = env.step(calls, dialect="anthropic-2026-08", screen=MODEL)
    by_name = {r.name: r for r in result.results}
    assert by_name["cursor_position"].cursor == {"x": 700, "y": 500}
    zoom = by_name["zoom"]
    assert (zoom.image_width, zoom.image_height) == (192, 108)  # the region at full resolution
    assert (by_name["screenshot"].image_width, by_name["screenshot"].image_height) == MODEL
    events = new_events(env, seen)
    got = presses(events)
    assert got[0] == (1, *at(100, 100), SHIFT)
    assert got[1:4] == [(1, *at(200, 100), 0)] * 3
    assert got[4] == (2, *at(300, 100), 0)
    assert got[5] == (3, *at(400, 100), 0)
    assert got[6:8] == [(1, *at(500, 100), 0)] * 2
    assert got[8] == (1, *at(100, 200), 0)  # left_mouse_down where the pointer was moved
    releases = [(e["x"], e["y"], e["s"] & CTRL) for e in events if e["t"] == "release"]
    assert (*at(150, 250), 0) in releases  # left_mouse_up after the move
    assert got[9] == (1, *at(200, 300), CTRL)  # the drag, ctrl held
    assert (*at(260, 330), CTRL) in releases
    assert got[10:12] == [(4, *at(600, 400), CTRL)] * 2
    assert got[12] == (7, *at(600, 400), 0)
    keys = [e for e in events if e["t"] in ("key", "keyup")]
    held, down = [], 0
    for e in keys:
        if e["d"] == "Shift_L":
            if e["t"] == "key":
                down = e["ms"]
            else:
                held.append(e["ms"] - down)
    assert max(held) >= 950, held  # hold_key: shift held for its duration (1 s)
    pressed = [(e["d"], e["s"] & (SHIFT | CTRL)) for e in keys if e["t"] == "key"]
    assert ("Escape", SHIFT | CTRL) in pressed, repr(pressed)
    typed = [d for d, _ in pressed if d not in ("Shift_L", "Control_L", "Escape")]
    assert typed[-2:] == ["é", "<"], pressed


def test_anthropic_single_tool_calls(env: drums.Env) -> None:
    """computer_20250124 / computer_20251124: one tool, `action` in its input."""
    seen = [0]
    new_events(env, seen)
    blocks = [
        beta.BetaToolUseBlock(id="t1", type="tool_use", name="computer", input=i)
        for i in (
            {"action": "left_click", "coordinate": [640, 400]},
            {"action": "key", "text": "Return"},
            {"action": "mouse_move", "coordinate": [10, 790]},
            {"action": "cursor_position"},
        )
    ]
    result = env.step([b.input for b in blocks], dialect="computer_20250124", screen=MODEL)
    assert result.results[-1].cursor == {"x": 10, "y": 790}
    events = new_events(env, seen)
    assert presses(events) == [(1, *at(640, 400), 0)]
    assert [e["d"] for e in events if e["t"] == "key"] == ["Return"]
    zoom = env.step(
        [{"action": "zoom", "region": [640, 400, 1280, 800]}], dialect="computer_20251124",
        screen=MODEL, screenshot={"format": "webp", "quality": 50},
    )  # fmt: skip
    assert (zoom.results[0].image_width, zoom.results[0].image_height) == (960, 540)
    assert zoom.results[0].image_content_type == "image/webp"


def test_a_bad_call_is_refused_whole(env: drums.Env) -> None:
    seen = [0]
    new_events(env, seen)
    calls = [{"type": "click", "button": "left", "x": 5, "y": 5}, {"type": "click", "x": 5}]
    with pytest.raises(drums.InvalidRequest) as err:
        env.step(calls, dialect="openai", screen=MODEL)
    assert "actions[1].button" in str(err.value)
    assert new_events(env, seen) == []  # the first call did not run either
