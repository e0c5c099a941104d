"""The environment of commands run in a slot (pure): an allowlist, nothing of the daemon's."""

from __future__ import annotations

import pytest
from drumsd.core.slot_env import ROOT_PATH, USER_PATH, slot_command_env

ALLOWED = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "DISPLAY", "XAUTHORITY"}


def test_a_trusted_step_gets_sudos_environment_and_nothing_of_the_daemons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DRUMS_TOKEN", "k" * 40)
    monkeypatch.setenv("DRUMS_TOKEN_FILE", "/etc/drumsd/token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    env = slot_command_env(xauthority="/run/drums/Xauthority")
    assert set(env) == ALLOWED
    assert env["PATH"] == ROOT_PATH and "/usr/sbin" in env["PATH"]
    assert (env["HOME"], env["USER"], env["LOGNAME"]) == ("/root", "root", "root")
    assert env["DISPLAY"] == ":0"
    assert not any(k.startswith("DRUMS_") or "SECRET" in k for k in env)


def test_the_desktop_user_gets_the_sessions_path_and_home() -> None:
    env = slot_command_env(user="user", home="/home/user", display=":1")
    assert set(env) == ALLOWED - {"XAUTHORITY"}
    assert env["PATH"] == USER_PATH and "sbin" not in env["PATH"]
    assert (env["HOME"], env["USER"], env["DISPLAY"]) == ("/home/user", "user", ":1")
    assert slot_command_env() is not slot_command_env()  # a fresh dict: callers may extend it
