"""Text input types exactly what it is given: every printable ASCII character and common Unicode,
through the `type` action and through pyautogui's write, typewrite, press and hotkey in step code,
typed into `cat > FILE` in the desktop's xterm and read back from the file.

Before the keyboard followed the keymap, `<` came out as `>` on every image (pyautogui pressed
Shift with the unshifted `less` of the <> key) and write/press dropped non-ASCII characters.
base and office on the session's daemon (seconds each once their template is made); the osworld
image opt-in (DRUMS_LIVE_OSWORLD=1), on a daemon of its own.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from pathlib import Path

import drums
import pytest
from live_daemon import Daemon, osworld_opt_in, start_live_daemon, stop_and_clean

ASCII = "".join(c for c in string.printable if c.isprintable())  # the 95 from ' ' to '~'
UNICODE = "é ü ß € ñ Å ø — “q” 中文 日本語 ✓ 😀"
TEXT = ASCII + " " + UNICODE


@pytest.fixture(scope="module", params=["base", "office", "osworld"])
def image_daemon(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Daemon]]:
    """The session's daemon for base; a daemon of its own for office, and for osworld opt-in."""
    image = request.param
    if image == "base":
        yield image, request.getfixturevalue("live_daemon")
        return
    if image == "osworld":
        osworld_opt_in("typing on the osworld image")
    tmp = Path(tmp_path_factory.mktemp(f"live-typed-{image}"))
    daemon = start_live_daemon(tmp, image=image, start_limit_s=120)
    try:
        yield image, daemon
    finally:
        stop_and_clean(daemon, tmp)


def typed_back(env: drums.Env, name: str, steps: list) -> str:
    """Start `cat > /tmp/NAME` in the xterm, run `steps`, end the line and the file, read it."""
    path = f"/tmp/{name}"
    env.step({"type": "execute", "command": ["rm", "-f", path]})
    # The xterm, placed at +40+40 by the desktop init (a terminal on the osworld image, below).
    env.step({"type": "click", "x": 300, "y": 200})
    env.step({"type": "type", "text": f"cat > {path}\n"})
    for step in steps:
        env.step(step)
    env.step({"type": "key", "key": "enter"})
    env.step({"type": "hotkey", "keys": ["ctrl", "d"]})
    out = env.step({"type": "execute", "command": ["sh", "-c", f"sleep 0.3; cat {path}"]})
    assert out.output is not None and out.output.returncode == 0, out
    return out.output.stdout.removesuffix("\n")


def check_every_path(env: drums.Env) -> None:
    got = typed_back(env, "type", [{"type": "type", "text": TEXT}])
    assert got == TEXT, f"type action typed {got!r}"
    for call in ("write", "typewrite"):
        got = typed_back(env, call, [f"pyautogui.{call}({TEXT!r})"])
        assert got == TEXT, f"pyautogui.{call} typed {got!r}"
    got = typed_back(env, "press", [f"for c in {TEXT!r}: pyautogui.press(c, _pause=False)"])
    assert got == TEXT, f"pyautogui.press typed {got!r}"
    # hotkey with one character (OSWorld's agents emit hotkey('shift', ',') for '<' too).
    code = "pyautogui.hotkey('<'); pyautogui.hotkey('shift', ','); pyautogui.hotkey('é')"
    keys = [{"type": "key", "key": c} for c in "<>ü"]
    got = typed_back(env, "hotkey", [code, *keys])
    assert got == "<<é<>ü", f"pyautogui.hotkey / key typed {got!r}"


def test_text_is_typed_exactly(image_daemon: tuple[str, Daemon]) -> None:
    image, daemon = image_daemon
    with drums.connect(daemon.url, token=daemon.token) as client:
        with client.create(image=image) as env:
            if image == "osworld":
                # The osworld session has no desktop xterm: open one where typed_back clicks.
                # Its output away from the step's pipes: an xterm holding them kept the execute
                # step waiting for its end (30 s, the step's timeout).
                xterm = "setsid -f xterm -geometry 100x30+40+40 </dev/null >/dev/null 2>&1"
                env.step({"type": "execute", "command": xterm})
                env.step({"type": "wait", "seconds": 3})
            check_every_path(env)
