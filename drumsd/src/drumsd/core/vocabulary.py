"""The action vocabulary and the gate list, from their one definition in the SDK (`drums`), which
drumsd depends on; core code imports them from here."""

from drums.vocabulary import (
    ACTION_REQUIRES,
    ACTION_TYPES,
    GATES,
    POINTER_ACTIONS,
    START_GATES,
    TERMINAL_ACTIONS,
    ActionType,
)

__all__ = [
    "ACTION_REQUIRES",
    "ACTION_TYPES",
    "GATES",
    "POINTER_ACTIONS",
    "START_GATES",
    "TERMINAL_ACTIONS",
    "ActionType",
]
