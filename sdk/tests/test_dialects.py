"""drums.dialects: every member of every vendor dialect, built with the vendors' own SDK types
where they have them, and every malformed case naming the dialect, the field and what is allowed."""

from __future__ import annotations

import pytest

from drums import dialects as D
from drums.dialects import DialectError, Scale, translate, translate_batch

A26, A25, A11, OAI = D.ANTHROPIC_2026_08, D.ANTHROPIC_2025_01, D.ANTHROPIC_2025_11, D.OPENAI
HALF = Scale(960, 540, 1920, 1080)


def test_member_lists_match_the_vendor_sdks() -> None:
    member_name = pytest.importorskip("anthropic.types.beta.beta_computer_member_name")
    computer_action = pytest.importorskip("openai.types.responses.computer_action")
    assert D.ANTHROPIC_MEMBERS == member_name.BETA_COMPUTER_MEMBER_NAME_VALUES
    openai_types = {
        cls.model_fields["type"].annotation.__args__[0]
        for cls in computer_action.ComputerAction.__origin__.__args__
    }
    assert openai_types == set(D.OPENAI_FIELDS)
    click = computer_action.Click.model_fields["button"].annotation.__args__
    assert tuple(click) == D.OPENAI_BUTTONS


ANTHROPIC_CASES = [
    (
        {"name": "left_click", "input": {"coordinate": [10, 20]}},
        [{"type": "click", "x": 10, "y": 20}],
    ),
    ({"name": "left_click", "input": {}}, [{"type": "click"}]),
    (
        {"name": "left_click", "input": {"coordinate": [10, 20], "text": "ctrl+shift"}},
        [{"type": "click", "x": 10, "y": 20, "modifiers": ["ctrl", "shift"]}],
    ),
    (
        {"name": "right_click", "input": {"coordinate": [1, 2]}},
        [{"type": "right_click", "x": 1, "y": 2}],
    ),
    (
        {"name": "middle_click", "input": {"coordinate": [1, 2]}},
        [{"type": "click", "button": "middle", "x": 1, "y": 2}],
    ),
    ({"name": "double_click", "input": {}}, [{"type": "double_click"}]),
    (
        {"name": "triple_click", "input": {"coordinate": [5, 6]}},
        [{"type": "click", "clicks": 3, "x": 5, "y": 6}],
    ),
    ({"name": "mouse_move", "input": {"coordinate": [7, 8]}}, [{"type": "move", "x": 7, "y": 8}]),
    ({"name": "left_mouse_down", "input": {}}, [{"type": "mouse_down"}]),
    ({"name": "left_mouse_up", "input": {}}, [{"type": "mouse_up"}]),
    (
        {
            "name": "left_click_drag",
            "input": {"start_coordinate": [1, 2], "coordinate": [3, 4], "text": "alt"},
        },
        [{"type": "drag", "x": 1, "y": 2, "to_x": 3, "to_y": 4, "modifiers": ["alt"]}],
    ),
    (
        {
            "name": "scroll",
            "input": {"scroll_direction": "down", "scroll_amount": 3, "coordinate": [9, 9]},
        },
        [{"type": "scroll", "dy": -3, "x": 9, "y": 9}],
    ),
    (
        {
            "name": "scroll",
            "input": {"scroll_direction": "left", "scroll_amount": 2, "text": "shift"},
        },
        [{"type": "scroll", "dx": -2, "modifiers": ["shift"]}],
    ),
    (
        {"name": "scroll", "input": {"scroll_direction": "right", "scroll_amount": 1}},
        [{"type": "scroll", "dx": 1}],
    ),
    (
        {"name": "scroll", "input": {"scroll_direction": "up", "scroll_amount": 4}},
        [{"type": "scroll", "dy": 4}],
    ),
    ({"name": "type", "input": {"text": "héllo <>"}}, [{"type": "type", "text": "héllo <>"}]),
    ({"name": "key", "input": {"text": "Return"}}, [{"type": "key", "keys": ["enter"]}]),
    ({"name": "key", "input": {"text": "ctrl+A"}}, [{"type": "hotkey", "keys": ["ctrl", "a"]}]),
    (
        {"name": "key", "input": {"text": "Page_Down", "repeat": 2}},
        [{"type": "key", "keys": ["pagedown"]}, {"type": "key", "keys": ["pagedown"]}],
    ),
    ({"name": "key", "input": {"text": "A"}}, [{"type": "key", "keys": ["A"]}]),
    ({"name": "key", "input": {"text": "+"}}, [{"type": "key", "keys": ["+"]}]),
    (
        {"name": "hold_key", "input": {"text": "shift", "duration": 1}},
        [{"type": "hold_key", "keys": ["shift"], "seconds": 1.0}],
    ),
    ({"name": "wait", "input": {"duration": 2}}, [{"type": "wait", "seconds": 2.0}]),
    ({"name": "cursor_position", "input": {}}, [{"type": "cursor_position"}]),
    ({"name": "screenshot", "input": {}}, [{"type": "screenshot"}]),
    (
        {"name": "zoom", "input": {"region": [0, 0, 100, 50]}},
        [{"type": "zoom", "region": [0, 0, 100, 50]}],
    ),
]


