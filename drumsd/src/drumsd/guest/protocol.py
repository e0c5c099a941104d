"""Wire protocol between the host and the guest agent: pure encoding, decoding and validation.

One connection per request (no host connection may be open while CRIU dumps the slot):
  client -> agent   one JSON object on one line: {"op": ..., ...}
  agent  -> client  one JSON header line {"ok": true|false, ..., "size": N}, then N raw bytes
                    (the payload: a PNG, a file's bytes), then the agent closes the connection.
Errors: {"ok": false, "error": {"code": CODE, "message": ...}, CODE one of ERROR_CODES,
"size": 0}. Shared by the agent (inside the image, stdlib only) and drumsd's agent client.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

SOCKET_PATH = "/run/drums/agent.sock"
READY_PATH = "/run/drums/ready"
INIT_LOG_PATH = "/var/log/desktop-init.log"  # stage 1 sends desktop-init's output here
# Where desktop-init's xterm prints its text when asked (drumsd.tasks.terminal reads it):
# straight to the file in one step, plain text, the printer closed after each print.
TERMINAL_PRINT_FILE = "/tmp/.drums-terminal"
XTERM_PRINTER_RESOURCES = (
    f"XTerm*printerCommand: cat > {TERMINAL_PRINT_FILE}.part"
    f" && mv -f {TERMINAL_PRINT_FILE}.part {TERMINAL_PRINT_FILE}",
    "XTerm*printAttributes: 0",
    "XTerm*printerAutoClose: true",
)
# The accessibility-tree dump (a11y.py), as the image holds the guest package.
A11Y_SCRIPT = "/opt/drums/guest/drums_guest/a11y.py"
SCREEN_WIDTH = 1920
SCREEN_HEIGHT = 1080
MAX_REQUEST_BYTES = 1 << 20
MAX_HEADER_BYTES = 1 << 24  # exec output travels in the header
DEFAULT_STEP_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 3600.0
DEFAULT_READ_MAX_BYTES = 64 << 20

OPS = ("ping", "step", "screenshot", "read_file", "exec", "windows", "procs")
ERROR_CODES = ("invalid_action", "timeout", "not_found", "failed")
ACTION_TYPES = (
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
    "mouse_down",
    "mouse_up",
    "hold_key",
    "cursor_position",
)
BUTTONS = ("left", "right", "middle", "back", "forward")


class ProtocolError(Exception):
    """A request or reply that breaks the protocol; `code` is one of ERROR_CODES."""

    def __init__(self, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field  # the request parameter at fault, when one is


# ---------------------------------------------------------------- framing


def encode_request(request: dict[str, Any]) -> bytes:
    if request.get("op") not in OPS:
        raise ProtocolError("invalid_action", f"unknown op {request.get('op')!r}; one of {OPS}")
    return json.dumps(request, separators=(",", ":")).encode() + b"\n"


def decode_request(line: bytes) -> dict[str, Any]:
    """Parse and check the envelope of one request line (not the action itself)."""
    try:
        request = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("invalid_action", f"request is not one JSON line: {exc}") from exc
    if not isinstance(request, dict):
        raise ProtocolError("invalid_action", "request must be a JSON object")
    op = request.get("op")
    if op not in OPS:
        raise ProtocolError("invalid_action", f"unknown op {op!r}; expected one of {OPS}")
    return request


def encode_reply(header: dict[str, Any], payload: bytes = b"") -> bytes:
    header = {**header, "size": len(payload)}
    return json.dumps(header, separators=(",", ":")).encode() + b"\n" + payload


def encode_error(code: str, message: str) -> bytes:
    return encode_reply({"ok": False, "error": {"code": code, "message": message}})


def split_reply(data: bytes) -> tuple[dict[str, Any], bytes]:
    """Split a complete reply (everything read until EOF) into header and payload."""
    newline = data.find(b"\n")
    if newline < 0:
        raise ProtocolError("failed", "agent reply has no header line (connection cut short?)")
    header = decode_header(data[:newline])
    payload = data[newline + 1 :]
    if len(payload) != header["size"]:
        raise ProtocolError(
            "failed", f"agent reply payload is {len(payload)} bytes, header says {header['size']}"
        )
    return header, payload


def decode_header(line: bytes) -> dict[str, Any]:
    try:
        header = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError("failed", f"agent header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("ok"), bool):
        raise ProtocolError("failed", "agent header lacks a boolean 'ok'")
    size = header.get("size", 0)
    if not isinstance(size, int) or size < 0:
        raise ProtocolError("failed", f"agent header has a bad size {size!r}")
    header["size"] = size
    return header


def error_of(header: dict[str, Any]) -> tuple[str, str] | None:
    """(code, message) of an error reply, None for success."""
    if header.get("ok"):
        return None
    err = header.get("error") or {}
    code = err.get("code") if err.get("code") in ERROR_CODES else "failed"
    return code, str(err.get("message", "agent reported an error without a message"))


# ---------------------------------------------------------------- actions


@dataclass(frozen=True)
class Action:
    """A validated step action. Fields not used by a type keep their defaults.

    Types and fields (coordinates are screen pixels, 0 <= x < 1920, 0 <= y < 1080):
      pyautogui      code: str (Python; `pyautogui`, `time`, `os`, `subprocess` are imported)
      click          x?, y? (default: where the pointer is), button="left", clicks=1
      double_click   x?, y?, button="left"
      right_click    x?, y?
      move           x, y, duration=0
      drag           x, y (start), to_x, to_y (end), button="left", duration=0.2
      scroll         x?, y?, dy=0 (clicks, + is up; alias `clicks`), dx=0 (+ is right)
      mouse_down     x?, y?, button="left": press and hold (mouse_up releases)
      mouse_up       x?, y?, button="left"
      hold_key       keys: [str] held together for `seconds` (0..60), then released
      cursor_position  nothing: the result is the pointer's {x, y}
    click, double_click, right_click, move, drag, scroll, mouse_down and mouse_up take
    `modifiers`: [str], keys held down during the action (ctrl+click, shift+scroll); buttons are
    left, right, middle, back and forward (X buttons 8 and 9).
      type           text: str (any Unicode)
      key            keys: [str] pressed one after another (or `key`: str)
      hotkey         keys: [str] held together in order, released in reverse
      wait           seconds: 0..60
      execute        command: str (run by /bin/sh) or [str] (argv); timeout (s, default 30)
      done, fail     nothing: episode markers, no effect on the desktop
    Key names are pyautogui's (enter, tab, ctrl, shift, alt, super, f1..f12, a, ...).
    """

    type: str
    x: int | None = None
    y: int | None = None
    to_x: int | None = None
    to_y: int | None = None
    button: str = "left"
    clicks: int = 1
    dx: int = 0
    dy: int = 0
    duration: float = 0.0
    text: str = ""
    keys: tuple[str, ...] = ()
    modifiers: tuple[str, ...] = ()
    seconds: float = 0.0
    command: str | tuple[str, ...] = ""
    timeout: float = DEFAULT_STEP_TIMEOUT_S
    code: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        defaults = Action(type=self.type)
        for name in (
            "x",
            "y",
            "to_x",
            "to_y",
            "button",
            "clicks",
            "dx",
            "dy",
            "duration",
            "text",
            "seconds",
            "timeout",
            "code",
        ):
            value = getattr(self, name)
            if value != getattr(defaults, name) and not (
                name == "button" and self.type == "right_click"
            ):
                out[name] = value
        if self.keys:
            out["keys"] = list(self.keys)
        if self.modifiers:
            out["modifiers"] = list(self.modifiers)
        if self.command:
            out["command"] = self.command if isinstance(self.command, str) else list(self.command)
        return out


_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # type: (required, optional)
    "pyautogui": ({"code"}, {"timeout"}),
    "click": (set(), {"x", "y", "button", "clicks", "modifiers"}),
    "double_click": (set(), {"x", "y", "button", "modifiers"}),
    "right_click": (set(), {"x", "y", "modifiers"}),
    "move": ({"x", "y"}, {"duration", "modifiers"}),
    "drag": ({"x", "y", "to_x", "to_y"}, {"button", "duration", "modifiers"}),
    "scroll": (set(), {"x", "y", "dx", "dy", "clicks", "modifiers"}),
    "mouse_down": (set(), {"x", "y", "button", "modifiers"}),
    "mouse_up": (set(), {"x", "y", "button", "modifiers"}),
    "hold_key": ({"keys", "seconds"}, set()),
    "cursor_position": (set(), set()),
    "type": ({"text"}, set()),
    "key": (set(), {"keys", "key"}),
    "hotkey": ({"keys"}, set()),
    "wait": ({"seconds"}, set()),
    "execute": ({"command"}, {"timeout"}),
    "done": (set(), set()),
    "fail": (set(), set()),
}


def _bad(message: str) -> ProtocolError:
    return ProtocolError("invalid_action", message)


def _coord(action: dict[str, Any], name: str, limit: int) -> int | None:
    if name not in action or action[name] is None:
        return None
    value = action[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{action['type']}: {name} must be a number, got {value!r}")
    if not 0 <= value < limit:
        raise _bad(
            f"{action['type']}: {name}={value} is off the {SCREEN_WIDTH}x{SCREEN_HEIGHT} "
            f"screen (0 <= {name} < {limit})"
        )
    return round(value)


def _number(action: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = action.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(f"{action['type']}: {name} must be a number, got {value!r}")
    if not lo <= value <= hi:
        raise _bad(f"{action['type']}: {name}={value} must be within [{lo}, {hi}]")
    return float(value)


def _integer(action: dict[str, Any], name: str, default: int, lo: int, hi: int) -> int:
    value = action.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{action['type']}: {name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise _bad(f"{action['type']}: {name}={value} must be within [{lo}, {hi}]")
    return value


def _keys(action: dict[str, Any]) -> tuple[str, ...]:
    raw = action.get("keys", action.get("key"))
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not raw or not all(isinstance(k, str) and k for k in raw):
        raise _bad(f"{action['type']}: keys must be a non-empty list of key names, got {raw!r}")
    return tuple(k.lower() if len(k) > 1 else k for k in raw)


def parse_action(raw: Any) -> Action:
    """Validate an action dict and return it as an Action, or raise ProtocolError(invalid_action)
    with a message that says which field is wrong and what is allowed."""
    if not isinstance(raw, dict):
        raise _bad(f"action must be an object with a 'type', got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in _FIELDS:
        raise _bad(f"unknown action type {kind!r}; expected one of {', '.join(ACTION_TYPES)}")
    required, optional = _FIELDS[kind]
    missing = sorted(name for name in required if name not in raw)
    if missing:
        raise _bad(f"{kind}: missing field(s) {', '.join(missing)}")
    unknown = sorted(set(raw) - required - optional - {"type"})
    if unknown:
        allowed = ", ".join(sorted(required | optional)) or "none"
        raise _bad(f"{kind}: unknown field(s) {', '.join(unknown)}; allowed: {allowed}")

    x = _coord(raw, "x", SCREEN_WIDTH)
    y = _coord(raw, "y", SCREEN_HEIGHT)
    if (x is None) != (y is None):
        raise _bad(f"{kind}: give both x and y, or neither")
    fields: dict[str, Any] = {"type": kind, "x": x, "y": y}
    button = raw.get("button", "right" if kind == "right_click" else "left")
    if button not in BUTTONS:
        raise _bad(f"{kind}: button must be one of {BUTTONS}, got {button!r}")
    fields["button"] = button

    if kind == "pyautogui":
        if not isinstance(raw["code"], str) or not raw["code"].strip():
            raise _bad("pyautogui: code must be a non-empty string of Python")
        try:
            compile(raw["code"], "<action>", "exec")
        except SyntaxError as exc:
            raise _bad(f"pyautogui: code does not compile: {exc.msg} (line {exc.lineno})") from exc
        fields["code"] = raw["code"]
        fields["timeout"] = _number(raw, "timeout", DEFAULT_STEP_TIMEOUT_S, 0.1, MAX_TIMEOUT_S)
    elif kind == "click":
        fields["clicks"] = _integer(raw, "clicks", 1, 1, 10)
    elif kind == "move":
        fields["duration"] = _number(raw, "duration", 0.0, 0.0, 10.0)
    elif kind == "drag":
        fields["to_x"] = _coord(raw, "to_x", SCREEN_WIDTH)
        fields["to_y"] = _coord(raw, "to_y", SCREEN_HEIGHT)
        fields["duration"] = _number(raw, "duration", 0.2, 0.0, 10.0)
    elif kind == "scroll":
        if "clicks" in raw and "dy" in raw:
            raise _bad("scroll: give dy or its alias clicks, not both")
        fields["dy"] = _integer(raw, "dy" if "dy" in raw else "clicks", 0, -100, 100)
        fields["dx"] = _integer(raw, "dx", 0, -100, 100)
        if fields["dx"] == 0 and fields["dy"] == 0:
            raise _bad("scroll: dx and dy are both 0; give a number of clicks")
    elif kind == "type":
        if not isinstance(raw["text"], str):
            raise _bad(f"type: text must be a string, got {type(raw['text']).__name__}")
        fields["text"] = raw["text"]
    elif kind in ("key", "hotkey", "hold_key"):
        if kind == "key" and "keys" in raw and "key" in raw:
            raise _bad("key: give keys or key, not both")
        fields["keys"] = _keys(raw)
        if kind == "hold_key":
            fields["seconds"] = _number(raw, "seconds", 0.0, 0.0, 60.0)
    elif kind == "wait":
        fields["seconds"] = _number(raw, "seconds", 0.0, 0.0, 60.0)
    elif kind == "execute":
        command = raw["command"]
        if isinstance(command, list):
            if not command or not all(isinstance(a, str) for a in command):
                raise _bad("execute: command as a list must be a non-empty list of strings")
            command = tuple(command)
        elif not isinstance(command, str) or not command.strip():
            raise _bad("execute: command must be a shell string or an argv list")
        fields["command"] = command
        fields["timeout"] = _number(raw, "timeout", DEFAULT_STEP_TIMEOUT_S, 0.1, MAX_TIMEOUT_S)
    if "modifiers" in raw:
        held = raw["modifiers"]
        if not isinstance(held, list) or not all(isinstance(k, str) and k for k in held):
            raise _bad(f"{kind}: modifiers must be a list of key names, got {held!r}")
        if len(held) > 4:
            raise _bad(f"{kind}: at most 4 modifiers can be held, got {len(held)}")
        fields["modifiers"] = tuple(k.lower() for k in held)
    return Action(**fields)


MAX_BATCH = 64  # actions in one step request ("actions": a vendor's batch, run in order)


def parse_batch(raw: Any) -> list[Action]:
    """A step's `actions`: 1..MAX_BATCH actions, each checked as parse_action does, the error
    naming the index of the bad one."""
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_BATCH:
        raise _bad(f"actions must be a list of 1 to {MAX_BATCH} actions")
    parsed = []
    for index, item in enumerate(raw):
        try:
            parsed.append(parse_action(item))
        except ProtocolError as exc:
            raise _bad(f"actions[{index}]: {exc.message}") from None
    return parsed


def step_timeout(action: Action, requested: float | None) -> float:
    """How long the agent lets a step run before it kills the worker: the request's timeout if
    given, else what the action needs plus a margin."""
    if requested is not None:
        return requested
    if action.type in ("pyautogui", "execute"):
        return action.timeout + 1.0
    if action.type in ("wait", "hold_key"):
        return action.seconds + 5.0
    return DEFAULT_STEP_TIMEOUT_S


def check_timeout(request: dict[str, Any], default: float | None) -> float | None:
    value = request.get("timeout_s", default)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= (MAX_TIMEOUT_S)
    ):
        raise _bad(f"timeout_s must be a number in (0, {MAX_TIMEOUT_S}], got {value!r}")
    return float(value)


# ---------------------------------------------------------------- screenshots

SHOT_FORMATS = ("png", "jpeg", "webp")
SHOT_CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
DEFAULT_SHOT_QUALITY = 80
MIN_SHOT_SIDE = 16


@dataclass(frozen=True)
class ShotSpec:
    """How a screenshot is encoded: format, quality (jpeg/webp, 1..100) and the size it is scaled
    to (None: the screen's own). A width without a height (or the reverse) keeps the aspect ratio.
    Frozen and hashable: the agent keys its cache of encoded images by it."""

    format: str = "png"
    quality: int | None = None
    width: int | None = None
    height: int | None = None
    region: tuple[int, int, int, int] | None = None  # x0, y0, x1, y1: crop first (a zoom)

    @property
    def content_type(self) -> str:
        return SHOT_CONTENT_TYPES[self.format]

    def size_for(self, screen_w: int, screen_h: int) -> tuple[int, int]:
        """The output size for a screen of screen_w x screen_h."""
        if self.width is None and self.height is None:
            return screen_w, screen_h
        if self.width is not None and self.height is not None:
            return self.width, self.height
        if self.width is not None:
            return self.width, max(1, round(screen_h * self.width / screen_w))
        assert self.height is not None
        return max(1, round(screen_w * self.height / screen_h)), self.height

    def to_request(self) -> dict[str, Any]:
        """The fields a request carries (defaults left out, so a plain PNG asks for nothing)."""
        out: dict[str, Any] = {}
        if self.format != "png":
            out["format"] = self.format
        for name in ("quality", "width", "height"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.region is not None:
            out["region"] = list(self.region)
        return out


PNG_FULL = ShotSpec()


def _shot_bad(name: str, message: str) -> ProtocolError:
    return ProtocolError("invalid_action", f"screenshot: {message}", field=name)


def _shot_int(raw: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)  # query strings arrive as text
    if isinstance(value, bool) or not isinstance(value, int):
        raise _shot_bad(name, f"{name} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise _shot_bad(name, f"{name}={value} must be within [{lo}, {hi}]")
    return value


SHOT_PARAMS = ("format", "quality", "width", "height", "region")


def _shot_region(raw: dict[str, Any]) -> tuple[int, int, int, int] | None:
    value = raw.get("region")
    if value is None:
        return None
    if isinstance(value, str):  # query strings: region=x0,y0,x1,y1
        parts = value.split(",")
        value = [int(p) if p.strip().isdigit() else p for p in parts]
    shape = "[x0, y0, x1, y1] in screen pixels, x0 < x1 and y0 < y1"
    if (
        not isinstance(value, list | tuple)
        or len(value) != 4
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise _shot_bad("region", f"region must be {shape}, got {value!r}")
    x0, y0, x1, y1 = value
    if not (0 <= x0 < x1 <= SCREEN_WIDTH and 0 <= y0 < y1 <= SCREEN_HEIGHT):
        raise _shot_bad("region", f"region must be {shape} on the screen, got {list(value)}")
    return x0, y0, x1, y1


def parse_shot(raw: dict[str, Any] | None) -> ShotSpec:
    """Validate screenshot options (format, quality, width, height; unknown names refused) and
    return a ShotSpec, or raise ProtocolError(invalid_action) whose `field` names the bad
    parameter. Sizes are at most the screen's: scaling is for making images smaller."""
    if not raw:
        return PNG_FULL
    if not isinstance(raw, dict):
        raise _shot_bad("screenshot", f"options must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SHOT_PARAMS))
    if unknown:
        raise _shot_bad(
            unknown[0],
            f"unknown parameter(s) {', '.join(unknown)}; allowed: {', '.join(SHOT_PARAMS)}",
        )
    fmt = raw.get("format")
    fmt = "png" if fmt is None else fmt
    if isinstance(fmt, str):
        fmt = {"jpg": "jpeg"}.get(fmt.lower(), fmt.lower())
    if fmt not in SHOT_FORMATS:
        raise _shot_bad(
            "format", f"format={raw.get('format')!r} is not one of {', '.join(SHOT_FORMATS)}"
        )
    quality = _shot_int(raw, "quality", 1, 100)
    if quality is not None and fmt == "png":
        raise _shot_bad("quality", "quality applies to jpeg and webp, not to png (lossless)")
    if quality is None and fmt != "png":
        quality = DEFAULT_SHOT_QUALITY
    width = _shot_int(raw, "width", MIN_SHOT_SIDE, SCREEN_WIDTH)
    height = _shot_int(raw, "height", MIN_SHOT_SIDE, SCREEN_HEIGHT)
    return ShotSpec(fmt, quality, width, height, _shot_region(raw))
