"""OSWorld's own runner (its run.py and lib_run_single.py, unchanged but for the line importing
DesktopEnv) drives drums.osworld.DesktopEnv over ten shared OSWorld tasks on the osworld image
with a scripted agent: four solved (1 each: a file renamed, two GNOME settings, an infeasible task
answered FAIL), six left undone after a line of code that raises (0 each; OSWorld logs that line
and goes on). Each task's result.txt holds its score, its recording.mp4 is an H.264 video of the
episode, and the run ends with its average.

Opt-in: DRUMS_OSWORLD_RUNNER=<a directory holding OSWorld's run.py and lib_run_single.py, and
its mm_agents package when its lib_run_single imports from it> (its public source, never
committed here), after `bash scripts/setup.sh osworld`; the runner's own dependencies
(RUNNER_PACKAGES) go into a venv made for the test from PyPI, with this tree's SDK.
mm_agents/agent.py is replaced by the scripted agent. Tasks from /work/shared/osworld.
DRUMS_OSWORLD_RUNNER_KEEP=<dir>: the run's results (scores, recordings, trajectories) copied there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from live_daemon import start_live_daemon, stop_and_clean

RUNNER = os.environ.get("DRUMS_OSWORLD_RUNNER")
if not RUNNER:
    pytest.skip(
        "OSWorld's runner opt-in: DRUMS_OSWORLD_RUNNER=<dir with OSWorld's run.py and "
        "lib_run_single.py>",
        allow_module_level=True,
    )
os.environ.setdefault("DRUMS_LIVE", "1")  # opted in: a missing image fails, never skips

OSWORLD = Path("/work/shared/osworld")
ROOT = Path(__file__).resolve().parents[2]
IMPORT_LINE = "from desktop_env.desktop_env import DesktopEnv"
# (domain, id, what the scripted agent does, the score OSWorld's evaluate gives)
TASKS = [
    ("os", "e0df059f-28a6-4169-924f-b9623e7184cc", "solve", 1.0),
    ("os", "c288e301-e626-4b98-a1ab-159dcb162af5", "refuse", 1.0),
    ("os", "a4d98375-215b-4a4d-aee9-3d4370fccc41", "lock", 1.0),
    ("os", "f9be0997-4b7c-45c5-b05c-4612b44a6118", "quiet", 1.0),
    ("os", "bedcedc4-4d72-425e-ad62-21960b11fe0d", "idle", 0.0),
    ("os", "3ce045a0-877b-42aa-8d2c-b4a863336ab8", "idle", 0.0),
    ("chrome", "030eeff7-b492-4218-b312-701ec99ee0cc", "idle", 0.0),
    ("chrome", "2ae9ba84-3a0d-4d4c-8338-3a1478dc5fe3", "idle", 0.0),
    ("gimp", "7767eef2-56a3-4cea-8c9f-48c070c7d65b", "idle", 0.0),
    ("gimp", "7b7617bd-57cc-468e-9c91-40c4ec2bcb3d", "idle", 0.0),
]
IMAGE = "osworld"  # the GNOME settings tasks need its schemas
RUNNER_PACKAGES = ["tqdm", "wrapt-timeout-decorator", "python-dotenv", "requests", "imageio-ffmpeg",
                   "pillow", "pyyaml"]  # fmt: skip

# The scripted agent, as OSWorld's run.py imports it (mm_agents.agent.PromptAgent).
AGENT = """
import json

SCRIPTS = json.loads({scripts!r})


class PromptAgent:
    def __init__(self, action_space="pyautogui", **kwargs):
        self.action_space = action_space
        self.turns = 0

    def reset(self, *args, **kwargs):
        self.turns = 0

    def predict(self, instruction, obs):
        self.turns += 1
        if self.turns > 1:
            return {{"turn": self.turns}}, ["DONE"]
        return {{"turn": self.turns}}, list(SCRIPTS[instruction])