@pytest.mark.parametrize("call, expected", ANTHROPIC_CASES)
def test_anthropic_every_member(call: dict, expected: list) -> None:
    assert translate(A26, call) == expected
    flat = {"action": call["name"], **call["input"]}
    if call["name"] != "zoom":
        assert translate(A25, flat) == expected
    assert translate(A11, flat) == expected
    assert translate("computer_20251124", flat) == expected


def test_anthropic_members_from_sdk_tool_use_blocks() -> None:
    """A block parsed by the anthropic SDK, dumped as it would be forwarded, translates."""
    beta = pytest.importorskip("anthropic.types.beta")
    block = beta.BetaComputerLeftClickToolUseBlock(
        id="toolu_1",
        type="tool_use",
        name="left_click",
        toolset_name="computer",
        input={"coordinate": [100, 50], "text": "ctrl"},
    )
    got = translate(A26, block.model_dump(exclude_none=True))
    assert got == [{"type": "click", "x": 100, "y": 50, "modifiers": ["ctrl"]}]


def test_zoom_not_in_the_2025_01_tool() -> None:
    with pytest.raises(DialectError) as err:
        translate(A25, {"action": "zoom", "region": [0, 0, 1, 1]})
    assert err.value.field == "action" and "left_click" in err.value.allowed


OPENAI_CASES = [
    (
        {"type": "click", "button": "left", "x": 3, "y": 4},
        [{"type": "click", "button": "left", "x": 3, "y": 4}],
    ),
    (
        {"type": "click", "button": "right", "x": 3, "y": 4},
        [{"type": "right_click", "x": 3, "y": 4}],
    ),
    (
        {"type": "click", "button": "wheel", "x": 3, "y": 4},
        [{"type": "click", "button": "middle", "x": 3, "y": 4}],
    ),
    (
        {"type": "click", "button": "back", "x": 3, "y": 4},
        [{"type": "click", "button": "back", "x": 3, "y": 4}],
    ),
    (
        {"type": "click", "button": "forward", "x": 3, "y": 4, "keys": ["CTRL"]},
        [{"type": "click", "button": "forward", "x": 3, "y": 4, "modifiers": ["ctrl"]}],
    ),
    ({"type": "double_click", "x": 1, "y": 1}, [{"type": "double_click", "x": 1, "y": 1}]),
    (
        {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 30, "y": 40}]},
        [{"type": "drag", "x": 1, "y": 2, "to_x": 30, "to_y": 40}],
    ),
    (
        {
            "type": "drag",
            "path": [{"x": 1, "y": 2}, {"x": 5, "y": 5}, {"x": 30, "y": 40}],
            "keys": ["SHIFT"],
        },
        [
            {"type": "mouse_down", "x": 1, "y": 2, "modifiers": ["shift"]},
            {"type": "move", "x": 5, "y": 5, "duration": 0.05, "modifiers": ["shift"]},
            {"type": "move", "x": 30, "y": 40, "duration": 0.05, "modifiers": ["shift"]},
            {"type": "mouse_up", "x": 30, "y": 40, "modifiers": ["shift"]},
        ],
    ),
    ({"type": "keypress", "keys": ["CTRL", "C"]}, [{"type": "hotkey", "keys": ["ctrl", "c"]}]),
    ({"type": "keypress", "keys": ["ENTER"]}, [{"type": "key", "keys": ["enter"]}]),
    ({"type": "keypress", "keys": ["ARROWLEFT"]}, [{"type": "key", "keys": ["left"]}]),
    ({"type": "move", "x": 9, "y": 8}, [{"type": "move", "x": 9, "y": 8}]),
    ({"type": "screenshot"}, [{"type": "screenshot"}]),
    (
        {"type": "scroll", "x": 5, "y": 6, "scroll_x": 0, "scroll_y": 300},
        [{"type": "scroll", "dy": -3, "x": 5, "y": 6}],
    ),
    (
        {"type": "scroll", "x": 5, "y": 6, "scroll_x": -40, "scroll_y": 0, "keys": ["shift"]},
        [{"type": "scroll", "dx": -1, "x": 5, "y": 6, "modifiers": ["shift"]}],
    ),
    ({"type": "type", "text": "a<b"}, [{"type": "type", "text": "a<b"}]),
    ({"type": "wait"}, [{"type": "wait", "seconds": D.OPENAI_WAIT_S}]),
]


