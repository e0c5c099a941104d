"""OSWorld's computer_13 actions become pyautogui code (or drums' terminal actions)."""

from __future__ import annotations

import pytest
from sdk_harness import Daemon

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


def test_the_constructor_matches_osworlds_parameters() -> None:
    """Same names in the same order with the same defaults as OSWorld's DesktopEnv.__init__,
    but where DEFAULT_DIFFERENCES says why not; the drums extras are keyword-only."""
    import inspect

    from drums.osworld import DEFAULT_DIFFERENCES, OSWORLD_INIT_PARAMS, VM_ONLY

    params = list(inspect.signature(DesktopEnv).parameters.values())
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [p.name for p in positional] == [name for name, _ in OSWORLD_INIT_PARAMS]
    for p, (name, theirs) in zip(positional, OSWORLD_INIT_PARAMS):
        if name in DEFAULT_DIFFERENCES:
            assert p.default != theirs, f"{name} now matches OSWorld; drop its difference"
        else:
            assert p.default == theirs, (name, p.default, theirs)
    assert {p.name for p in params if p.kind is p.KEYWORD_ONLY} == {
        "client",
        "image",
        "raise_on_invalid",
    }
    assert set(VM_ONLY) <= {name for name, _ in OSWORLD_INIT_PARAMS}


def test_an_accessibility_tree_or_terminal_is_refused_clearly() -> None:
    with pytest.raises(ValueError, match="do not provide an accessibility tree yet"):
        DesktopEnv(require_a11y_tree=True)
    with pytest.raises(ValueError, match="do not provide terminal output yet"):
        DesktopEnv(require_terminal=True)


def test_fork_gives_desktopenvs_on_copies_destroyed_on_exit(daemon: Daemon) -> None:
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        env.step("pyautogui.click(10, 10)", pause=0)
        with env.fork(2) as copies:
            assert len(copies) == 2
            ids = {c.env.id for c in copies if c.env is not None}
            assert len(ids) == 2 and env.env is not None and env.env.id not in ids
            assert copies[0].action_history == env.action_history
            obs, reward, done, _ = copies[1].step("DONE", pause=0)
            assert done and reward == 0.0 and obs["screenshot"][:4] == b"\x89PNG"
            assert {s.id for s in client.list_envs()} == ids | {env.env.id}
        assert [s.id for s in client.list_envs()] == [env.env.id]
        assert env.render()[:4] == b"\x89PNG" and env.vm_screen_size == (1920, 1080)
    with daemon.client() as watcher:
        assert watcher.list_envs() == []
