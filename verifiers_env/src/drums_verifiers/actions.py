"""Pure translation from the model's tool calls to drumsd action dicts, and screen scaling.

Every tool style ends here, so the three vocabularies share one set of checks: coordinates are
mapped from screenshot space (possibly scaled) to screen pixels, and bad arguments become a
`BadAction` whose message the model reads as the tool result.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from drums.vocabulary import POINTER_ACTIONS

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

    def to_screen(self, x: Any, y: Any) -> tuple[int, int]:
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


def split_keys(keys: Any) -> list[str]:
    """Accept "ctrl+s", "ctrl s", ["ctrl", "s"]: models write combinations every way."""
    if isinstance(keys, str):
        parts = keys.replace("+", " ").split()
    elif isinstance(keys, list | tuple):
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


# --- the `drums` style: one tool per action ---------------------------------------------------


def click(screen: Screen, x: Any, y: Any, kind: str = "click") -> dict[str, Any]:
    sx, sy = screen.to_screen(x, y)
    return {"type": kind, "x": sx, "y": sy}


def drag(screen: Screen, x: Any, y: Any, to_x: Any, to_y: Any) -> dict[str, Any]:
    sx, sy = screen.to_screen(x, y)
    tx, ty = screen.to_screen(to_x, to_y)
    return {"type": "drag", "x": sx, "y": sy, "to_x": tx, "to_y": ty}


def scroll(screen: Screen, x: Any, y: Any, amount: Any) -> dict[str, Any]:
    sx, sy = screen.to_screen(x, y)
    return {"type": "scroll", "x": sx, "y": sy, "clicks": clamp_scroll(amount)}


def type_text(text: Any) -> dict[str, Any]:
    return {"type": "type", "text": require_text(text)}


def key(name: Any) -> dict[str, Any]:
    keys = split_keys(name)
    if len(keys) > 1:
        return {"type": "hotkey", "keys": keys}
    return {"type": "key", "key": keys[0]}


def hotkey(keys: Any) -> dict[str, Any]:
    return {"type": "hotkey", "keys": split_keys(keys)}


def wait(seconds: Any) -> dict[str, Any]:
    return {"type": "wait", "seconds": wait_seconds(seconds)}


# --- the `scalecua` style: one `computer` tool with the ScaleCUA vocabulary --------------------

SCALECUA_ACTIONS = (
    "click",
    "doubleClick",
    "rightClick",
    "moveTo",
    "dragTo",
    "scroll",
    "write",
    "press",
    "hotkey",
    "wait",
    "terminate",
    "response",
)


def scalecua_action(
    screen: Screen, cursor: tuple[int, int] | None, args: dict[str, Any]
) -> dict[str, Any]:
    """One ScaleCUA-style call -> one drumsd action. `dragTo` starts at the last known cursor
    position, as in the pyautogui-like vocabulary ScaleCUA describes."""
    name = args.get("action")
    if name not in SCALECUA_ACTIONS:
        raise BadAction(f"unknown action {name!r}; use one of {', '.join(SCALECUA_ACTIONS)}")
    if name == "click":
        clicks = int(args.get("clicks") or 1)
        button = args.get("button") or "left"
        kind = {"left": "click", "right": "right_click"}.get(button)
        if kind is None:
            raise BadAction("button must be 'left' or 'right'")
        if clicks == 2 and kind == "click":
            kind = "double_click"
        elif clicks != 1:
            raise BadAction("clicks must be 1 or 2")
        return click(screen, args.get("x"), args.get("y"), kind)
    if name == "doubleClick":
        return click(screen, args.get("x"), args.get("y"), "double_click")
    if name == "rightClick":
        return click(screen, args.get("x"), args.get("y"), "right_click")
    if name == "moveTo":
        return click(screen, args.get("x"), args.get("y"), "move")
    if name == "dragTo":
        if cursor is None:
            raise BadAction("dragTo starts at the cursor; call moveTo first")
        tx, ty = screen.to_screen(args.get("x"), args.get("y"))
        return {"type": "drag", "x": cursor[0], "y": cursor[1], "to_x": tx, "to_y": ty}
    if name == "scroll":
        x, y = args.get("x"), args.get("y")
        if x is None or y is None:
            if cursor is None:
                raise BadAction("scroll needs x and y (or a cursor position from moveTo)")
            return {
                "type": "scroll",
                "x": cursor[0],
                "y": cursor[1],
                "clicks": clamp_scroll(args.get("clicks")),
            }
        return scroll(screen, x, y, args.get("clicks"))
    if name == "write":
        return type_text(args.get("message", args.get("text")))
    if name == "press":
        return key(args.get("keys", args.get("key")))
    if name == "hotkey":
        return hotkey(args.get("keys"))
    if name == "wait":
        return wait(args.get("seconds", 1.0))
    if name == "terminate":
        status = args.get("status", "success")
        if status not in ("success", "failure"):
            raise BadAction("terminate status must be 'success' or 'failure'")
        return {"type": "done" if status == "success" else "fail"}
    # response: the agent answers in text; on a desktop that ends the episode as done.
    return {"type": "done"}


def cursor_after(action: dict[str, Any], cursor: tuple[int, int] | None) -> tuple[int, int] | None:
    if action["type"] == "drag":
        return action["to_x"], action["to_y"]
    if "x" in action and "y" in action:
        return action["x"], action["y"]
    return cursor


# --- the `hybrid` style's extra tools ----------------------------------------------------------


def shell(command: Any, timeout_s: float) -> dict[str, Any]:
    return {
        "type": "execute",
        "command": ["bash", "-lc", require_text(command, "command")],
        "timeout_s": timeout_s,
    }


def read_file(path: Any, max_bytes: int = 20_000, timeout_s: float = 30.0) -> dict[str, Any]:
    path = require_text(path, "path")
    return {
        "type": "execute",
        "command": ["head", "-c", str(max_bytes), "--", path],
        "timeout_s": timeout_s,
    }


def write_file(path: Any, content: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    path = require_text(path, "path")
    if not isinstance(content, str):
        raise BadAction("content must be a string")
    # The content travels as an argument, never through a shell, so quoting cannot break it.
    script = "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])"
    return {
        "type": "execute",
        "command": ["python3", "-c", script, path, content],
        "timeout_s": timeout_s,
    }


def launch_app(app: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    app = require_text(app, "app")
    if any(c in app for c in ";|&`$<>\n"):
        raise BadAction("app must be a program name with plain arguments, no shell syntax")
    return {
        "type": "execute",
        "command": ["bash", "-lc", f"setsid -f {app} >/dev/null 2>&1"],
        "timeout_s": timeout_s,
    }


# --- screenshots --------------------------------------------------------------------------------


def scale_png(png: bytes, scale: float) -> bytes:
    """The screenshot as the model sees it; unchanged at scale 1 (no decode, no re-encode)."""
    if scale == 1.0:
        return png
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        out = io.BytesIO()
        image.convert("RGB").resize(size).save(out, format="PNG")
        return out.getvalue()


def describe(action: dict[str, Any]) -> str:
    """One line for the tool result, so the model's transcript says what happened."""
    kind = action["type"]
    if kind in POINTER_ACTIONS:
        return f"{kind} at ({action['x']}, {action['y']})"
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
    return kind