@pytest.mark.parametrize("call, expected", OPENAI_CASES)
def test_openai_every_action(call: dict, expected: list) -> None:
    assert translate(OAI, call) == expected
    assert translate("computer", call) == expected


def test_openai_actions_from_sdk_types() -> None:
    ca = pytest.importorskip("openai.types.responses.computer_action")
    action = ca.Drag(type="drag", path=[ca.DragPath(x=1, y=2), ca.DragPath(x=3, y=4)])
    got = translate(OAI, action.model_dump(exclude_none=True))
    assert got == [{"type": "drag", "x": 1, "y": 2, "to_x": 3, "to_y": 4}]


def test_scale_both_ways() -> None:
    assert translate(A26, {"name": "left_click", "input": {"coordinate": [480, 270]}}, HALF) == [
        {"type": "click", "x": 961, "y": 541}
    ]
    assert translate(OAI, {"type": "move", "x": 959, "y": 539}, HALF) == [
        {"type": "move", "x": 1919, "y": 1079}
    ]
    assert HALF.to_model(1919, 1079) == (959, 539)
    zoom = translate(A26, {"name": "zoom", "input": {"region": [0, 0, 960, 540]}}, HALF)
    assert zoom == [{"type": "zoom", "region": [0, 0, 1920, 1080]}]
    odd = Scale(1280, 800, 1920, 1080)
    assert odd.to_screen(640, 400) == (960, 540)
    assert odd.to_model(960, 540) == (640, 400)
    for scale in (odd, HALF, Scale(1024, 768, 1920, 1080), Scale()):
        for x in range(0, scale.model_width, 7):
            y = x * scale.model_height // scale.model_width
            assert scale.to_model(*scale.to_screen(x, y)) == (x, y), (scale, x)


