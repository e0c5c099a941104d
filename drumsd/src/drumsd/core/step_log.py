"""The steps of each slot's episodes, kept in memory for the console's episode timeline.

Steps are not journaled one by one (a step must stay cheap), so this is the only per-step
record: what the action was, when it started, how long it took and how it ended. Bounded per
slot and in slots; lost on a daemon restart (the journal keeps the episode's other events).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

STEPS_PER_SLOT = 500
MAX_SLOTS = 4096
DETAIL_CHARS = 120
# The fields that say what an action did, in the order they are worth showing.
DETAIL_FIELDS = ("code", "command", "text", "keys", "key", "seconds", "x", "y", "button")


@dataclass(frozen=True)
class Step:
    episode: int
    episode_id: str | None
    index: int  # the slot's action count after this step (1 = the episode's first)
    action: str
    detail: str
    started_at: float  # wall clock, like the journal's ts
    elapsed_s: float
    error: str | None = None  # the refusal's or failure's code when the step did not run
    returncode: int | None = None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def describe(action: str | Mapping[str, Any]) -> tuple[str, str]:
    """(type, a one-line detail) of a step's action, as the API received it."""
    if isinstance(action, str):
        return "pyautogui", _short(action)
    kind = str(action.get("type", "?"))
    parts = []
    for name in DETAIL_FIELDS:
        value = action.get(name)
        if value is None:
            continue
        if isinstance(value, list | tuple):
            value = "+".join(str(v) for v in value)
        parts.append(str(value) if name in ("code", "command", "text") else f"{name}={value}")
    return kind, _short(" ".join(parts))


def _short(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= DETAIL_CHARS else line[: DETAIL_CHARS - 1] + "…"


class StepLog:
    """slot id -> its last STEPS_PER_SLOT steps; the least recently stepped slot goes first
    past MAX_SLOTS (a destroyed slot is forgotten when destroyed)."""

    def __init__(self, per_slot: int = STEPS_PER_SLOT, max_slots: int = MAX_SLOTS) -> None:
        self.per_slot = per_slot
        self.max_slots = max_slots
        self._slots: OrderedDict[str, deque[Step]] = OrderedDict()

    def add(self, slot_id: str, step: Step) -> None:
        steps = self._slots.pop(slot_id, None)
        if steps is None:
            steps = deque(maxlen=self.per_slot)
        steps.append(step)
        self._slots[slot_id] = steps
        while len(self._slots) > self.max_slots:
            self._slots.popitem(last=False)

    def of(self, slot_id: str, episode_id: str | None = None) -> list[Step]:
        """The slot's kept steps, only those of `episode_id` when given."""
        steps = self._slots.get(slot_id, ())
        return [s for s in steps if episode_id is None or s.episode_id == episode_id]

    def forget(self, slot_id: str) -> None:
        self._slots.pop(slot_id, None)

    def __len__(self) -> int:
        return len(self._slots)
