"""The action worker: a child of the agent that runs steps with pyautogui already imported.

Steps run here, not in the agent, so code that hangs or crashes takes down only this process: the
agent kills it on timeout and starts a new one. It talks to the agent over one socket (inherited
fd) with length-prefixed JSON messages: {"action": {...}} in, {"ok": ..., "result"|"error"} out.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import traceback
from typing import Any

from . import protocol

_LEN = struct.Struct(">I")
OUTPUT_LIMIT = 64 << 10


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message, separators=(",", ":")).encode()
    sock.sendall(_LEN.pack(len(data)) + data)


def recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    chunks = []
    while n:
        chunk = sock.recv(n)
        if not chunk:
            return None
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def recv_message(sock: socket.socket) -> dict[str, Any] | None:
    head = recv_exactly(sock, _LEN.size)
    if head is None:
        return None
    body = recv_exactly(sock, _LEN.unpack(head)[0])
    return None if body is None else json.loads(body)


def run_command(
    command: str | list[str] | tuple[str, ...], timeout: float | None
) -> dict[str, Any]:
    """An `execute` action: run it in a session of its own and, past its timeout, kill that
    whole process group (issue 14: killing the shell alone left `sleep 600` running)."""
    shell = isinstance(command, str)
    try:
        proc = subprocess.Popen(
            command if shell else list(command),
            shell=shell,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as exc:
        raise ActionFailed("failed", f"execute: cannot start {command!r}: {exc}") from exc
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        raise ActionFailed(
            "timeout", f"execute: still running after {timeout} s; its process group was killed"
        ) from exc
    return {
        "rc": proc.returncode,
        "stdout": out[-OUTPUT_LIMIT:].decode(errors="replace"),
        "stderr": err[-OUTPUT_LIMIT:].decode(errors="replace"),
    }


class ActionFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Keyboard:
    """Presses each character on the key the desktop's keymap gives it, with Shift exactly when
    the keymap puts it on a key's shifted level; a character on no key (é, €, 中, emoji) is bound
    to a spare keycode first.

    pyautogui decides Shift from a US-layout table and takes the keycode where the keysym sits at
    the lowest level: on the desktops' keymap `less` is unshifted on the <> key, so pyautogui
    pressed Shift with it and typed `>` for every `<` (OSWorld rewrites its agents' code around
    this; here the keys are right instead). pyautogui drops characters on no key; xdotool binds and
    unbinds a keycode around each press, which races with the app reading the keymap. Here a
    binding stays until its keycode is reused, round-robin over every unused keycode (~100 on
    Xvfb's keymap), and the mapping change reaches each client (MappingNotify) before the key
    event does."""

    def __init__(self) -> None:
        from Xlib import X, display
        from Xlib.ext import xtest

        self.X, self.xtest = X, xtest
        self.display = display.Display()
        first = self.display.display.info.min_keycode
        count = self.display.display.info.max_keycode - first + 1
        mapping = self.display.get_keyboard_mapping(first, count)
        self.spare = [first + i for i, syms in enumerate(mapping) if not any(syms)]
        self.next_spare = 0
        self.bound: dict[int, int] = {}  # keysym -> spare keycode bound to it
        self.shift = self.display.keysym_to_keycode(0xFFE1)  # Shift_L

    @staticmethod
    def keysym_of(char: str) -> int:
        code = ord(char)
        return code if 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xFF else 0x01000000 | code

    def key_of(self, char: str) -> tuple[int, bool]:
        """(keycode, shifted) that types `char`, binding a spare keycode when no key has it."""
        keysym = self.keysym_of(char)
        for code, index in self.display.keysym_to_keycodes(keysym):
            if index in (0, 1):
                return code, index == 1
        keycode = self.bound.get(keysym, 0)
        if keycode:
            return keycode, False
        if not self.spare:
            raise ActionFailed("failed", f"typing {char!r}: the keymap has no unused keycode")
        keycode = self.spare[self.next_spare]
        self.next_spare = (self.next_spare + 1) % len(self.spare)
        self.bound = {k: c for k, c in self.bound.items() if c != keycode}
        self.bound[keysym] = keycode
        self.display.change_keyboard_mapping(keycode, [(keysym, keysym)])
        self.display.sync()
        return keycode, False

    def key_down(self, char: str) -> None:
        keycode, shifted = self.key_of(char)
        press = self.X.KeyPress
        if shifted:
            self.xtest.fake_input(self.display, press, self.shift)
        self.xtest.fake_input(self.display, press, keycode)
        if shifted:
            self.xtest.fake_input(self.display, self.X.KeyRelease, self.shift)
        self.display.sync()

    def key_up(self, char: str) -> None:
        keycode, _ = self.key_of(char)
        self.xtest.fake_input(self.display, self.X.KeyRelease, keycode)
        self.display.sync()

    def type_char(self, char: str) -> None:
        self.key_down(char)
        self.key_up(char)


# Single characters pyautogui maps to named keys (Return, Tab, BackSpace): its own table is right.
_NAMED_CHARS = ("\n", "\r", "\t", "\b")


def exact_keys(pyautogui: Any) -> None:
    """Route every single character pyautogui presses (press, write, typewrite, hotkey, keyDown,
    keyUp: all go through its platform module's _keyDown/_keyUp) to one Keyboard, made on first
    use, so agents' own pyautogui code types what it says; named keys stay pyautogui's."""
    platform = pyautogui.platformModule
    # pyautogui's platform hooks have no public name; they are the one place every key goes.
    named_down, named_up = platform._keyDown, platform._keyUp  # noqa: SLF001 - pyautogui's
    keyboard: list[Keyboard] = []

    def board() -> Keyboard:
        if not keyboard:
            keyboard.append(Keyboard())
        return keyboard[0]

    def key_down(key: Any) -> None:
        if isinstance(key, str) and len(key) == 1 and key not in _NAMED_CHARS:
            board().key_down(key)
        else:
            named_down(key)

    def key_up(key: Any) -> None:
        if isinstance(key, str) and len(key) == 1 and key not in _NAMED_CHARS:
            board().key_up(key)
        else:
            named_up(key)

    platform._keyDown, platform._keyUp = key_down, key_up  # noqa: SLF001 - pyautogui's


class Executor:
    """Performs validated actions with pyautogui (X test events through the worker's own X
    connection), its characters typed by exact_keys' Keyboard."""

    def __init__(self) -> None:
        import pyautogui

        pyautogui.FAILSAFE = False  # agents legitimately click in screen corners
        exact_keys(pyautogui)
        self.pyautogui = pyautogui
        self.default_pause = pyautogui.PAUSE
        self.namespace_base = {
            "pyautogui": pyautogui,
            "time": time,
            "os": os,
            "subprocess": subprocess,
        }

    def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        try:
            action = protocol.parse_action(raw)
        except protocol.ProtocolError as exc:
            raise ActionFailed(exc.code, exc.message) from None
        handler = getattr(self, f"_do_{action.type}")
        pg = self.pyautogui
        # Code from OSWorld-style agents expects pyautogui's default pause between calls;
        # structured actions are one call each and do not need it.
        pg.PAUSE = self.default_pause if action.type == "pyautogui" else 0.0
        return handler(action) or {}

    def _check_keys(self, keys: tuple[str, ...]) -> None:
        # Any single character is a key: exact_keys types it whatever the keymap.
        unknown = [k for k in keys if len(k) != 1 and k.lower() not in self.pyautogui.KEYBOARD_KEYS]
        if unknown:
            raise ActionFailed(
                "invalid_action",
                f"unknown key name(s) {unknown}; use pyautogui names such as enter, tab, "
                "ctrl, shift, alt, win, esc, backspace, up, f1, a",
            )

    def _at(self, action: protocol.Action) -> dict[str, int]:
        return {} if action.x is None else {"x": action.x, "y": action.y}

    def _do_pyautogui(self, action: protocol.Action) -> dict[str, Any]:
        namespace = dict(self.namespace_base)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                exec(compile(action.code, "<action>", "exec"), namespace)
        except SystemExit:
            pass
        except Exception as exc:
            tb = traceback.format_exception(exc)
            raise ActionFailed(
                "failed", f"{type(exc).__name__}: {exc}\n{''.join(tb[-3:])}"
            ) from None
        return {"stdout": out.getvalue()[-OUTPUT_LIMIT:], "stderr": err.getvalue()[-OUTPUT_LIMIT:]}

    @contextlib.contextmanager
    def _held(self, keys: tuple[str, ...]) -> Any:
        """Keys held down around an action (ctrl+click, shift+scroll), released in reverse even
        when the action fails."""
        self._check_keys(keys)
        pressed: list[str] = []
        try:
            for key in keys:
                self.pyautogui.keyDown(key)
                pressed.append(key)
            yield
        finally:
            for key in reversed(pressed):
                self.pyautogui.keyUp(key)

    def _button(self, button: str, down: bool, up: bool) -> None:
        """Back and forward (X buttons 8 and 9), which pyautogui has no names for."""
        from Xlib import X
        from Xlib.ext import xtest

        display = self.pyautogui.platformModule._display  # noqa: SLF001 - pyautogui's X display
        number = {"back": 8, "forward": 9}[button]
        if down:
            xtest.fake_input(display, X.ButtonPress, number)
        if up:
            xtest.fake_input(display, X.ButtonRelease, number)
        display.sync()

    def _click(self, a: protocol.Action, clicks: int, button: str, interval: float = 0.0) -> None:
        with self._held(a.modifiers):
            if button in ("back", "forward"):
                if a.x is not None:
                    self.pyautogui.moveTo(a.x, a.y)
                for _ in range(clicks):
                    self._button(button, True, True)
                return
            self.pyautogui.click(**self._at(a), clicks=clicks, interval=interval, button=button)

    def _do_click(self, a: protocol.Action) -> None:
        self._click(a, a.clicks, a.button, 0.05)

    def _do_double_click(self, a: protocol.Action) -> None:
        self._click(a, 2, a.button, 0.05)

    def _do_right_click(self, a: protocol.Action) -> None:
        self._click(a, 1, "right")

    def _do_move(self, a: protocol.Action) -> None:
        with self._held(a.modifiers):
            self.pyautogui.moveTo(a.x, a.y, duration=a.duration)

    def _do_drag(self, a: protocol.Action) -> None:
        pg = self.pyautogui
        with self._held(a.modifiers):
            pg.moveTo(a.x, a.y)
            pg.mouseDown(button=a.button)
            try:
                pg.moveTo(a.to_x, a.to_y, duration=a.duration)
            finally:
                pg.mouseUp(button=a.button)

    def _do_scroll(self, a: protocol.Action) -> None:
        with self._held(a.modifiers):
            if a.dy:
                self.pyautogui.scroll(a.dy, **self._at(a))
            if a.dx:
                self.pyautogui.hscroll(a.dx, **self._at(a))

    def _press(self, a: protocol.Action, down: bool) -> None:
        with self._held(a.modifiers):
            if a.button in ("back", "forward"):
                if a.x is not None:
                    self.pyautogui.moveTo(a.x, a.y)
                self._button(a.button, down, not down)
            elif down:
                self.pyautogui.mouseDown(**self._at(a), button=a.button)
            else:
                self.pyautogui.mouseUp(**self._at(a), button=a.button)

    def _do_mouse_down(self, a: protocol.Action) -> None:
        self._press(a, True)

    def _do_mouse_up(self, a: protocol.Action) -> None:
        self._press(a, False)

    def _do_hold_key(self, a: protocol.Action) -> None:
        with self._held(a.keys):
            time.sleep(a.seconds)

    def _do_cursor_position(self, a: protocol.Action) -> dict[str, Any]:
        x, y = self.pyautogui.position()
        return {"cursor": {"x": int(x), "y": int(y)}}

    def _do_type(self, a: protocol.Action) -> None:
        self.pyautogui.write(a.text)  # every character through exact_keys' Keyboard

    def _do_key(self, a: protocol.Action) -> None:
        self._check_keys(a.keys)
        for key in a.keys:
            self.pyautogui.press(key)

    def _do_hotkey(self, a: protocol.Action) -> None:
        self._check_keys(a.keys)
        self.pyautogui.hotkey(*a.keys)

    def _do_wait(self, a: protocol.Action) -> None:
        time.sleep(a.seconds)

    def _do_execute(self, a: protocol.Action) -> dict[str, Any]:
        return run_command(a.command, a.timeout)

    def _do_done(self, a: protocol.Action) -> dict[str, Any]:
        return {"terminal": "done"}

    def _do_fail(self, a: protocol.Action) -> dict[str, Any]:
        return {"terminal": "fail"}


def run_batch(executor: Executor, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A vendor's batch in order, one result each; the first failure ends it, its message
    naming the action's index (those before it have happened)."""
    results = []
    for index, action in enumerate(actions):
        try:
            results.append(executor.run(action))
        except ActionFailed as exc:
            raise ActionFailed(
                exc.code, f"actions[{index}] ({action.get('type')}): {exc}"
            ) from None
    return results


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sock = socket.socket(fileno=int(args[0]))
    try:
        executor = Executor()
    except Exception as exc:  # no display, no pyautogui: tell the agent why, then exit
        send_message(
            sock,
            {"ok": False, "error": {"code": "failed", "message": f"worker cannot start: {exc}"}},
        )
        return 1
    send_message(sock, {"ok": True, "ready": True, "pid": os.getpid()})
    while True:
        message = recv_message(sock)
        if message is None:
            return 0
        started = time.monotonic()
        try:
            if "actions" in message:
                result = {"results": run_batch(executor, message["actions"])}
            else:
                result = executor.run(message["action"])
            reply: dict[str, Any] = {"ok": True, "result": result}
        except ActionFailed as exc:
            reply = {"ok": False, "error": {"code": exc.code, "message": str(exc)}}
        except Exception as exc:
            reply = {
                "ok": False,
                "error": {"code": "failed", "message": f"{type(exc).__name__}: {exc}"},
            }
        reply["elapsed_s"] = round(time.monotonic() - started, 4)
        send_message(sock, reply)
