"""The cold boot's "desktop drawn" wait (runtime/linux/boot.py): events, bounded, a clear error.

The supervision is a stand-in answering the agent's `windows` and `exec` (xprop) requests as a
booting desktop would; the Booter's wait is the real code.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
from drumsd.core.seams import RuntimeError_
from drumsd.runtime.linux import boot
from drumsd.runtime.linux.base import LinuxRuntimeConfig
from drumsd.runtime.linux.boot import Booter, expected_windows, wm_check_set

pytestmark = pytest.mark.unit

WM_SET = "_NET_SUPPORTING_WM_CHECK(WINDOW): window id # 0x200004\n"
WM_UNSET = "_NET_SUPPORTING_WM_CHECK:  not found.\n"


class Desktop:
    """Answers the agent calls of a desktop whose window manager comes up on the n-th ask."""

    def __init__(self, wm_after: int | None, windows: list[dict[str, Any]]) -> None:
        self.wm_after = wm_after
        self.windows = windows
        self.asks = 0
        self.driver = None

    async def agent_call(
        self, inst: Any, request: dict[str, Any], limit_s: float
    ) -> tuple[dict[str, Any], bytes]:
        if request["op"] == "windows":
            return {"ok": True, "windows": self.windows}, b""
        assert request["op"] == "exec" and request["argv"][:2] == ["xprop", "-root"]
        self.asks += 1
        up = self.wm_after is not None and self.asks >= self.wm_after
        return {"ok": True, "rc": 0, "stdout": WM_SET if up else WM_UNSET}, b""


def booter(tmp_path: Path, desktop: Desktop, timeout_s: float) -> Booter:
    config = LinuxRuntimeConfig(state_dir=tmp_path, boot_timeout_s=timeout_s)
    return Booter(config, desktop, None, None, None)  # type: ignore[arg-type]


def image(tmp_path: Path, session: str | None) -> Path:
    root = tmp_path / "image"
    (root / "etc/drums").mkdir(parents=True)
    if session:
        (root / "etc/drums/session").write_text(session + "\n")
    return root


@pytest.fixture(autouse=True)
def ready_file_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boot, "in_slot_exists", lambda pid, rel: True)


INST = SimpleNamespace(iid="tpl-test", pid=1, paths=None)


def test_helpers() -> None:
    assert expected_windows(True, ["libreoffice --calc"]) == 2
    assert expected_windows(False, []) == 0
    assert wm_check_set(WM_SET) and not wm_check_set(WM_UNSET) and not wm_check_set("")


def test_a_session_without_windows_is_ready_when_its_window_manager_runs(tmp_path: Path) -> None:
    # osworld's GNOME Shell maps no client window: before, the wait ran out its whole
    # boot_timeout_s (90 s by default) on every template boot.
    desktop = Desktop(wm_after=3, windows=[])
    b = booter(tmp_path, desktop, timeout_s=5.0)
    started = time.monotonic()
    windows = trio.run(b._wait_drawn, INST, (), image(tmp_path, "osworld"))
    assert windows == [] and desktop.asks == 3
    assert time.monotonic() - started < 2.0


def test_an_xterm_session_waits_for_its_window(tmp_path: Path) -> None:
    xterm = {"id": 1, "class": "XTerm", "name": "user@drums"}
    desktop = Desktop(wm_after=None, windows=[xterm])
    b = booter(tmp_path, desktop, timeout_s=5.0)
    assert trio.run(b._wait_drawn, INST, (), image(tmp_path, None)) == [xterm]
    assert desktop.asks == 0  # a listed window shows the window manager: no xprop


def test_missing_windows_past_the_bound_is_a_clear_timeout(tmp_path: Path) -> None:
    # The openbox session (no session file) wants its xterm and the app's window; none came.
    b = booter(tmp_path, Desktop(wm_after=None, windows=[]), timeout_s=0.5)
    with pytest.raises(RuntimeError_) as err:
        trio.run(b._wait_drawn, INST, ("gimp",), image(tmp_path, None))
    assert err.value.code == "timeout"
    message = err.value.message
    assert "boot_timeout_s=0.5" in message and "wants 2 window(s)" in message
    assert "'openbox'" in message and "['gimp']" in message and "seen: none" in message


def test_a_window_manager_that_never_comes_is_a_timeout(tmp_path: Path) -> None:
    b = booter(tmp_path, Desktop(wm_after=None, windows=[]), timeout_s=0.5)
    with pytest.raises(RuntimeError_, match="window manager: no"):
        trio.run(b._wait_drawn, INST, (), image(tmp_path, "osworld"))
