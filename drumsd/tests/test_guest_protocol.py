"""The agent protocol's pure parts: framing and action validation."""

from __future__ import annotations

import json

import pytest
from drumsd.guest import protocol
from drumsd.guest.protocol import ProtocolError, parse_action


def test_request_roundtrip() -> None:
    line = protocol.encode_request({"op": "step", "action": {"type": "click", "x": 1, "y": 2}})
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.decode_request(line.rstrip(b"\n"))["action"]["x"] == 1


@pytest.mark.parametrize("line", [b"not json", b"[1,2]", b'{"op":"format_disk"}', b"\xff"])
def test_bad_requests_are_invalid_action(line: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        protocol.decode_request(line)
    assert info.value.code == "invalid_action"


def test_reply_roundtrip_with_payload() -> None:
    data = protocol.encode_reply({"ok": True, "width": 3}, b"\x89PNG\n\x00rest")
    header, payload = protocol.split_reply(data)
    assert header == {"ok": True, "width": 3, "size": 10}
    assert payload == b"\x89PNG\n\x00rest"  # a newline inside the payload is not a delimiter


def test_truncated_reply_is_detected() -> None:
    data = protocol.encode_reply({"ok": True}, b"0123456789")
    with pytest.raises(ProtocolError, match="payload is 5 bytes, header says 10"):
        protocol.split_reply(data[:-5])
    with pytest.raises(ProtocolError, match="no header"):
        protocol.split_reply(b'{"ok": tr')


def test_error_reply() -> None:
    header, _ = protocol.split_reply(protocol.encode_error("timeout", "too slow"))
    assert protocol.error_of(header) == ("timeout", "too slow")
    assert protocol.error_of({"ok": True, "size": 0}) is None
    # An unknown code from a newer agent degrades to "failed", keeping the message.
    assert protocol.error_of({"ok": False, "error": {"code": "weird", "message": "m"}}) == (
        "failed",
        "m",
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"type": "click", "x": 10, "y": 20}, {"type": "click", "x": 10, "y": 20}),
        ({"type": "click"}, {"type": "click"}),
        ({"type": "right_click", "x": 5.4, "y": 6.6}, {"type": "right_click", "x": 5, "y": 7}),
        ({"type": "scroll", "clicks": -3}, {"type": "scroll", "dy": -3}),
        ({"type": "key", "key": "Enter"}, {"type": "key", "keys": ["enter"]}),
        ({"type": "hotkey", "keys": ["ctrl", "A"]}, {"type": "hotkey", "keys": ["ctrl", "A"]}),
        ({"type": "type", "text": "héllo\n"}, {"type": "type", "text": "héllo\n"}),
        (
            {"type": "execute", "command": ["ls", "-l"]},
            {"type": "execute", "command": ["ls", "-l"]},
        ),
        ({"type": "wait", "seconds": 0.5}, {"type": "wait", "seconds": 0.5}),
        ({"type": "done"}, {"type": "done"}),
    ],
)
def test_valid_actions_normalize(raw: dict, expected: dict) -> None:
    action = parse_action(raw)
    assert action.to_dict() == expected
    assert parse_action(action.to_dict()) == action  # to_dict is a fixed point


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("click", "must be an object"),
        ({"type": "teleport"}, "unknown action type 'teleport'"),
        ({"type": "click", "x": 5}, "both x and y"),
        ({"type": "click", "x": 1920, "y": 0}, "off the 1920x1080 screen"),
        ({"type": "click", "x": -1, "y": 0}, "off the"),
        ({"type": "click", "x": "10", "y": 0}, "x must be a number"),
        ({"type": "click", "x": True, "y": 0}, "x must be a number"),
        ({"type": "click", "x": float("nan"), "y": 0}, "x must be a number"),
        ({"type": "click", "button": "thumb"}, "button must be one of"),
        ({"type": "click", "clicks": 0}, "clicks=0 must be within"),
        ({"type": "click", "z": 1}, "unknown field(s) z"),
        ({"type": "move", "x": 1}, "missing field(s) y"),
        ({"type": "drag", "x": 1, "y": 1, "to_x": 2}, "missing field(s) to_y"),
        ({"type": "type", "text": 5}, "text must be a string"),
        ({"type": "key", "keys": []}, "non-empty list"),
        ({"type": "hotkey", "keys": ["ctrl", 3]}, "non-empty list"),
        ({"type": "scroll"}, "both 0"),
        ({"type": "scroll", "dy": 1, "clicks": 1}, "not both"),
        ({"type": "wait", "seconds": 61}, "within [0.0, 60.0]"),
        ({"type": "execute", "command": ""}, "shell string or an argv list"),
        ({"type": "execute", "command": ["ls", 1]}, "list of strings"),
        ({"type": "pyautogui", "code": "pyautogui.click(("}, "does not compile"),
        ({"type": "pyautogui", "code": "  "}, "non-empty string"),
    ],
)
def test_malformed_actions_say_what_is_wrong(raw: object, message: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_action(raw)
    assert info.value.code == "invalid_action"
    assert message in info.value.message


def test_step_timeouts() -> None:
    assert protocol.step_timeout(parse_action({"type": "wait", "seconds": 2}), None) == 7.0
    code = parse_action({"type": "pyautogui", "code": "pass", "timeout": 3})
    assert protocol.step_timeout(code, None) == 4.0
    assert protocol.step_timeout(code, 1.5) == 1.5
    with pytest.raises(ProtocolError):
        protocol.check_timeout({"timeout_s": 0}, None)
    assert protocol.check_timeout({}, 30.0) == 30.0


def test_every_documented_type_is_validated() -> None:
    assert set(protocol.ACTION_TYPES) == set(protocol._FIELDS)
    assert json.loads(protocol.encode_request({"op": "ping"})) == {"op": "ping"}


def test_the_guest_speaks_every_action_the_api_accepts() -> None:
    """The guest runs in the image with the stdlib only, so it keeps its own list: this is the
    check that it never drifts from the wire models'."""
    from typing import get_args

    from drums.models import ACTION_TYPES, Action

    assert protocol.ACTION_TYPES == ACTION_TYPES
    assert set(get_args(Action.model_fields["type"].annotation)) == set(ACTION_TYPES)


def test_a_timed_out_execute_kills_its_whole_process_group(tmp_path) -> None:
    """issue 14, finding 7: past its timeout the shell and what it started are killed."""
    import os
    import time

    from drumsd.guest.worker import ActionFailed, run_command

    pidfile = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(ActionFailed, match="process group was killed"):
        run_command(f"sleep 600 & echo $! > {pidfile}; wait", 0.5)
    assert time.monotonic() - started < 10
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # killed, waiting for its reaper
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, 9)
        raise AssertionError(f"sleep 600 (pid {child}) outlived its execute's timeout")
    assert run_command(["echo", "ok"], 5)["stdout"] == "ok\n"


def test_a_batch_is_checked_whole_naming_the_bad_index() -> None:
    ok = protocol.parse_batch([{"type": "move", "x": 1, "y": 2}, {"type": "cursor_position"}])
    assert [a.type for a in ok] == ["move", "cursor_position"]
    with pytest.raises(ProtocolError, match=r"actions\[1\]: hold_key: missing field\(s\) seconds"):
        protocol.parse_batch(
            [{"type": "move", "x": 1, "y": 2}, {"type": "hold_key", "keys": ["a"]}]
        )
    for bad in ([], "move", [{}] * (protocol.MAX_BATCH + 1)):
        with pytest.raises(ProtocolError, match="actions must be a list of 1 to"):
            protocol.parse_batch(bad)
    with pytest.raises(ProtocolError, match="at most 4 modifiers"):
        parse_action({"type": "click", "modifiers": ["ctrl", "shift", "alt", "win", "ctrl"]})
    held = parse_action({"type": "scroll", "dx": -2, "modifiers": ["Shift"]})
    assert held.modifiers == ("shift",) and held.to_dict()["modifiers"] == ["shift"]
