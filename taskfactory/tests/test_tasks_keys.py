"""Keys that the live desktop really acts on.

- pyautogui's X11 backend silently drops a key name it has no mapping for: `hotkey('ctrl',
  'minus')` sent Ctrl alone (the key is '-'), so calc_export_csv's header_dropped near miss never
  deleted its row and scored 1 on the live validator. Every key name a solution presses must be
  one of the names below, each checked against pyautogui 0.9.54's X11 key map.
- The Impress keyboard route never types over a Ctrl+A selection. Measured on the office image
  (LibreOffice 7.4): text typed over Ctrl+A's selection in a python-pptx body placeholder goes
  wrong after about 20 characters, so the oracle of impress_edit_body scored 0 on the live
  validator. `impress.clear_text` empties the object and re-enters edit mode first.
"""

from __future__ import annotations

import re
import string

import pytest
from drums_tasks import FAMILIES, load_all
from drums_tasks.build import generate

load_all()
KNOWN_KEYS = set(string.ascii_lowercase + string.digits) | {
    "backspace",
    "ctrl",
    "delete",
    "down",
    "end",
    "enter",
    "escape",
    "f2",
    "home",
    "left",
    "pagedown",
    "pageup",
    "right",
    "shift",
    "space",
    "tab",
    "up",
}
KEY_CALL = re.compile(r"pyautogui\.(?:hotkey|press)\((.*?)\)(?:;|$)")


def pressed_keys(action: str) -> list[str]:
    return [k for call in KEY_CALL.findall(action) for k in re.findall(r"'([^']*)'", call)]


def test_pressed_keys_reads_hotkeys_and_presses() -> None:
    assert pressed_keys("import pyautogui; pyautogui.hotkey('ctrl', 'minus')") == ["ctrl", "minus"]
    assert pressed_keys("import pyautogui; pyautogui.press('tab', presses=2, interval=0.05)") == [
        "tab"
    ]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_pressed_key_is_one_pyautogui_maps(family: str) -> None:
    for index in range(2):
        _tid, spec = generate(1, family, index)
        for sol in [spec.oracle, *spec.near_misses]:
            for action in sol.actions:
                if isinstance(action, str):
                    unknown = set(pressed_keys(action)) - KNOWN_KEYS
                    assert not unknown, (family, index, sol.name, action)


# Every family whose solutions retype slide text through `impress.retype`.
SLIDE_TEXT_FAMILIES = [
    "impress_edit_body",
    "impress_edit_title",
    "impress_title_suffix",
    "impress_uppercase_title",
    "multi_text_title_to_pptx",
]


def typed_over_selection(actions: list) -> list[str]:
    """The writes that would land on a live Ctrl+A selection."""
    selecting = False
    bad = []
    for a in actions:
        if not isinstance(a, str):
            continue
        if "hotkey('ctrl', 'a')" in a:
            selecting = True
        elif "'backspace'" in a or "'delete'" in a:
            selecting = False
        elif "pyautogui.write(" in a and selecting:
            bad.append(a)
    return bad


def test_the_scan_catches_typing_over_a_selection() -> None:
    select = "import pyautogui; pyautogui.hotkey('ctrl', 'a')"
    typing = "import pyautogui; pyautogui.write('x', interval=0.02)"
    erase = "import pyautogui; pyautogui.press('backspace', presses=1, interval=0.05)"
    assert typed_over_selection([select, typing]) == [typing]
    assert typed_over_selection([select, erase, typing]) == []


@pytest.mark.parametrize("family", SLIDE_TEXT_FAMILIES)
def test_slide_text_is_typed_into_an_emptied_object(family: str) -> None:
    assert family in FAMILIES
    for index in range(4):
        _tid, spec = generate(1, family, index)
        for sol in [spec.oracle, *spec.near_misses]:
            assert any("pyautogui.write(" in a for a in sol.actions if isinstance(a, str))
            assert typed_over_selection(sol.actions) == [], (family, index, sol.name)
