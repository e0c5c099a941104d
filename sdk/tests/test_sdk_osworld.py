"""OSWorld's computer_13 actions become pyautogui code (or drums' terminal actions)."""

from __future__ import annotations

import inspect

import pytest
from sdk_harness import Daemon

from drums import InvalidEpisode
from drums.models import GateReport, GateResult, GateStatus
from drums.osworld import DesktopEnv, computer_13_code, validity


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
    with pytest.raises(ValueError, match="one of computer_13, pyautogui, claude_computer_use"):
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


def test_require_a11y_tree_on_a_desktop_without_one_fails_the_reset_clearly(
    daemon: Daemon,
) -> None:
    """The test daemon's desktops run no AT-SPI: asking for the tree names the env, the reason
    and what to use instead (the real tree is proven live on the osworld image,
    tests/live/test_osworld_image_live.py)."""
    with daemon.client() as client, DesktopEnv(client=client, require_a11y_tree=True) as env:
        with pytest.raises(ValueError, match=r"has no accessibility tree.*image='osworld'"):
            env.reset()
        assert env.env is not None
        answer = env.env.accessibility_tree()
        assert answer.tree is None and answer.reason and answer.slot == env.env.id


def test_require_terminal_asks_the_daemon_and_says_none_without_an_xterm(daemon: Daemon) -> None:
    """Neither test daemon runs an xterm: the observation's terminal is None and the daemon's
    answer says why (the real text is proven live, tests/live/test_osworld_desktopenv_live.py)."""
    with daemon.client() as client, DesktopEnv(client=client, require_terminal=True) as env:
        obs = env.reset()
        assert "terminal" in obs and obs["terminal"] is None
        assert env.env is not None
        answer = env.env.terminal()
        assert answer.text is None and answer.reason and answer.slot == env.env.id
        obs, _, _, _ = env.step("WAIT", pause=0)
        assert obs["terminal"] is None
        assert env.env.actions == 0  # reading the terminal is no action


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
        assert env.render()[:4] == b"\x89PNG" and env.vm_screen_size == {
            "width": 1920,
            "height": 1080,
        }
    with daemon.client() as watcher:
        assert watcher.list_envs() == []


def test_step_info_carries_the_episodes_gate_verdict(daemon: Daemon) -> None:
    """info has OSWorld's flags plus drums' validity; a failed gate shows up in the next step's
    info, and with raise_on_invalid=True that step raises instead."""
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        assert env.env is not None
        env.env.wait_valid()  # reset leaves alive_after_resume to be judged (LATE_GATES)
        _, _, done, info = env.step("pyautogui.click(10, 10)", pause=0)
        assert not done and info["valid"] is True and info["verdict"] == "valid"
        assert info["failed_gates"] == [] and info["pending_gates"] == []
        assert info["env_id"] == env.env.id and info["episode"] >= 1
        env.env.quarantine("a gate failed")  # the app's not_quarantined gate now fails
        _, _, _, info = env.step("WAIT", pause=0)
        assert info["valid"] is False and info["verdict"] == "invalid"
        assert info["failed_gates"] == ["not_quarantined"] and env.last_validity == info
        env.raise_on_invalid = True
        with pytest.raises(InvalidEpisode) as err:
            env.step("WAIT", pause=0)
        assert err.value.failed_gates == ["not_quarantined"]
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        assert env.env is not None
        env.env.wait_valid()
        _, _, done, info = env.step({"action_type": "DONE"}, pause=0)
        assert done and info["done"] is True and info["valid"] is True


def test_validity_reads_pending_and_failed_gates() -> None:
    def report(*statuses: str, failed: tuple[str, ...] = ()) -> GateReport:
        gates = [GateResult(name=f"g{i}", status=GateStatus(s)) for i, s in enumerate(statuses)]
        valid = None if "pending" in statuses else not failed and "fail" not in statuses
        return GateReport(slot="s-1", episode=2, episode_id="e", profile="p", gates=gates,
                          valid=valid, failed=list(failed))  # fmt: skip

    pending = validity(report("pass", "pending"))
    assert pending["valid"] is None and pending["verdict"] == "pending"
    assert pending["pending_gates"] == ["g1"] and pending["failed_gates"] == []
    failed = validity(report("fail", "pending"))  # a failure decides even while some pend
    assert failed["valid"] is False and failed["failed_gates"] == ["g0"]
    assert validity(report("pass", "pass"))["valid"] is True


def test_pyautogui_dict_actions_are_osworlds_command_and_special_dicts(daemon: Daemon) -> None:
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        _, _, done, info = env.step({"command": "pyautogui.click(3, 4)"}, pause=0)
        assert not done and info["valid"] is not False and not info["failed_gates"]
        with pytest.raises(ValueError, match="needs a 'command'"):
            env.step({"action_type": "CLICK", "parameters": {"x": 1, "y": 1}}, pause=0)
        _, _, done, info = env.step({"action_type": "FAIL"}, pause=0)
        assert done and info["fail"] is True


# OSWorld's public DesktopEnv methods as read in desktop_env/desktop_env.py of a copy of
# xlang-ai/OSWorld (the upstream repository is not in this sandbox's index): Untergang1/OSWorld
# at 0abefdc0801b6a2cfdcff6b2564e7b1439ef55b3, the same __init__ in fxsc03/OSWorld-main-nex at
# 137e800bbc3291c79b33dcf4e4daf33c965d9c4f. (name, default) per parameter after self; EMPTY for
# none. Its screen_size default reads SCREEN_WIDTH / SCREEN_HEIGHT, else (1920, 1080).
EMPTY = inspect.Parameter.empty
UPSTREAM_METHODS = {
    "__init__": [
        ("provider_name", "vmware"), ("region", None), ("path_to_vm", None),
        ("snapshot_name", "init_state"), ("action_space", "pyautogui"), ("cache_dir", "cache"),
        ("screen_size", (1920, 1080)), ("headless", False), ("require_a11y_tree", True),
        ("require_terminal", False), ("os_type", "Ubuntu"), ("enable_proxy", False),
        ("client_password", ""),
    ],
    "reset": [("task_config", None), ("seed", None), ("options", None)],
    "step": [("action", EMPTY), ("pause", 2)],
    "evaluate": [],
    "render": [("mode", "rgb_array")],
    "close": [],
}  # fmt: skip
UPSTREAM_PROPERTIES = ("vm_platform", "vm_machine", "vm_screen_size")


