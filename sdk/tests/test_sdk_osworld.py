"""OSWorld's computer_13 actions become pyautogui code (or drums' terminal actions)."""

from __future__ import annotations

import pytest

from drums.osworld import DesktopEnv, computer_13_code


def test_computer_13_actions_become_pyautogui_code() -> None:
    click = {"action_type": "CLICK", "parameters": {"x": 5, "y": 6, "num_clicks": 2}}
    assert computer_13_code(click) == "pyautogui.click(5, 6, button='left', clicks=2)"
    assert computer_13_code({"action_type": "TYPING", "parameters": {"text": "a'b"}}) == (
        'pyautogui.typewrite("a\'b")'
    )
    hotkey = {"action_type": "HOTKEY", "parameters": {"keys": ["ctrl", "s"]}}
    assert computer_13_code(hotkey) == "pyautogui.hotkey('ctrl', 's')"
    assert computer_13_code({"action_type": "DONE"}) == {"type": "done"}
    assert computer_13_code({"action_type": "FAIL"}) == {"type": "fail"}
    with pytest.raises(ValueError, match="not a computer_13 action type: 'JUMP'"):
        computer_13_code({"action_type": "JUMP"})


def test_an_unknown_action_space_is_refused() -> None:
    with pytest.raises(ValueError, match="computer_13 or pyautogui"):
        DesktopEnv(action_space="som")
