"""The console's state on its own: steps land in the slot's episode timeline (pyautogui code and
a dialect batch each described in one line), a destroyed slot's screenshot and steps go."""

from __future__ import annotations

import pytest
from drums.models import StepRequest
from drumsd.core.records import SlotRecord
from drumsd.runtime.console_state import ConsoleState

pytestmark = pytest.mark.unit


def test_steps_land_in_the_episode_timeline_and_go_with_the_slot() -> None:
    console = ConsoleState()
    rec = SlotRecord(id="s1", created_at=1.0, last_used_at=1.0, checkpoint="c", episode=2)
    rec.episode_id, rec.actions = "e2", 5
    console.log_step(rec, StepRequest(action="pyautogui.click(1, 2)"), 10.0, 0.123456, returncode=0)
    batch = StepRequest(dialect="openai", actions=[{"type": "click"}, {"type": "scroll"}])
    console.log_step(rec, batch, 11.0, 0.5, error="conflict")
    steps = console.step_log.of("s1", "e2")
    assert [(s.action, s.index, s.elapsed_s) for s in steps] == [
        ("pyautogui", 5, 0.1235),
        ("openai", 5, 0.5),
    ]
    assert "click(1, 2)" in steps[0].detail and steps[1].error == "conflict"
    assert console.step_log.of("s1", "an older episode") == []
    console.last_screenshot["s1"] = b"png"
    console.forget("s1")
    assert console.step_log.of("s1") == [] and "s1" not in console.last_screenshot
