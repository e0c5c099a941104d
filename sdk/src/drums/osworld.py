"""OSWorld's gym-style `DesktopEnv` over drums: an OSWorld agent loop runs unchanged, and its reset
is a CRIU restore instead of a VM revert.

    env = DesktopEnv(action_space="pyautogui")
    obs = env.reset(task_config=json.load(open("task.json")))
    obs, reward, done, info = env.step("pyautogui.click(10, 20)", pause=2)
    score = env.evaluate()
    env.close()

The constructor takes OSWorld's parameters by the same names, order and defaults (recorded in
OSWORLD_INIT_PARAMS and checked by a test), with two deliberate differences: only desktops whose
session runs AT-SPI (the `osworld` image) have an accessibility tree, so `require_a11y_tree`
defaults to False; True puts the tree (OSWorld's XML) in obs["accessibility_tree"] and, on a
desktop without one, fails the reset with the reason instead of handing the agent None.
`require_terminal=True` puts the desktop xterm's text (scrollback and screen) in obs["terminal"],
read without counting as an action. VM-only arguments (provider_name, region, path_to_vm,
snapshot_name, headless, os_type, enable_proxy, cache_dir) are accepted and ignored: there is no
VM. Every env this makes is destroyed on close(), when the process exits (atexit) and on Ctrl-C
(the SDK's client cleanup).

What OSWorld's runner (run.py, lib_run_single.py) touches is here as OSWorld has it:
`env.controller.start_recording()` / `end_recording(path)` write an mp4 of the episode (see
drums._recording: screenshots sampled at RECORDING_FPS, encoded by ffmpeg), `vm_ip`, `task_id`,
`vm_screen_size` as {"width", "height"}, the `claude_computer_use` action space (pyautogui code),
and a step whose code fails is logged (logger "desktopenv.drums") and the episode goes on, as on
OSWorld's VM, with the error in info["error"].

reset() returns once the desktop is restored, set up and its start gates passed; the liveness
gate (alive_after_resume, judged the daemon's alive_after_s after ready, 5 s by default) is left
to be judged while the agent works: OSWorld's runner waits after reset anyway, step's info shows
it pending then passed, and a DONE or FAIL step and evaluate() wait for it (the daemon judges it
only while the episode runs).
"""

from __future__ import annotations

import atexit
import logging
import platform
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union
from urllib.parse import urlsplit

from . import _client
from ._base import gate_verdict, validity
from ._exceptions import ActionFailed, InvalidEpisode, Timeout
from ._recording import DEFAULT_FPS, RecordingUnavailable, ScreenRecorder
from .models import GateReport, GateStatus, VerifyResult

__all__ = [
    "ACTION_SPACES",
    "DEFAULT_DIFFERENCES",
    "LATE_GATES",
    "OSWORLD_INIT_PARAMS",
    "RECORDING_FPS",
    "SPECIAL",
    "VM_ONLY",
    "Controller",
    "DesktopEnv",
    "computer_13_code",
    "validity",
]

log = logging.getLogger("desktopenv.drums")  # OSWorld's run.py shows "desktopenv" loggers

SPECIAL = ("WAIT", "DONE", "FAIL")
# claude_computer_use: OSWorld runs its actions as pyautogui code, as here.
ACTION_SPACES = ("computer_13", "pyautogui", "claude_computer_use")
# Gates reset() does not wait for: judged alive_after_s after ready (see the module docstring).
LATE_GATES = ("alive_after_resume",)
RECORDING_FPS = DEFAULT_FPS
RESET_GATES_TIMEOUT_S = 120.0
# alive_after_s is 5 s by default; its judge reads facts within seconds after.
LATE_GATES_TIMEOUT_S = 30.0
# OSWorld's DesktopEnv.__init__ parameters, in order, with their defaults (facts about its
# interface; screen_size defaults there to SCREEN_WIDTH x SCREEN_HEIGHT, else 1920x1080).
OSWORLD_INIT_PARAMS: Tuple[Tuple[str, Any], ...] = (
    ("provider_name", "vmware"),
    ("region", None),
    ("path_to_vm", None),
    ("snapshot_name", "init_state"),
    ("action_space", "pyautogui"),
    ("cache_dir", "cache"),
    ("screen_size", (1920, 1080)),
    ("headless", False),
    ("require_a11y_tree", True),
    ("require_terminal", False),
    ("os_type", "Ubuntu"),
    ("enable_proxy", False),
    ("client_password", ""),
)
# Where drums differs from those defaults, and why.
DEFAULT_DIFFERENCES = {
    "provider_name": "drums: there is no VM provider",
    "require_a11y_tree": "only the osworld image's desktop runs AT-SPI (an accessibility tree)",
}
VM_ONLY = ("provider_name", "region", "path_to_vm", "snapshot_name", "headless", "os_type",
           "enable_proxy", "cache_dir")  # fmt: skip


