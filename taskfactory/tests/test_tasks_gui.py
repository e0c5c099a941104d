"""GUI solutions replayed for real: LibreOffice on a private Xvfb display, driven by the
solutions' own pyautogui steps, then scored by both checkers.

Opt-in (several minutes): DRUMS_TASKS_GUI=1, with Xvfb, openbox, xdotool, a GUI LibreOffice
(libreoffice-calc/-writer/-impress, not the -nogui builds) and a Python that has pyautogui
(DRUMS_TASKS_PYAUTOGUI_PYTHON, default: this interpreter). This is the desktop part of the live
validator without drumsd: the same actions, the same files, a real app.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from drums_tasks import FAMILIES, load_all
from drums_tasks.build import generate
from drums_tasks.spec import Solution, TaskSpec
from drums_tasks.verifier import CHECKS

load_all()
HOME = "/home/user"
DISPLAY = ":87"
PY = os.environ.get("DRUMS_TASKS_PYAUTOGUI_PYTHON", sys.executable)
NEEDED = ["Xvfb", "openbox", "xdotool", "soffice"]

pytestmark = pytest.mark.skipif(
    os.environ.get("DRUMS_TASKS_GUI") != "1" or any(shutil.which(t) is None for t in NEEDED),
    reason=f"opt-in: DRUMS_TASKS_GUI=1 and {', '.join(NEEDED)} installed",
)

# LibreOffice's first start shows a modal "tip of the day" that would eat the keystrokes; the
# desktop image must ship the same setting.
REGISTRY = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry"
 xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="ShowTipOfTheDay"
 oor:op="fuse"><value>false</value></prop></item>
<item oor:path="/org.openoffice.Office.Common/Misc"><prop oor:name="FirstRun"
 oor:op="fuse"><value>false</value></prop></item>
</oor:items>
"""


def gui_families() -> list[str]:
    return sorted(
        n
        for n in FAMILIES
        if FAMILIES[n].app.startswith(("libreoffice", "multi"))
        and any(isinstance(a, str) for a in generate(21, n, 0)[1].oracle.actions)
    )


@pytest.fixture(scope="module")
def display(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    auth = tmp_path_factory.mktemp("x") / "Xauthority"
    auth.touch()
    env = {**os.environ, "DISPLAY": DISPLAY, "XAUTHORITY": str(auth)}
    xvfb = subprocess.Popen(
        ["Xvfb", DISPLAY, "-screen", "0", "1920x1080x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while subprocess.run(["xdotool", "getmouselocation"], env=env, capture_output=True).returncode:
        assert time.monotonic() < deadline, "Xvfb did not come up within 20 s"
        time.sleep(0.2)
    wm = subprocess.Popen(
        ["openbox"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    yield env
    for p in (wm, xvfb):
        p.terminate()
        p.wait(timeout=10)


def _wait_window(name: str, env: dict[str, str], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while subprocess.run(
        ["xdotool", "search", "--name", name], env=env, capture_output=True
    ).returncode:
        assert time.monotonic() < deadline, f"no window named {name} after {timeout} s"
        time.sleep(0.5)


def play(spec: TaskSpec, sol: Solution, root: Path, env: dict[str, str]) -> tuple[float, float]:
    for p, data in spec.files.items():
        q = root / p[len(HOME) + 1 :]
        q.parent.mkdir(parents=True, exist_ok=True)
        q.write_bytes(data)
    profile = root / "lo-profile"
    (profile / "user").mkdir(parents=True)
    (profile / "user" / "registrymodifications.xcu").write_text(REGISTRY)
    apps = []
    try:
        for step in spec.launch:
            if step["type"] != "open":
                continue
            path = step["parameters"]["path"]
            local = str(root / path[len(HOME) + 1 :])
            apps.append(
                subprocess.Popen(
                    ["soffice", f"-env:UserInstallation=file://{profile}", "--norestore", local],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
            )
            _wait_window(os.path.basename(path), env)
            time.sleep(3)  # the document finishes loading after the window maps
        for a in sol.actions:
            if isinstance(a, str):
                subprocess.run([PY, "-c", a], env=env, check=True, capture_output=True)
            elif a["type"] == "wait":
                time.sleep(a["seconds"])
            else:
                argv = [x.replace(HOME, str(root)) for x in a["command"]]
                subprocess.run(argv, env=env, capture_output=True, timeout=300)
        time.sleep(2)
    finally:
        for app in apps:
            try:
                os.killpg(app.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            app.wait(timeout=30)
    paths = {}
    for vm, dest in spec.results:
        q = root / vm[len(HOME) + 1 :]
        paths[dest] = str(q) if q.is_file() else None
    return CHECKS[spec.check](paths, spec.options), CHECKS[spec.check_alt](paths, spec.options)


@pytest.mark.parametrize("family", gui_families() if os.environ.get("DRUMS_TASKS_GUI") else [])
def test_gui_solutions_on_libreoffice(family: str, display: dict[str, str], tmp_path: Path) -> None:
    _, spec = generate(21, family, 0)
    results = {}
    for k, (sol, want) in enumerate([(spec.oracle, 1.0)] + [(s, 0.0) for s in spec.near_misses]):
        got = play(spec, sol, tmp_path / str(k), display)
        results[sol.name] = (got, want)
    assert {n: g for n, (g, w) in results.items() if g != (w, w)} == {}
