"""Tool arguments -> drumsd action dicts, with one set of checks for every tool front end.

`drums mcp` and the verifiers tool servers both build their actions here: coordinates are mapped
from screenshot space (possibly scaled) to screen pixels, and a bad argument becomes a `BadAction`
whose message says what to send instead (the model or MCP client reads it as the tool result).
Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

from .vocabulary import POINTER_ACTIONS

SCROLL_LIMIT = 100
WAIT_LIMIT_S = 60.0
KEY_ALIASES = {
    "return": "enter",
    "escape": "esc",
    "del": "delete",
    "control": "ctrl",
    "cmd": "super",
    "win": "super",
    "meta": "super",
    "option": "alt",
    "pgup": "pageup",
    "pgdn": "pagedown",
}


class BadAction(ValueError):
    """The model asked for something the desktop cannot do; the message says how to fix it."""


@dataclass(frozen=True)
class Screen:
    """Screen size in pixels and the factor screenshots are scaled by for the model."""

    width: int = 1920
    height: int = 1080
    scale: float = 1.0

    def to_screen(self, x: Any, y: Any) -> Tuple[int, int]:
        try:
            fx, fy = float(x), float(y)
        except (TypeError, ValueError) as exc:
            raise BadAction(f"coordinates must be numbers, got x={x!r}, y={y!r}") from exc
        sx, sy = round(fx / self.scale), round(fy / self.scale)
        if not (0 <= sx < self.width and 0 <= sy < self.height):
            w, h = round(self.width * self.scale), round(self.height * self.scale)
            raise BadAction(
                f"({x}, {y}) is outside the screenshot; use 0 <= x < {w} and 0 <= y < {h}"
            )
        return sx, sy


def normalize_key(key: str) -> str:
    key = key.strip().lower()
    if not key:
        raise BadAction("a key name is empty; use names like 'enter', 'tab', 'ctrl'")
    return KEY_ALIASES.get(key, key)


def split_keys(keys: Any) -> List[str]:
    """Accept "ctrl+s", "ctrl s", ["ctrl", "s"]: models write combinations every way."""
    if isinstance(keys, str):
        parts = keys.replace("+", " ").split()
    elif isinstance(keys, (list, tuple)):
        parts = [str(k) for k in keys]
    else:
        raise BadAction(f"keys must be a string like 'ctrl+s' or a list, got {keys!r}")
    if not parts:
        raise BadAction("no keys given; pass e.g. 'ctrl+s' or ['ctrl', 's']")
    if len(parts) > 8:
        raise BadAction("at most 8 keys can be pressed together")
    return [normalize_key(p) for p in parts]


def clamp_scroll(amount: Any) -> int:
    try:
        value = int(amount)
    except (TypeError, ValueError) as exc:
        raise BadAction(f"scroll amount must be an integer, got {amount!r}") from exc
    if value == 0 or abs(value) > SCROLL_LIMIT:
        raise BadAction(
            f"scroll amount must be between -{SCROLL_LIMIT} and {SCROLL_LIMIT}, "
            "not 0 (positive scrolls up, negative down)"
        )
    return value


def wait_seconds(seconds: Any) -> float:
    try:
        value = float(seconds)
    except (TypeError, ValueError) as exc:
        raise BadAction(f"seconds must be a number, got {seconds!r}") from exc
    if not 0 <= value <= WAIT_LIMIT_S:
        raise BadAction(f"wait between 0 and {WAIT_LIMIT_S:g} seconds")
    return value


def require_text(text: Any, what: str = "text") -> str:
    if not isinstance(text, str) or text == "":
        raise BadAction(f"{what} must be a non-empty string")
    return text


# --- one builder per action type -----------------------------------------------------------------


def click(screen: Screen, x: Any, y: Any, kind: str = "click") -> Dict[str, Any]:
    sx, sy = screen.to_screen(x, y)
    return {"type": kind, "x": sx, "y": sy}


def drag(screen: Screen, x: Any, y: Any, to_x: Any, to_y: Any) -> Dict[str, Any]:
    sx, sy = screen.to_screen(x, y)
    tx, ty = screen.to_screen(to_x, to_y)
    return {"type": "drag", "x": sx, "y": sy, "to_x": tx, "to_y": ty}


def scroll(screen: Screen, x: Any, y: Any, amount: Any) -> Dict[str, Any]:
    sx, sy = screen.to_screen(x, y)
    return {"type": "scroll", "x": sx, "y": sy, "clicks": clamp_scroll(amount)}


def type_text(text: Any) -> Dict[str, Any]:
    return {"type": "type", "text": require_text(text)}


def key(name: Any) -> Dict[str, Any]:
    keys = split_keys(name)
    if len(keys) > 1:
        return {"type": "hotkey", "keys": keys}
    return {"type": "key", "key": keys[0]}


def hotkey(keys: Any) -> Dict[str, Any]:
    return {"type": "hotkey", "keys": split_keys(keys)}


def wait(seconds: Any) -> Dict[str, Any]:
    return {"type": "wait", "seconds": wait_seconds(seconds)}


def execute(command: Any, timeout_s: float = 30.0) -> Dict[str, Any]:
    """A shell command run as the desktop user (bash -lc), not through the pointer or keyboard."""
    return {
        "type": "execute",
        "command": ["bash", "-lc", require_text(command, "command")],
        "timeout_s": timeout_s,
    }


def describe(action: Dict[str, Any]) -> str:
    """One line for the tool result, so the model's transcript says what happened."""
    kind = action["type"]
    if kind in POINTER_ACTIONS:
        return f"{kind} at ({action['x']}, {action['y']})" if "x" in action else str(kind)
    if kind == "drag":
        return f"drag ({action['x']}, {action['y']}) -> ({action['to_x']}, {action['to_y']})"
    if kind == "scroll":
        return f"scroll {action['clicks']} at ({action['x']}, {action['y']})"
    if kind == "type":
        return f"typed {len(action['text'])} characters"
    if kind == "key":
        return f"pressed {action['key']}"
    if kind == "hotkey":
        return f"pressed {'+'.join(action['keys'])}"
    if kind == "wait":
        return f"waited {action['seconds']:g}s"
    return str(kind)