def computer_13_code(action: Dict[str, Any]) -> Union[str, Dict[str, Any]]:
    """One computer_13 action dict as pyautogui code (or a drums action for WAIT/DONE/FAIL)."""
    kind = str(action.get("action_type", "")).upper()
    p = dict(action.get("parameters") or {})
    xy = f"{int(p['x'])}, {int(p['y'])}" if "x" in p and "y" in p else ""
    if kind in SPECIAL:
        return {"type": kind.lower()}
    calls = {
        "MOVE_TO": f"pyautogui.moveTo({xy})",
        "CLICK": f"pyautogui.click({xy}{', ' if xy else ''}button={p.get('button', 'left')!r}, "
        f"clicks={int(p.get('num_clicks', 1))})",
        "MOUSE_DOWN": f"pyautogui.mouseDown(button={p.get('button', 'left')!r})",
        "MOUSE_UP": f"pyautogui.mouseUp(button={p.get('button', 'left')!r})",
        "RIGHT_CLICK": f"pyautogui.rightClick({xy})",
        "DOUBLE_CLICK": f"pyautogui.doubleClick({xy})",
        "DRAG_TO": f"pyautogui.dragTo({xy}, button='left')",
        "SCROLL": f"pyautogui.scroll({int(p.get('dy', 0))})"
        + (f"; pyautogui.hscroll({int(p['dx'])})" if p.get("dx") else ""),
        "TYPING": f"pyautogui.typewrite({str(p.get('text', ''))!r})",
        "PRESS": f"pyautogui.press({str(p.get('key', ''))!r})",
        "KEY_DOWN": f"pyautogui.keyDown({str(p.get('key', ''))!r})",
        "KEY_UP": f"pyautogui.keyUp({str(p.get('key', ''))!r})",
        "HOTKEY": "pyautogui.hotkey(" + ", ".join(repr(str(k)) for k in p.get("keys", [])) + ")",
    }
    if kind not in calls:
        raise ValueError(f"not a computer_13 action type: {kind!r} (one of {sorted(calls)})")
    return calls[kind]


def _special(action: Union[str, Dict[str, Any]]) -> Optional[str]:
    """WAIT, DONE or FAIL, as a word or as a dict's action_type (in either action space)."""
    if isinstance(action, dict):
        word = str(action.get("action_type", "")).strip().upper()
    else:
        word = str(action).strip().upper()
    return word if word in SPECIAL else None


