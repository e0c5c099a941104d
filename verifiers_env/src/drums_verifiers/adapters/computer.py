"""One `computer` tool call (drums vocabulary) -> one drumsd action, shared by the adapters."""

from __future__ import annotations

from typing import Any

from drums_verifiers import actions

ACTIONS = (
    "click",
    "double_click",
    "right_click",
    "move",
    "drag",
    "scroll",
    "type",
    "key",
    "hotkey",
    "wait",
    "screenshot",
    "done",
    "fail",
)

TOOL_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "computer",
        "description": (
            "Act on the Linux desktop; returns the screenshot after the action. Coordinates are "
            "pixels of the latest screenshot. action: click|double_click|right_click|move (x, y), "
            "drag (x, y, to_x, to_y), scroll (x, y, amount; positive up), type (text), "
            "key (key, e.g. 'enter' or 'ctrl+s'), hotkey (keys), wait (seconds), screenshot, "
            "done, fail."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "action": {"type": "string", "enum": list(ACTIONS)},
                "x": {"type": "number"},
                "y": {"type": "number"},
                "to_x": {"type": "number"},
                "to_y": {"type": "number"},
                "amount": {"type": "integer"},
                "text": {"type": "string"},
                "key": {"type": "string"},
                "keys": {"type": "array", "items": {"type": "string"}},
                "seconds": {"type": "number"},
            },
            "required": ["action"],
        },
    },
}


def computer_action(screen: actions.Screen, args: dict[str, Any]) -> dict[str, Any] | None:
    """The drumsd action for a call, or None for `screenshot` (look without acting)."""
    name = args.get("action")
    if name in ("click", "double_click", "right_click", "move"):
        return actions.click(screen, args.get("x"), args.get("y"), name)
    if name == "drag":
        return actions.drag(
            screen, args.get("x"), args.get("y"), args.get("to_x"), args.get("to_y")
        )
    if name == "scroll":
        return actions.scroll(screen, args.get("x"), args.get("y"), args.get("amount"))
    if name == "type":
        return actions.type_text(args.get("text"))
    if name == "key":
        return actions.key(args.get("key"))
    if name == "hotkey":
        return actions.hotkey(args.get("keys"))
    if name == "wait":
        return actions.wait(args.get("seconds", 1.0))
    if name in ("done", "fail"):
        return {"type": name}
    if name == "screenshot":
        return None
    raise actions.BadAction(f"unknown action {name!r}; use one of {', '.join(ACTIONS)}")
