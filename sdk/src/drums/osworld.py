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
"""

from __future__ import annotations

import atexit
import platform
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

from . import _client
from ._base import gate_verdict, validity
from ._exceptions import InvalidEpisode
from .models import VerifyResult

__all__ = [
    "DEFAULT_DIFFERENCES",
    "OSWORLD_INIT_PARAMS",
    "SPECIAL",
    "VM_ONLY",
    "DesktopEnv",
    "computer_13_code",
    "validity",
]

SPECIAL = ("WAIT", "DONE", "FAIL")
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
        if action_space not in ("computer_13", "pyautogui"):
            raise ValueError(f"action_space must be computer_13 or pyautogui, not {action_space!r}")
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
        self.action_history: List[Any] = []
        self.last_verify: Optional[VerifyResult] = None
        self.last_validity: Optional[Dict[str, Any]] = None
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
        self.env.wait_valid(timeout=120)
        return self._get_obs()

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
                env.step({"type": word.lower()})
                done = True
                info["done" if word == "DONE" else "fail"] = True
            return self._get_obs(), 0.0, done, self._with_validity(env, info)
        if isinstance(action, dict) and self.action_space == "pyautogui":
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
        env.step(converted)
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
    def vm_screen_size(self) -> Tuple[int, int]:
        return (int(self.screen_size[0]), int(self.screen_size[1]))

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
        InvalidEpisode with raise_on_invalid=True)."""
        result = self._live().verify(strict=False)
        self.last_verify = result
        if not result.valid and self.raise_on_invalid:
            raise InvalidEpisode(
                f"invalid episode: {', '.join(result.invalid_reasons) or result.verdict}",
                env_id=result.slot,
            )
        return float(result.score or 0.0)

    def close(self) -> None:
        """Destroy the env (and the client this made)."""
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
