"""The verifiers tool styles' translation to drumsd actions: the ScaleCUA vocabulary, the hybrid
style's file and shell tools, and screenshot scaling.

The per-action builders and their checks are the SDK's `drums.actions` (shared with `drums mcp`),
re-exported here so every tool style keeps calling `actions.click(...)` and so on.
"""

from __future__ import annotations

import io
from typing import Any

from drums.actions import (
    KEY_ALIASES,
    SCROLL_LIMIT,
    WAIT_LIMIT_S,
    BadAction,
    Screen,
    clamp_scroll,
    click,
    describe,
    drag,
    execute,
    hotkey,
    key,
    normalize_key,
    require_text,
    scroll,
    split_keys,
    type_text,
    wait,
    wait_seconds,
)

__all__ = [
    "KEY_ALIASES",
    "SCROLL_LIMIT",
    "WAIT_LIMIT_S",
    "BadAction",
    "Screen",
    "clamp_scroll",
    "click",
    "cursor_after",
    "describe",
    "drag",
    "hotkey",
    "key",
    "launch_app",
    "normalize_key",
    "read_file",
    "require_text",
    "scale_png",
    "scalecua_action",
    "scroll",
    "shell",
    "shot_options",
    "split_keys",
    "type_text",
    "wait",
    "wait_seconds",
    "write_file",
]


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
    return execute(command, timeout_s)


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


def shot_options(
    screen: list[int] | tuple[int, int],
    scale: float,
    fmt: str = "png",
    quality: int | None = None,
) -> bool | dict[str, Any]:
    """The daemon's screenshot options for what the model sees: the screen times `scale` (the
    size `scale_png` gives, so the coordinate mapping is the same) in `fmt`; True (a PNG of the
    whole screen, nothing to ask) when that is all."""
    options: dict[str, Any] = {}
    if scale != 1.0:
        width, height = screen
        options["width"] = max(1, round(width * scale))
        options["height"] = max(1, round(height * scale))
    if fmt != "png":
        options["format"] = fmt
        if quality is not None:
            options["quality"] = quality
    return options or True