def test_the_methods_match_the_upstream_desktopenv_read_from_its_source() -> None:
    """Every public method of OSWorld's DesktopEnv (as read, see UPSTREAM_METHODS) is here with
    the same positional parameters in the same order and the same defaults, except the defaults
    DEFAULT_DIFFERENCES explains; drums' extras are keyword-only; its properties exist too."""
    from drums.osworld import DEFAULT_DIFFERENCES, OSWORLD_INIT_PARAMS

    assert list(OSWORLD_INIT_PARAMS) == UPSTREAM_METHODS["__init__"]
    for name, theirs in UPSTREAM_METHODS.items():
        ours = list(inspect.signature(getattr(DesktopEnv, name)).parameters.values())[1:]
        positional = [p for p in ours if p.kind is p.POSITIONAL_OR_KEYWORD]
        assert [p.name for p in positional] == [n for n, _ in theirs], name
        for p, (pname, default) in zip(positional, theirs):
            if name == "__init__" and pname in DEFAULT_DIFFERENCES:
                assert p.default != default, f"{pname} now matches OSWorld; drop its difference"
            else:
                assert p.default == default, (name, pname, p.default, default)
        assert all(p.kind is p.KEYWORD_ONLY for p in ours if p not in positional), name
    for prop in UPSTREAM_PROPERTIES:
        assert isinstance(inspect.getattr_static(DesktopEnv, prop), property), prop


def test_what_osworlds_runner_reads_is_there(daemon: Daemon) -> None:
    """lib_run_single and run.py read vm_ip, task_id, vm_screen_size (a dict, as OSWorld's
    controller returns it) and the claude_computer_use action space runs pyautogui code."""
    with (
        daemon.client() as client,
        DesktopEnv(client=client, action_space="claude_computer_use") as env,
    ):
        assert env.vm_ip == "drumsd.test" and env.task_id is None
        env.reset()
        assert env.controller.get_vm_screen_size() == {"width": 1920, "height": 1080}
        _, _, done, info = env.step("pyautogui.click(1, 2)", pause=0)
        assert not done and "error" not in info
        assert env.controller.get_screenshot()[:4] == b"\x89PNG"
        answer = env.controller.execute_python_command("print('hi')")
        assert answer is not None and answer["status"] == "success"


def test_reset_returns_before_the_liveness_gate_is_judged(daemon: Daemon) -> None:
    """reset waits for every gate but alive_after_resume (judged alive_after_s after ready)."""
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        assert env.env is not None
        report = env.env.gates()
        left = {g.name for g in report.gates if g.status is not GateStatus.passed}
        assert left <= {"alive_after_resume"}, report


def test_a_failing_action_is_logged_and_the_episode_goes_on(
    daemon: Daemon, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    """OSWorld's VM logs code that raises and carries on; so does step (drumsd's in-memory
    runtime fails code with 'raise' in it; the SDK's fake app runs anything)."""
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        with caplog.at_level("ERROR", logger="desktopenv.drums"):
            obs, _, done, info = env.step("raise ValueError('bad line')", pause=0)
        assert not done and obs["screenshot"][:4] == b"\x89PNG"
        if request.node.callspec.params["daemon"] == "drumsd":
            assert "simulated" in info["error"] and "Failed to execute" in caplog.text
        obs, _, done, info = env.step("DONE", pause=0)
        assert done and info["done"] is True


def test_recording_writes_a_playable_video_of_the_episode(daemon: Daemon, tmp_path) -> None:
    """start_recording / end_recording(path) as lib_run_single calls them: an H.264 mp4 lasting
    as long as the episode; a second end_recording (run.py's error handler) only logs."""
    import time

    import imageio_ffmpeg

    dest = tmp_path / "result" / "recording.mp4"
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.controller.end_recording(str(dest))  # none started: logged, nothing raised
        env.reset()
        env.controller.start_recording()
        started = time.monotonic()
        for _ in range(3):
            env.step("pyautogui.click(5, 5)", pause=0.4)
        env.controller.end_recording(str(dest))
        elapsed = time.monotonic() - started
        env.controller.end_recording(str(dest))
    frames, seconds = imageio_ffmpeg.count_frames_and_secs(str(dest))
    assert frames >= 2 and abs(seconds - elapsed) < 1.5, (frames, seconds, elapsed)
    assert dest.read_bytes()[4:8] == b"ftyp"


def test_closing_mid_recording_drops_the_video(daemon: Daemon) -> None:
    """close() with a recording running stops its thread and ffmpeg and leaves no file."""
    import glob
    import tempfile

    before = set(glob.glob(f"{tempfile.gettempdir()}/drums-recording-*"))
    with daemon.client() as client, DesktopEnv(client=client) as env:
        env.reset()
        env.controller.start_recording()
        recorder = env.controller._recorder
        assert recorder is not None and recorder.running
        env.step("pyautogui.click(5, 5)", pause=0.3)
    assert not recorder.running
    assert set(glob.glob(f"{tempfile.gettempdir()}/drums-recording-*")) == before
