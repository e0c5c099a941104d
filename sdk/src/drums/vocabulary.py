"""The words daemon and SDK share: the action types an agent may send and the gates of an episode.

Defined once here (stdlib only), imported by the SDK's wire models, drumsd's core (re-exported as
`drumsd.core.vocabulary`), the supervisor's action checks, the verifiers tools and the fake drumsd.
The guest agent stays stdlib-only inside the desktop image and keeps its own copy in
`drumsd.guest.protocol`; a test keeps that copy equal to this one.
"""

from __future__ import annotations

from typing import Literal, get_args

ActionType = Literal[
    "pyautogui",
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
    "execute",
    "done",
    "fail",
    # What vendors' computer tools need beyond OSWorld's set (drums.dialects translates to them).
    "mouse_down",
    "mouse_up",
    "hold_key",
    "cursor_position",
]
ACTION_TYPES: tuple[str, ...] = get_args(ActionType)
# OSWorld's DONE and FAIL: they end the episode and reach no desktop.
TERMINAL_ACTIONS: tuple[str, ...] = ("done", "fail")
# Actions at a point: x and y come together (both or neither; neither = where the pointer is).
POINTER_ACTIONS: tuple[str, ...] = (
    "click",
    "double_click",
    "right_click",
    "move",
    "mouse_down",
    "mouse_up",
)
# The fields an action type needs besides `type`, checked by the daemon before the desktop sees it.
ACTION_REQUIRES: dict[str, tuple[str, ...]] = {
    "pyautogui": ("code",),
    "drag": ("to_x", "to_y"),
    "scroll": ("clicks",),
    "type": ("text",),
    "key": ("key",),
    "hotkey": ("keys",),
    "wait": ("seconds",),
    "execute": ("command",),
    "hold_key": ("keys", "seconds"),
}

# Every gate of an episode's report, in report order; START_GATES are judged when it begins.
GATES: tuple[str, ...] = (
    "lock_applied",
    "cgroup",
    "init_identity",
    "mount_table",
    "netns",
    "guest_ready",
    "state_hash",
    "isolation",
    "alive_after_resume",
    "no_oom_kill",
    "no_app_crash",
    "display_server",
    "not_quarantined",
)
START_GATES: tuple[str, ...] = GATES[:8]

__all__ = [
    "ACTION_REQUIRES",
    "ACTION_TYPES",
    "GATES",
    "POINTER_ACTIONS",
    "START_GATES",
    "TERMINAL_ACTIONS",
    "ActionType",
]