MALFORMED = [
    (A26, {"name": "left_clik", "input": {}}, "name", "left_click"),
    (A26, {"name": "left_click", "input": {"coordinate": [1]}}, "coordinate", "[x, y]"),
    (
        A26,
        {"name": "left_click", "input": {"coordinate": [1, 2], "button": "x"}},
        "button",
        "fields",
    ),
    (
        A26,
        {"name": "left_click", "input": {"coordinate": [5000, 2]}},
        "coordinate",
        "0 <= x < 1920",
    ),
    (A26, {"name": "left_click", "input": {"coordinate": ["a", 2]}}, "coordinate", "numbers"),
    (A26, {"name": "left_click", "input": {"text": "ctrl+s"}}, "text", "modifier keys only"),
    (A26, {"name": "left_click", "input": [1]}, "input", "an object"),
    (A26, {"name": "left_click", "inputs": {}}, "inputs", "{name, input}"),
    (
        A26,
        {"name": "scroll", "input": {"scroll_direction": "sideways", "scroll_amount": 1}},
        "scroll_direction",
        "up, down, left, right",
    ),
    (
        A26,
        {"name": "scroll", "input": {"scroll_direction": "up", "scroll_amount": 0}},
        "scroll_amount",
        "[1, 100]",
    ),
    (A26, {"name": "scroll", "input": {"scroll_direction": "up"}}, "scroll_amount", "given"),
    (A26, {"name": "type", "input": {"text": ""}}, "text", "non-empty string"),
    (A26, {"name": "type", "input": {}}, "text", "given"),
    (A26, {"name": "key", "input": {"text": "ctrl+"}}, "text", "key names"),
    (A26, {"name": "key", "input": {"text": "a", "repeat": 0}}, "repeat", "[1, 100]"),
    (A26, {"name": "hold_key", "input": {"text": "a", "duration": 99}}, "duration", "[0, 60]"),
    (A26, {"name": "wait", "input": {"duration": -1}}, "duration", "[0, 60]"),
    (A26, {"name": "zoom", "input": {"region": [10, 10, 5, 20]}}, "region", "x0 < x1"),
    (A26, {"name": "zoom", "input": {"region": [0, 0, 1]}}, "region", "[x0, y0, x1, y1]"),
    (A26, {"name": "zoom", "input": {"region": [0, 0, 3000, 10]}}, "region", "within"),
    (
        A26,
        {"name": "left_click_drag", "input": {"start_coordinate": [1, 1]}},
        "coordinate",
        "given",
    ),
    (A26, "left_click", "action", "an object"),
    (A11, {"action": "fly"}, "action", "zoom"),
    (OAI, {"type": "tap", "x": 1, "y": 1}, "type", "click, double_click"),
    (
        OAI,
        {"type": "click", "button": "middle", "x": 1, "y": 1},
        "button",
        "left, right, wheel, back, forward",
    ),
    (OAI, {"type": "click", "x": 1, "y": 1}, "button", "given"),
    (OAI, {"type": "click", "button": "left", "x": 1, "y": True}, "x, y", "numbers"),
    (OAI, {"type": "drag", "path": [{"x": 1, "y": 1}]}, "path", "2 to 64 points"),
    (OAI, {"type": "drag", "path": [{"x": 1, "y": 1}, {"x": 2}]}, "path[1]", "a point"),
    (
        OAI,
        {"type": "scroll", "x": 1, "y": 1, "scroll_x": 0, "scroll_y": 0},
        "scroll_x, scroll_y",
        "not both 0",
    ),
    (
        OAI,
        {"type": "scroll", "x": 1, "y": 1, "scroll_x": 0.5, "scroll_y": 1},
        "scroll_x",
        "an integer",
    ),
    (OAI, {"type": "keypress", "keys": []}, "keys", "1 to 8"),
    (OAI, {"type": "keypress", "keys": "ctrl"}, "keys", "a list"),
    (OAI, {"type": "move", "x": 1, "y": 1, "keys": ["a"]}, "keys", "modifier keys only"),
    (OAI, {"type": "type", "text": 5}, "text", "non-empty string"),
    (OAI, {"type": "wait", "ms": 5}, "ms", "no fields"),
]


@pytest.mark.parametrize("dialect, call, field, allowed", MALFORMED)
def test_malformed_names_dialect_field_and_allowed(
    dialect: str, call: object, field: str, allowed: str
) -> None:
    with pytest.raises(DialectError) as err:
        translate(dialect, call)
    assert err.value.field == field
    assert allowed in err.value.allowed
    assert str(err.value).startswith(dialect)
    assert field in str(err.value)


def test_unknown_dialect() -> None:
    with pytest.raises(DialectError) as err:
        translate("claude", {})
    assert err.value.field == "dialect" and "anthropic-2026-08" in err.value.allowed


def test_batch_checks_every_call_first_and_names_its_index() -> None:
    calls = [{"type": "move", "x": 1, "y": 1}, {"type": "type", "text": ""}]
    with pytest.raises(DialectError) as err:
        translate_batch(OAI, calls)
    assert err.value.field == "actions[1].text"
    assert translate_batch(OAI, calls[:1]) == [[{"type": "move", "x": 1, "y": 1}]]


def test_translated_actions_pass_the_guest_protocol() -> None:
    """What the translator emits, the guest accepts (the observations are the daemon's)."""
    protocol = pytest.importorskip("drumsd.guest.protocol")
    for dialect, cases in ((A26, ANTHROPIC_CASES), (OAI, OPENAI_CASES)):
        for call, _ in cases:
            for action in translate(dialect, call):
                if action["type"] not in D.OBSERVATIONS:
                    protocol.parse_action(action)
