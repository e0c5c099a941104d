"""Vendors' computer-use actions -> drums actions: the dialects as data, one translator.

A dialect is a vendor's computer tool as its official SDK types spell it:

  anthropic-2025-01   the single tool `computer_20250124`: {"action": NAME, "coordinate": [x, y]}
  anthropic-2025-11   the single tool `computer_20251124`: the same, plus `zoom` (region)
  anthropic-2026-08   the toolset `computer_toolset_20260801`: one tool per member, a call is
                      {"name": MEMBER, "input": {...}} (a tool_use block; id/type/toolset_name
                      are ignored)
  openai              the Responses API `computer` tool: {"type": "click", "x": .., "y": .., ...}

`translate` turns one call into a list of drums action dicts (what `POST /v1/slots/{id}/step` and
the guest run), plus two observations the daemon answers itself: {"type": "screenshot"} and
{"type": "zoom", "region": [x0, y0, x1, y1]} (screen pixels). Coordinates come in the model's
screen space (`Scale`) and go out in the desktop's. A call that is wrong raises `DialectError`
naming the dialect, the field and what is allowed. Pure: no I/O (daemon, SDK, MCP and verifiers
share it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ANTHROPIC_2025_01 = "anthropic-2025-01"
ANTHROPIC_2025_11 = "anthropic-2025-11"
ANTHROPIC_2026_08 = "anthropic-2026-08"
OPENAI = "openai"
DIALECTS: Tuple[str, ...] = (ANTHROPIC_2025_01, ANTHROPIC_2025_11, ANTHROPIC_2026_08, OPENAI)
# The vendors' own names for them (their tool `type`), accepted as the dialect too.
DIALECT_ALIASES: Dict[str, str] = {
    "computer_20250124": ANTHROPIC_2025_01,
    "computer_20251124": ANTHROPIC_2025_11,
    "computer_toolset_20260801": ANTHROPIC_2026_08,
    "computer": OPENAI,
    "computer_use_preview": OPENAI,
}

# Anthropic's member tools (BetaComputerMemberName), in the SDK's order.
ANTHROPIC_MEMBERS: Tuple[str, ...] = (
    "key",
    "hold_key",
    "type",
    "cursor_position",
    "mouse_move",
    "left_mouse_down",
    "left_mouse_up",
    "left_click",
    "left_click_drag",
    "right_click",
    "middle_click",
    "double_click",
    "triple_click",
    "scroll",
    "wait",
    "screenshot",
    "zoom",
)
# Per dialect: the action names it has and, per name, its (required, optional) fields.
_CLICK = ((), ("coordinate", "text"))
ANTHROPIC_FIELDS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "key": (("text",), ("repeat",)),
    "hold_key": (("text", "duration"), ()),
    "type": (("text",), ()),
    "cursor_position": ((), ()),
    "mouse_move": (("coordinate",), ("text",)),
    "left_mouse_down": ((), ("coordinate",)),
    "left_mouse_up": ((), ("coordinate",)),
    "left_click": _CLICK,
    "left_click_drag": (("coordinate",), ("start_coordinate", "text")),
    "right_click": _CLICK,
    "middle_click": _CLICK,
    "double_click": _CLICK,
    "triple_click": _CLICK,
    "scroll": (("scroll_direction", "scroll_amount"), ("coordinate", "text")),
    "wait": ((), ("duration",)),
    "screenshot": ((), ()),
    "zoom": (("region",), ()),
}
ANTHROPIC_2025_01_ACTIONS = tuple(m for m in ANTHROPIC_MEMBERS if m != "zoom")
OPENAI_FIELDS: Dict[str, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {
    "click": (("button", "x", "y"), ("keys",)),
    "double_click": (("x", "y"), ("keys",)),
    "drag": (("path",), ("keys",)),
    "keypress": (("keys",), ()),
    "move": (("x", "y"), ("keys",)),
    "screenshot": ((), ()),
    "scroll": (("x", "y", "scroll_x", "scroll_y"), ("keys",)),
    "type": (("text",), ()),
    "wait": ((), ()),
}
OPENAI_BUTTONS = ("left", "right", "wheel", "back", "forward")
SCROLL_DIRECTIONS = ("up", "down", "left", "right")
# OpenAI scrolls in pixels (a browser's wheel delta); one wheel click is 100 of them.
OPENAI_SCROLL_PX_PER_CLICK = 100
OPENAI_WAIT_S = 2.0  # `wait` has no duration in OpenAI's tool; its sample harness sleeps 2 s
MAX_SCROLL_CLICKS = 100
MAX_WAIT_S = 60.0
MAX_REPEAT = 100
MAX_DRAG_POINTS = 64
OBSERVATIONS = ("screenshot", "zoom")

# Key names as the vendors send them (xdotool keysyms for Anthropic, upper-case words for OpenAI)
# -> pyautogui's names, which the guest presses. Looked up lower-cased; names not here pass as
# they are (pyautogui's own names, single characters).
KEY_NAMES: Dict[str, str] = {
    "return": "enter",
    "kp_enter": "enter",
    "escape": "esc",
    "back_space": "backspace",
    "del": "delete",
    "page_up": "pageup",
    "prior": "pageup",
    "page_down": "pagedown",
    "next": "pagedown",
    "pgup": "pageup",
    "pgdn": "pagedown",
    "control": "ctrl",
    "control_l": "ctrl",
    "control_r": "ctrlright",
    "ctrl_l": "ctrl",
    "shift_l": "shift",
    "shift_r": "shiftright",
    "alt_l": "alt",
    "alt_r": "altright",
    "option": "alt",
    "super": "win",
    "super_l": "win",
    "super_r": "winright",
    "meta": "win",
    "cmd": "win",
    "command": "win",
    "arrowup": "up",
    "arrowdown": "down",
    "arrowleft": "left",
    "arrowright": "right",
    "caps_lock": "capslock",
    "num_lock": "numlock",
    "scroll_lock": "scrolllock",
    "print": "printscreen",
    "menu": "apps",
    "minus": "-",
    "plus": "+",
    "equal": "=",
    "comma": ",",
    "period": ".",
    "slash": "/",
    "backslash": "\\",
    "semicolon": ";",
    "apostrophe": "'",
    "grave": "`",
    "bracketleft": "[",
    "bracketright": "]",
}
KEY_NAMES.update({f"kp_{d}": f"num{d}" for d in range(10)})
MODIFIERS = ("ctrl", "ctrlright", "shift", "shiftright", "alt", "altright", "win", "winright")


class DialectError(ValueError):
    """A call its dialect does not allow: `dialect`, the `field` at fault (dotted, e.g.
    "coordinate" or "path[2].x") and the `allowed` values or shape; the message says all three."""

    def __init__(self, dialect: str, field: str, allowed: str, got: Any = None) -> None:
        self.dialect, self.field, self.allowed = dialect, field, allowed
        got_text = "" if got is None else f", got {got!r}"
        super().__init__(f"{dialect}: {field} must be {allowed}{got_text}")


@dataclass(frozen=True)
class Scale:
    """The model's screen (its screenshot size, the space of its coordinates) and the desktop's.
    Coordinates in are mapped model -> desktop, cursor positions out desktop -> model."""

    model_width: int = 1920
    model_height: int = 1080
    screen_width: int = 1920
    screen_height: int = 1080

    @property
    def identity(self) -> bool:
        return (self.model_width, self.model_height) == (self.screen_width, self.screen_height)

    # Pixel centres map to pixels: a model pixel goes to the screen pixel under its centre, and
    # back to itself (cursor_position after mouse_move(x, y) says (x, y) at any scale).
    def to_screen(self, x: float, y: float) -> Tuple[int, int]:
        sx = min(
            self.screen_width - 1, math.floor((x + 0.5) * self.screen_width / self.model_width)
        )
        sy = min(
            self.screen_height - 1, math.floor((y + 0.5) * self.screen_height / self.model_height)
        )
        return sx, sy

    def to_model(self, x: int, y: int) -> Tuple[int, int]:
        mx = min(self.model_width - 1, math.floor((x + 0.5) * self.model_width / self.screen_width))
        my = min(
            self.model_height - 1, math.floor((y + 0.5) * self.model_height / self.screen_height)
        )
        return mx, my


def normalize_dialect(name: Any) -> str:
    dialect = DIALECT_ALIASES.get(name, name) if isinstance(name, str) else name
    if dialect not in DIALECTS:
        raise DialectError(
            "dialect", "dialect", f"one of {', '.join(DIALECTS + tuple(DIALECT_ALIASES))}", name
        )
    return dialect


class _Call:
    """One call being read: its fields, with checks that name the dialect and field."""

    def __init__(self, dialect: str, name: str, fields: Dict[str, Any], scale: Scale) -> None:
        self.dialect, self.name, self.fields, self.scale = dialect, name, fields, scale

    def bad(self, field: str, allowed: str, got: Any = None) -> DialectError:
        return DialectError(f"{self.dialect} {self.name}", field, allowed, got)

    def check_fields(self, required: Sequence[str], optional: Sequence[str]) -> None:
        allowed = ", ".join((*required, *optional)) or "no fields"
        for name in required:
            if self.fields.get(name) is None:
                raise self.bad(name, f"given (fields: {allowed})")
        unknown = sorted(k for k, v in self.fields.items() if k not in (*required, *optional))
        if unknown:
            raise self.bad(unknown[0], f"absent: not a field of {self.name} (fields: {allowed})")

    def number(self, field: str, value: Any, lo: float, hi: float, integer: bool = True) -> Any:
        kind = "an integer" if integer else "a number"
        ok_type = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, ok_type):
            raise self.bad(field, f"{kind} in [{lo:g}, {hi:g}]", value)
        if not (math.isfinite(value) and lo <= value <= hi):
            raise self.bad(field, f"{kind} in [{lo:g}, {hi:g}]", value)
        return value

    def point(self, field: str, x: Any, y: Any) -> Tuple[int, int]:
        s = self.scale
        bounds = f"within the {s.model_width}x{s.model_height} screen"
        for axis, value, limit in (("x", x, s.model_width), ("y", y, s.model_height)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self.bad(field, f"numbers {bounds}", value)
            if not (math.isfinite(value) and 0 <= value < limit):
                raise self.bad(field, f"0 <= {axis} < {limit} ({bounds})", value)
        return s.to_screen(x, y)

    def pair(self, field: str) -> Optional[Tuple[int, int]]:
        value = self.fields.get(field)
        if value is None:
            return None
        if not isinstance(value, (list, tuple)) or len(value) != 2:
            raise self.bad(field, "[x, y]", value)
        return self.point(field, value[0], value[1])

    def text(self, field: str) -> str:
        value = self.fields.get(field)
        if not isinstance(value, str) or value == "":
            raise self.bad(field, "a non-empty string", value)
        return value

    def keys(self, field: str, value: Any) -> List[str]:
        """A key combination: "ctrl+shift+Escape" (Anthropic) or ["CTRL", "C"] (OpenAI)."""
        if isinstance(value, str):
            parts = value.split("+") if value != "+" else ["+"]
        elif isinstance(value, (list, tuple)):
            parts = list(value)
        else:
            raise self.bad(field, "a key combination such as 'ctrl+s' or ['CTRL', 'S']", value)
        if not parts or len(parts) > 8 or not all(isinstance(p, str) and p.strip() for p in parts):
            raise self.bad(field, "1 to 8 non-empty key names such as 'ctrl+s'", value)
        names = [key_name(p.strip()) for p in parts]
        if len(names) > 1:  # ctrl+A means ctrl+a: a combination names keys, not characters
            names = [n.lower() if len(n) == 1 else n for n in names]
        return names

    def modifiers(self, field: str) -> List[str]:
        value = self.fields.get(field)
        if value is None or value == "" or value == []:
            return []
        keys = self.keys(field, value)
        if not all(k in MODIFIERS for k in keys):
            raise self.bad(field, f"modifier keys only ({', '.join(MODIFIERS)})", value)
        return keys


def key_name(raw: str) -> str:
    lowered = raw.lower()
    if len(raw) == 1:
        return raw
    return KEY_NAMES.get(lowered, lowered)


def _held(action: Dict[str, Any], modifiers: List[str]) -> Dict[str, Any]:
    if modifiers:
        action["modifiers"] = modifiers
    return action


def _at(action: Dict[str, Any], point: Optional[Tuple[int, int]]) -> Dict[str, Any]:
    if point is not None:
        action["x"], action["y"] = point
    return action


# --- Anthropic ----------------------------------------------------------------------------------


def _anthropic(c: _Call) -> List[Dict[str, Any]]:
    name = c.name
    c.check_fields(*ANTHROPIC_FIELDS[name])
    if name in ("left_click", "right_click", "middle_click", "double_click", "triple_click"):
        clicks: Dict[str, Dict[str, Any]] = {
            "left_click": {"type": "click"},
            "right_click": {"type": "right_click"},
            "middle_click": {"type": "click", "button": "middle"},
            "double_click": {"type": "double_click"},
            "triple_click": {"type": "click", "clicks": 3},
        }
        return [_held(_at(dict(clicks[name]), c.pair("coordinate")), c.modifiers("text"))]
    if name == "mouse_move":
        return [_held(_at({"type": "move"}, c.pair("coordinate")), c.modifiers("text"))]
    if name in ("left_mouse_down", "left_mouse_up"):
        kind = "mouse_down" if name == "left_mouse_down" else "mouse_up"
        return [_at({"type": kind}, c.pair("coordinate"))]
    if name == "left_click_drag":
        end = c.pair("coordinate")
        start = c.pair("start_coordinate")
        drag: Dict[str, Any] = {"type": "drag", "to_x": end[0], "to_y": end[1]}  # type: ignore[index]
        return [_held(_at(drag, start), c.modifiers("text"))]
    if name == "scroll":
        direction = c.fields["scroll_direction"]
        if direction not in SCROLL_DIRECTIONS:
            raise c.bad("scroll_direction", f"one of {', '.join(SCROLL_DIRECTIONS)}", direction)
        amount = c.number("scroll_amount", c.fields["scroll_amount"], 1, MAX_SCROLL_CLICKS)
        axis = "dy" if direction in ("up", "down") else "dx"
        sign = 1 if direction in ("up", "right") else -1
        scroll = {"type": "scroll", axis: sign * amount}
        return [_held(_at(scroll, c.pair("coordinate")), c.modifiers("text"))]
    if name == "type":
        return [{"type": "type", "text": c.text("text")}]
    if name == "key":
        keys = c.keys("text", c.text("text"))
        repeat = c.number("repeat", c.fields.get("repeat", 1), 1, MAX_REPEAT)
        one = {"type": "hotkey", "keys": keys} if len(keys) > 1 else {"type": "key", "keys": keys}
        return [dict(one) for _ in range(repeat)]
    if name == "hold_key":
        keys = c.keys("text", c.text("text"))
        seconds = c.number("duration", c.fields["duration"], 0, MAX_WAIT_S, integer=False)
        return [{"type": "hold_key", "keys": keys, "seconds": float(seconds)}]
    if name == "wait":
        seconds = c.number("duration", c.fields.get("duration", 1), 0, MAX_WAIT_S, integer=False)
        return [{"type": "wait", "seconds": float(seconds)}]
    if name == "cursor_position":
        return [{"type": "cursor_position"}]
    if name == "screenshot":
        return [{"type": "screenshot"}]
    region = c.fields["region"]  # zoom
    if not isinstance(region, (list, tuple)) or len(region) != 4:
        raise c.bad("region", "[x0, y0, x1, y1]", region)
    c.point("region", region[0], region[1])  # checks x0, y0
    s = c.scale
    x0 = math.floor(region[0] * s.screen_width / s.model_width)  # edges, not pixel centres
    y0 = math.floor(region[1] * s.screen_height / s.model_height)
    for value, limit in ((region[2], s.model_width), (region[3], s.model_height)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise c.bad("region", "[x0, y0, x1, y1] of numbers", region)
        if not 0 < value <= limit:
            raise c.bad("region", f"[x0, y0, x1, y1] within {s.model_width}x{s.model_height}")
    if not (region[0] < region[2] and region[1] < region[3]):
        raise c.bad("region", "[x0, y0, x1, y1] with x0 < x1 and y0 < y1", region)
    x1 = min(s.screen_width, math.ceil(region[2] * s.screen_width / s.model_width))
    y1 = min(s.screen_height, math.ceil(region[3] * s.screen_height / s.model_height))
    return [{"type": "zoom", "region": [x0, y0, x1, y1]}]


_ANTHROPIC_BLOCK_KEYS = ("id", "type", "toolset_name", "caller", "cache_control")


def _anthropic_call(dialect: str, call: Any, scale: Scale) -> List[Dict[str, Any]]:
    if not isinstance(call, dict):
        raise DialectError(dialect, "action", "an object", type(call).__name__)
    if dialect == ANTHROPIC_2026_08:
        members = ", ".join(ANTHROPIC_MEMBERS)
        name = call.get("name")
        if name not in ANTHROPIC_MEMBERS:
            raise DialectError(dialect, "name", f"one of {members}", name)
        extra = sorted(set(call) - {"name", "input", *_ANTHROPIC_BLOCK_KEYS})
        if extra:
            raise DialectError(dialect, extra[0], "absent: a call is {name, input}")
        fields = call.get("input") or {}
        if not isinstance(fields, dict):
            raise DialectError(f"{dialect} {name}", "input", "an object", fields)
        return _anthropic(_Call(dialect, name, fields, scale))
    names = ANTHROPIC_2025_01_ACTIONS if dialect == ANTHROPIC_2025_01 else ANTHROPIC_MEMBERS
    name = call.get("action")
    if name not in names:
        raise DialectError(dialect, "action", f"one of {', '.join(names)}", name)
    fields = {k: v for k, v in call.items() if k != "action"}
    return _anthropic(_Call(dialect, name, fields, scale))


# --- OpenAI -------------------------------------------------------------------------------------


def _scroll_clicks(c: _Call, field: str) -> int:
    pixels = c.number(field, c.fields[field], -100_000, 100_000)
    if pixels == 0:
        return 0
    clicks = max(1, round(abs(pixels) / OPENAI_SCROLL_PX_PER_CLICK))
    return int(math.copysign(min(clicks, MAX_SCROLL_CLICKS), pixels))


def _openai(c: _Call) -> List[Dict[str, Any]]:
    c.check_fields(*OPENAI_FIELDS[c.name])
    name = c.name
    held = c.modifiers("keys") if "keys" in OPENAI_FIELDS[name][1] else []
    if name == "click":
        button = c.fields["button"]
        if button not in OPENAI_BUTTONS:
            raise c.bad("button", f"one of {', '.join(OPENAI_BUTTONS)}", button)
        point = c.point("x, y", c.fields["x"], c.fields["y"])
        if button == "right":
            return [_held(_at({"type": "right_click"}, point), held)]
        action = {"type": "click", "button": {"wheel": "middle"}.get(button, button)}
        return [_held(_at(action, point), held)]
    if name == "double_click":
        point = c.point("x, y", c.fields["x"], c.fields["y"])
        return [_held(_at({"type": "double_click"}, point), held)]
    if name == "move":
        point = c.point("x, y", c.fields["x"], c.fields["y"])
        return [_held(_at({"type": "move"}, point), held)]
    if name == "drag":
        path = c.fields["path"]
        if not isinstance(path, list) or not 2 <= len(path) <= MAX_DRAG_POINTS:
            raise c.bad("path", f"a list of 2 to {MAX_DRAG_POINTS} points {{x, y}}", path)
        points = []
        for i, p in enumerate(path):
            if not isinstance(p, dict) or set(p) != {"x", "y"}:
                raise c.bad(f"path[{i}]", "a point {x, y}", p)
            points.append(c.point(f"path[{i}]", p["x"], p["y"]))
        (x, y), (to_x, to_y) = points[0], points[-1]
        if len(points) == 2:
            return [_held({"type": "drag", "x": x, "y": y, "to_x": to_x, "to_y": to_y}, held)]
        # A path of more than two points: press, follow it, release (modifiers held throughout).
        steps: List[Dict[str, Any]] = [_held({"type": "mouse_down", "x": x, "y": y}, held)]
        for px, py in points[1:]:
            steps.append(_held({"type": "move", "x": px, "y": py, "duration": 0.05}, held))
        steps.append(_held({"type": "mouse_up", "x": to_x, "y": to_y}, held))
        return steps
    if name == "scroll":
        point = c.point("x, y", c.fields["x"], c.fields["y"])
        dx, dy = _scroll_clicks(c, "scroll_x"), -_scroll_clicks(c, "scroll_y")  # +y is down
        if dx == 0 and dy == 0:
            raise c.bad("scroll_x, scroll_y", "not both 0 (pixels; +y scrolls down)")
        scroll: Dict[str, Any] = {"type": "scroll"}
        if dy:
            scroll["dy"] = dy
        if dx:
            scroll["dx"] = dx
        return [_held(_at(scroll, point), held)]
    if name == "keypress":
        if not isinstance(c.fields["keys"], list):
            raise c.bad("keys", "a list of key names such as ['CTRL', 'C']", c.fields["keys"])
        keys = c.keys("keys", c.fields["keys"])
        return [
            {"type": "hotkey", "keys": keys} if len(keys) > 1 else {"type": "key", "keys": keys}
        ]
    if name == "type":
        return [{"type": "type", "text": c.text("text")}]
    if name == "wait":
        return [{"type": "wait", "seconds": OPENAI_WAIT_S}]
    return [{"type": "screenshot"}]


def _openai_call(call: Any, scale: Scale) -> List[Dict[str, Any]]:
    if not isinstance(call, dict):
        raise DialectError(OPENAI, "action", "an object", type(call).__name__)
    name = call.get("type")
    if name not in OPENAI_FIELDS:
        raise DialectError(OPENAI, "type", f"one of {', '.join(OPENAI_FIELDS)}", name)
    fields = {k: v for k, v in call.items() if k != "type"}
    return _openai(_Call(OPENAI, name, fields, scale))


_TRANSLATORS: Dict[str, Callable[[Any, Scale], List[Dict[str, Any]]]] = {
    ANTHROPIC_2025_01: lambda call, s: _anthropic_call(ANTHROPIC_2025_01, call, s),
    ANTHROPIC_2025_11: lambda call, s: _anthropic_call(ANTHROPIC_2025_11, call, s),
    ANTHROPIC_2026_08: lambda call, s: _anthropic_call(ANTHROPIC_2026_08, call, s),
    OPENAI: _openai_call,
}


def translate(dialect: str, call: Any, scale: Scale = Scale()) -> List[Dict[str, Any]]:
    """One vendor call -> the drums actions (and observations) that do it, in order."""
    return _TRANSLATORS[normalize_dialect(dialect)](call, scale)


def translate_batch(
    dialect: str, calls: Sequence[Any], scale: Scale = Scale()
) -> List[List[Dict[str, Any]]]:
    """Each call's actions, every call checked before any runs; the error names the call's index."""
    dialect = normalize_dialect(dialect)
    out = []
    for i, call in enumerate(calls):
        try:
            out.append(translate(dialect, call, scale))
        except DialectError as exc:
            raise DialectError(exc.dialect, f"actions[{i}].{exc.field}", exc.allowed) from None
    return out


# The table in docs/dialects.md, one row per vendor action: what drums does for it.
__all__ = [
    "ANTHROPIC_MEMBERS",
    "DIALECTS",
    "DIALECT_ALIASES",
    "OBSERVATIONS",
    "OPENAI_FIELDS",
    "DialectError",
    "Scale",
    "key_name",
    "normalize_dialect",
    "translate",
    "translate_batch",
]
