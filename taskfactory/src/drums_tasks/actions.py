"""Builders for solution steps in the daemon's action format.

GUI input is OSWorld's universal form, a pyautogui code string (each one imports pyautogui so it
runs on its own); waits and shell commands are action dicts: `{"type": "wait", "seconds": s}` and
`{"type": "execute", "command": [argv...]}` (run as the desktop user, no shell unless argv says so).
"""

from __future__ import annotations

import shlex
from typing import Any

Action = str | dict[str, Any]

# A separate LibreOffice profile for headless conversions, so they never hand their work to the
# GUI instance that already has the document open (soffice forwards to a running instance).
SOFFICE_ORACLE_PROFILE = "file:///tmp/drums-oracle-lo"
# A cold headless LibreOffice, GIMP or Chromium start can take tens of seconds on a loaded host.
HEADLESS_TIMEOUT_S = 180.0


def _py(code: str) -> str:
    return f"import pyautogui; {code}"


def press(key: str, presses: int = 1) -> str:
    return _py(f"pyautogui.press({key!r}, presses={presses}, interval=0.05)")


def hotkey(*keys: str) -> str:
    return _py(f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})")


# pyautogui sends '<' as Shift + the "less" key, which X keymaps (Xvfb's default) turn into '>':
# measured with LibreOffice under Xvfb. Solutions must not type it.
UNTYPABLE = "<"


def write(text: str) -> str:
    if not text.isascii():
        raise ValueError(f"pyautogui cannot type non-ASCII text {text!r}; generate ASCII values")
    if any(c in text for c in UNTYPABLE):
        raise ValueError(f"{text!r} has {UNTYPABLE!r}, which pyautogui mistypes; avoid it")
    return _py(f"pyautogui.write({text!r}, interval=0.02)")


def wait(seconds: float) -> dict[str, Any]:
    return {"type": "wait", "seconds": seconds}


def execute(argv: list[str], timeout_s: float | None = None) -> dict[str, Any]:
    act: dict[str, Any] = {"type": "execute", "command": list(argv)}
    if timeout_s is not None:
        act["timeout_s"] = timeout_s
    return act


def shell(script: str) -> dict[str, Any]:
    return execute(["sh", "-c", script])


def activate_window(name_regex: str) -> dict[str, Any]:
    """Focus a window by title; after a restore focus follows the dump-time map order.

    `search --sync` waits (up to 60 s) for the window: LibreOffice titles a window with the
    document's name only once the document is loaded, so keys never go to a half-open app.
    """
    q = shlex.quote(name_regex)
    return shell(f"timeout 60 xdotool search --sync --name {q} windowactivate --sync || true")


def activate_class(cls: str) -> dict[str, Any]:
    return shell(f"xdotool search --class {shlex.quote(cls)} windowactivate --sync || true")


def terminal(command: str) -> list[Action]:
    """Type a command into the task's xterm as an agent would, then give it time to run."""
    return [activate_class("xterm"), wait(0.5), write(command), press("enter"), wait(1.0)]


def soffice_convert(src: str, fmt: str, outdir: str) -> dict[str, Any]:
    """LibreOffice's own headless converter; `fmt` is a --convert-to target like `pdf`."""
    return execute(
        [
            "soffice",
            f"-env:UserInstallation={SOFFICE_ORACLE_PROFILE}",
            "--headless",
            "--convert-to",
            fmt,
            "--outdir",
            outdir,
            src,
        ],
        timeout_s=HEADLESS_TIMEOUT_S,
    )


def office_save(keep_format_dialog: bool = True) -> list[Action]:
    """Ctrl+S; for OOXML files LibreOffice asks to keep the format: Enter picks the default (keep).

    If the image has the dialog disabled, the extra Enter lands in the document after the save
    and so never reaches the file the checker reads.
    """
    steps: list[Action] = [hotkey("ctrl", "s"), wait(1.5)]
    if keep_format_dialog:
        steps += [press("enter"), wait(1.5)]
    return steps