"""
SCRIPTS = {
    "solve": [
        "import subprocess; subprocess.run(['mv', '/home/user/Desktop/todo_list_Jan_1', "
        "'/home/user/Desktop/todo_list_Jan_2'], check=True)",
        "DONE",
    ],
    "refuse": ["FAIL"],
    "lock": [
        "import subprocess; subprocess.run(['gsettings', 'set', 'org.gnome.desktop.screensaver', "
        "'lock-enabled', 'true'], check=True)",
        "DONE",
    ],
    "quiet": [
        "import subprocess; subprocess.run(['gsettings', 'set', "
        "'org.gnome.desktop.notifications', 'show-banners', 'false'], check=True)",
        "DONE",
    ],
    "idle": ["pyautogui.no_such_function()", "pyautogui.typewrite('a<b')", "DONE"],
}


def runner_venv(where: Path) -> Path:
    uv = shutil.which("uv")
    assert uv, "uv is not on PATH (scripts/setup.sh installs it)"
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(where)], check=True)
    python = where / "bin" / "python"
    subprocess.run(
        [uv, "pip", "install", "-q", "--python", str(python), *RUNNER_PACKAGES,
         "-e", str(ROOT / "sdk")],
        check=True,
    )  # fmt: skip
    return python


def test_osworlds_runner_completes_a_run_on_the_drop_in(tmp_path: Path) -> None:
    if not OSWORLD.is_dir():
        pytest.skip(f"no shared OSWorld tasks at {OSWORLD}")
    source = Path(RUNNER or "")
    work = tmp_path / "runner"
    (work / "logs").mkdir(parents=True)
    run_py = (source / "run.py").read_text()
    assert run_py.count(IMPORT_LINE) == 1, f"{source}/run.py does not import {IMPORT_LINE!r}"
    (work / "run.py").write_text(
        run_py.replace(IMPORT_LINE, "from drums.osworld import DesktopEnv")
    )
    for lib in source.glob("lib_*.py"):
        shutil.copy(lib, work / lib.name)
    examples = work / "evaluation_examples"
    scripts, meta = {}, {}
    for domain, task_id, script, _ in TASKS:
        task = json.loads((OSWORLD / domain / f"{task_id}.json").read_text())
        (examples / "examples" / domain).mkdir(parents=True, exist_ok=True)
        (examples / "examples" / domain / f"{task_id}.json").write_text(json.dumps(task))
        scripts[task["instruction"]] = SCRIPTS[script]
        meta.setdefault(domain, []).append(task_id)
    (examples / "test_all.json").write_text(json.dumps(meta))
    # OSWorld's current lib_run_single imports helpers from its mm_agents package: that package
    # as the checkout has it when it is there, with the scripted agent as its agent module.
    if (source / "mm_agents").is_dir():
        shutil.copytree(source / "mm_agents", work / "mm_agents")
    else:
        (work / "mm_agents").mkdir()
        (work / "mm_agents" / "__init__.py").write_text("")
    agent = AGENT.format(scripts=json.dumps(scripts))
    (work / "mm_agents" / "agent.py").write_text(agent)
    python = runner_venv(tmp_path / "venv")

    root = tmp_path / "drumsd"
    daemon = start_live_daemon(root, image=IMAGE, start_limit_s=120)
    out = ""
    try:
        env = {**os.environ, "DRUMS_URL": daemon.url, "DRUMS_TOKEN": daemon.token}
        env.pop("DRUMS_TOKEN_FILE", None)
        args = ["--observation_type", "screenshot", "--sleep_after_execution", "0.5",
                "--max_steps", "3", "--result_dir", str(work / "results"),
                "--test_config_base_dir", str(examples),
                "--test_all_meta_path", str(examples / "test_all.json")]  # fmt: skip
        run = subprocess.run(
            [str(python), "run.py", *args], cwd=work, env=env, capture_output=True, text=True,
            timeout=1800,
        )  # fmt: skip
        out = run.stdout + run.stderr
        assert run.returncode == 0, out[-6000:]
    finally:
        stop_and_clean(daemon, root / "state", root)
    keep = os.environ.get("DRUMS_OSWORLD_RUNNER_KEEP")
    if keep and (work / "results").is_dir():  # before the checks: a failing run's are kept too
        shutil.copytree(work / "results", Path(keep), dirs_exist_ok=True)
        (Path(keep) / "run.log").write_text(out)

    import imageio_ffmpeg

    for domain, task_id, script, expected in TASKS:
        found = list((work / "results").rglob(f"{domain}/{task_id}/result.txt"))
        assert len(found) == 1, (task_id, out[-4000:])
        result_dir = found[0].parent
        assert float(found[0].read_text()) == expected, (task_id, script, out[-4000:])
        video = result_dir / "recording.mp4"
        assert video.is_file(), (task_id, sorted(p.name for p in result_dir.iterdir()))
        frames, seconds = imageio_ffmpeg.count_frames_and_secs(str(video))
        assert frames >= 2 and seconds > 0.5, (task_id, frames, seconds)
        # run.py writes {"Error": ...} into traj.jsonl when run_single_example raised.
        assert '{"Error"' not in (result_dir / "traj.jsonl").read_text(), task_id
    idle = sum(1 for task in TASKS if task[2] == "idle")
    assert out.count("Failed to execute command") >= idle, out[-4000:]  # the idle tasks' bad line