class DesktopEnv:
    """OSWorld's DesktopEnv interface on a drums daemon (DRUMS_URL / DRUMS_TOKEN(_FILE))."""

    def __init__(
        self,
        provider_name: str = "drums",
        region: Optional[str] = None,
        path_to_vm: Optional[str] = None,
        snapshot_name: str = "init_state",
        action_space: str = "pyautogui",
        cache_dir: str = "cache",
        screen_size: Tuple[int, int] = (1920, 1080),
        headless: bool = False,
        require_a11y_tree: bool = False,
        require_terminal: bool = False,
        os_type: str = "Ubuntu",
        enable_proxy: bool = False,
        client_password: str = "",
        *,
        client: Optional[_client.Client] = None,
        image: Optional[str] = None,
        raise_on_invalid: bool = False,
    ) -> None:
        if action_space not in ACTION_SPACES:
            raise ValueError(
                f"action_space must be one of {', '.join(ACTION_SPACES)}, not {action_space!r}"
            )
        self.action_space = action_space
        self.screen_size = screen_size
        self.require_a11y_tree = require_a11y_tree
        self.require_terminal = require_terminal
        self.raise_on_invalid = raise_on_invalid
        self.image = image
        self._own_client = client is None
        self.client = client or _client.connect()
        self.env: Optional[_client.Env] = None
        self.instruction = ""
        self.task_id: Optional[str] = None
        self.action_history: List[Any] = []
        self.last_verify: Optional[VerifyResult] = None
        self.last_validity: Optional[Dict[str, Any]] = None
        # Where agents that call the VM's own server would look; no OSWorld server listens here.
        self.vm_ip = urlsplit(str(getattr(self.client, "url", ""))).hostname or "127.0.0.1"
        self.controller = Controller(self)
        atexit.register(self.close)

    def __enter__(self) -> DesktopEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(
        self,
        task_config: Optional[Dict[str, Any]] = None,
        seed: Optional[int] = None,
        options: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        """A fresh desktop on the task (a restore, then the task's setup steps)."""
        if self.env is not None:
            self.env.close()
            self.env = None
        self.action_history = []
        self.last_verify = None
        self.last_validity = None
        if task_config is None:
            self.env = self.client.create(image=self.image)
        else:
            self.env = self.client.create(task=dict(task_config), image=self.image)
        self.instruction = str((task_config or {}).get("instruction", ""))
        self.task_id = (task_config or {}).get("id")
        self._wait_start_gates(self.env)
        return self._get_obs()

    def _wait_gates_judged(self, env: _client.Env) -> None:
        """Until no gate pends (a failed one is left for verify to report), bounded."""
        deadline = time.monotonic() + LATE_GATES_TIMEOUT_S
        pause = 0.05
        while time.monotonic() < deadline:
            if all(g.status is not GateStatus.pending for g in env.gates().gates):
                return
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def _wait_start_gates(self, env: _client.Env) -> GateReport:
        """Every gate but LATE_GATES passed (a failed one raises InvalidEpisode)."""
        deadline = time.monotonic() + RESET_GATES_TIMEOUT_S
        pause = 0.05
        while True:
            report = env.gates()
            if gate_verdict(report, env.id) is not None:
                return report
            pending = [
                g.name
                for g in report.gates
                if g.status is GateStatus.pending and g.name not in LATE_GATES
            ]
            if not pending:
                return report
            if time.monotonic() + pause > deadline:
                raise Timeout(
                    f"gates {pending} still pending {RESET_GATES_TIMEOUT_S:g} s after the "
                    "restore; read env.env.gates() for their evidence",
                    env_id=env.id,
                )
            time.sleep(pause)
            pause = min(pause * 1.5, 0.5)

    def _get_obs(self) -> Dict[str, Any]:
        env = self._live()
        obs = env.observe()
        return {
            "screenshot": obs.png,
            "accessibility_tree": self._a11y_tree(env) if self.require_a11y_tree else None,
            "terminal": env.terminal().text if self.require_terminal else None,
            "instruction": self.instruction or obs.instruction,
        }

    def _a11y_tree(self, env: _client.Env) -> str:
        got = env.accessibility_tree()
        if got.tree is None:
            raise ValueError(
                f"require_a11y_tree=True, but env {env.id} has no accessibility tree: "
                f"{got.reason}; use image='osworld' (its session runs AT-SPI) or a screenshot "
                "observation (require_a11y_tree=False)"
            )
        return got.tree

    def step(
        self, action: Union[str, Dict[str, Any]], pause: float = 2
    ) -> Tuple[Dict[str, Any], float, bool, Dict[str, Any]]:
        """One action, then `pause` seconds; reward is 0 until evaluate(), as in OSWorld.

        `info` has OSWorld's `done` / `fail` flags and drums' gate verdict for the episode so
        far (valid, verdict, failed_gates, pending_gates, env_id, episode: see `validity`). With
        raise_on_invalid=True a failed gate raises InvalidEpisode here instead."""
        env = self._live()
        self.action_history.append(action)
        done = False
        info: Dict[str, Any] = {}
        word = _special(action)
        if word is not None:
            if word == "WAIT":
                time.sleep(pause)
            else:
                # The daemon judges alive_after_resume only while the episode runs: an agent
                # done within alive_after_s of ready waits out the rest of it here (what the gate
                # needs), else the gate would stay pending and the episode never be valid.
                self._wait_gates_judged(env)
                env.step({"type": word.lower()})
                done = True
                info["done" if word == "DONE" else "fail"] = True
            return self._get_obs(), 0.0, done, self._with_validity(env, info)
        if isinstance(action, dict) and self.action_space != "computer_13":
            if not isinstance(action.get("command"), str):  # OSWorld's {"command": code}
                raise ValueError(
                    "a dict action in the pyautogui action space needs a 'command' (pyautogui "
                    "code) or an action_type of WAIT, DONE or FAIL; computer_13 dicts need "
                    "action_space='computer_13'"
                )
            converted: Union[str, Dict[str, Any]] = str(action["command"])
        elif isinstance(action, dict):
            converted = computer_13_code(action)
        else:
            converted = action
        try:
            env.step(converted)
        except ActionFailed as exc:
            # OSWorld's VM runs the code, logs what it raised and the episode goes on.
            log.error("Failed to execute command: %s", exc)
            info["error"] = str(exc)
        time.sleep(pause)
        return self._get_obs(), 0.0, done, self._with_validity(env, info)

    def _with_validity(self, env: _client.Env, info: Dict[str, Any]) -> Dict[str, Any]:
        report = env.gates()
        if self.raise_on_invalid:
            gate_verdict(report, env.id)  # raises InvalidEpisode (or Quarantined) on a failure
        self.last_validity = validity(report)
        info.update(self.last_validity)
        return info

    def render(self, mode: str = "rgb_array") -> bytes:
        """The screenshot as PNG bytes (OSWorld's render gives the same)."""
        if mode != "rgb_array":
            raise ValueError(f"render mode must be 'rgb_array', not {mode!r}")
        return self._live().observe().png

    @property
    def vm_platform(self) -> str:
        return "Linux"

    @property
    def vm_machine(self) -> str:
        """The desktop's CPU architecture. A drums desktop is a container on the daemon's host
        kernel, not a VM, so this is the host's machine; it is read here, which is right when the
        daemon runs on this host (the usual case), not for a daemon on another architecture."""
        return platform.machine()

    @property
    def vm_screen_size(self) -> Dict[str, int]:
        """As OSWorld's controller returns it: {"width": ..., "height": ...}."""
        return {"width": int(self.screen_size[0]), "height": int(self.screen_size[1])}

    @contextmanager
    def fork(self, n: int = 1) -> Iterator[List[DesktopEnv]]:
        """A drums extra: `with env.fork(4) as copies:` N DesktopEnvs on copies of this desktop as
        it is now (same instruction and history), each with step/evaluate of its own; destroyed
        on exit. The branches of a search, or K rollouts from one mid-task state."""
        with self._live().fork(n) as children:
            copies = [self._copy_on(child) for child in children]
            try:
                yield copies
            finally:
                for copy in copies:
                    copy.env = None  # the fork's own exit destroys the children

    def _copy_on(self, child: _client.Env) -> DesktopEnv:
        copy = DesktopEnv(
            action_space=self.action_space,
            screen_size=self.screen_size,
            require_terminal=self.require_terminal,
            client=self.client,
            image=self.image,
            raise_on_invalid=self.raise_on_invalid,
        )
        copy.env = child
        copy.instruction = self.instruction
        copy.action_history = list(self.action_history)
        return copy

    def evaluate(self) -> float:
        """The task's checker score; drums' validity is in `self.last_verify` (and raises
        InvalidEpisode with raise_on_invalid=True). Waits first for the gates reset left pending
        (LATE_GATES), as step does before DONE or FAIL."""
        env = self._live()
        self._wait_gates_judged(env)
        result = env.verify(strict=False)
        self.last_verify = result
        if not result.valid and self.raise_on_invalid:
            raise InvalidEpisode(
                f"invalid episode: {', '.join(result.invalid_reasons) or result.verdict}",
                env_id=result.slot,
            )
        return float(result.score or 0.0)

    def close(self) -> None:
        """Destroy the env (and the client this made)."""
        self.controller.discard_recording()
        if self.env is not None:
            try:
                self.env.close()
            finally:
                self.env = None
        if self._own_client:
            self.client.close()

    def _live(self) -> _client.Env:
        if self.env is None:
            raise RuntimeError("no desktop yet: call reset(task_config=...) first")
        return self.env


class Controller:
    """`env.controller`: what OSWorld's runner and agents call on its PythonController, over the
    drums env. Like OSWorld's, a call that cannot be done logs the error and returns None; it
    does not raise into the runner (run.py calls end_recording again after an exception)."""

    def __init__(self, desktop: DesktopEnv) -> None:
        self._desktop = desktop
        self._recorder: Optional[ScreenRecorder] = None
        self._recorder_client: Optional[_client.Client] = None

    def _close_recorder_client(self) -> None:
        client, self._recorder_client = self._recorder_client, None
        if client is not None:
            client.close()  # owns no env: the attached one stays the runner's

    def start_recording(self) -> None:
        """Start a video of the episode (screenshots sampled at RECORDING_FPS by a thread)."""
        if self._recorder is not None and self._recorder.running:
            log.error("Failed to start recording: a recording is already in progress")
            return
        env = self._desktop.env
        if env is None:
            log.error("Failed to start recording: no desktop yet, call reset() first")
            return

        # The recorder's thread grabs through a connection of its own, never the one the
        # runner's steps and gate reads go through.
        own = env._client
        client = _client.Client(
            own.url,
            own._settings.token,
            timeout=own.timeouts,
            retry=own.retry,
            transport=own._http._transport,
        )
        watched = client.attach(env.id)

        def grab() -> bytes:
            return watched.observe(format="jpeg", quality=80).png

        recorder = ScreenRecorder(grab, RECORDING_FPS)
        try:
            recorder.start()
        except (RecordingUnavailable, OSError) as exc:
            log.error("Failed to start recording: %s", exc)
            client.close()
            return
        self._recorder, self._recorder_client = recorder, client
        log.info("Recording started successfully")

    def end_recording(self, dest: str) -> None:
        """Stop the recording and write the mp4 to `dest`."""
        recorder, self._recorder = self._recorder, None
        if recorder is None or not recorder.running:
            log.error("Failed to stop recording: no recording in progress")
            return
        try:
            recorder.stop(dest)
        except (RuntimeError, OSError) as exc:
            log.error("Failed to stop recording: %s", exc)
            return
        finally:
            self._close_recorder_client()
        log.info("Recording stopped successfully: %s (%d frames)", dest, recorder.frames)

    def discard_recording(self) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is not None and recorder.running:
            recorder.cancel()
        self._close_recorder_client()

    def get_screenshot(self) -> Optional[bytes]:
        env = self._desktop.env
        return None if env is None else env.observe().png

    def get_accessibility_tree(self) -> Optional[str]:
        env = self._desktop.env
        return None if env is None else env.accessibility_tree().tree

    def get_terminal_output(self) -> Optional[str]:
        env = self._desktop.env
        return None if env is None else env.terminal().text

    def get_vm_platform(self) -> str:
        return self._desktop.vm_platform

    def get_vm_machine(self) -> str:
        return self._desktop.vm_machine

    def get_vm_screen_size(self) -> Dict[str, int]:
        return self._desktop.vm_screen_size

    def execute_python_command(self, command: str) -> Optional[Dict[str, Any]]:
        """Run Python (pyautogui already imported) on the desktop, answered as OSWorld's server
        answers: status, output, error, returncode."""
        env = self._desktop.env
        if env is None:
            log.error("Failed to execute command: no desktop yet, call reset() first")
            return None
        try:
            result = env.step(command)
        except ActionFailed as exc:
            log.error("Failed to execute command: %s", exc)
            return {"status": "error", "output": "", "error": str(exc), "returncode": 1}
        out = result.output
        return {
            "status": "success",
            "output": out.stdout if out else "",
            "error": out.stderr if out else "",
            "returncode": out.returncode if out else 0,
        }
