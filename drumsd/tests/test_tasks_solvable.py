"""'Supported' means solvable (issue 32): a task the host can run and score is still refused when
its solution needs what a slot lacks (the network, sound, a program the instruction names), when
its checker reads a terminal no drums desktop opens, or when its checker passes on the desktop as
it starts. Each refusal names why. Tasks in the shape of OSWorld's current files (ids cited)."""

from __future__ import annotations

from pathlib import Path

from drumsd.linux.image_apps import AppManifest, probe_apps
from drumsd.tasks.apps import task_needs
from drumsd.tasks.host_support import support
from drumsd.tasks.model import MetricCatalog, Task, TaskContext
from drumsd.tasks.solvable import unsolvable_reason, web_need_of_instruction

OSWORLD_APPS = frozenset({"chrome", "gimp", "vlc", "libreoffice", "libreoffice_writer", "terminal"})
OSWORLD = AppManifest("osworld", OSWORLD_APPS, session="osworld")
OFFICE = AppManifest("office", OSWORLD_APPS)  # the openbox session: its xterm
CLICK = {"type": "execute", "parameters": {"command": ["python", "-c", "import pyautogui"]}}


def task(instruction: str = "x", config: list | None = None, **evaluator: object) -> Task:
    ev = {"func": "exact_match", "result": {"type": "rule", "rules": {}}, **evaluator}
    return Task.model_validate(
        {"id": "t1", "instruction": instruction, "config": config or [], "evaluator": ev}
    )


def ctx(manifest: AppManifest) -> TaskContext:
    catalog = MetricCatalog(exported=dict.fromkeys(("exact_match", "check_include_exclude"), "g"))
    return TaskContext(apps=manifest, metrics=catalog, capabilities=frozenset({"terminal_output"}))


def test_an_instruction_sending_the_agent_to_the_web_is_refused() -> None:
    # 3c8f201a, f8369178, 873cafdd, bba3381f
    cases = {
        'Download the image from "https://huggingface.co/x/kingbird.jpeg", then compress it': (
            "'https://huggingface.co/x/kingbird.jpeg'"
        ),
        "Help me to install Orchis theme from gnome-look.org and change to it.": "gnome-look.org",
        "Please go to the Chrome plug-in store and install all the listed plug-ins.": (
            "plug-in store"
        ),
        "Stream the video from this link for me? https://cdn.example.com/v.m3u8.": (
            "https://cdn.example.com/v.m3u8'"
        ),
    }
    for instruction, named in cases.items():
        reason = unsolvable_reason(task(instruction), OSWORLD) or ""
        assert named in reason and "needs the network" in reason, (instruction, reason)


def test_installing_needs_the_network_unless_the_setup_gives_a_file() -> None:
    # 94d95f96, e1fc0df3: nothing to install from; a74b607e, 0512bb38: the setup downloads it.
    for instruction in (
        "I want to install Spotify on my current system.",
        "Install LanguageTool extension for my LibreOffice",
    ):
        reason = unsolvable_reason(task(instruction, [CLICK]), OSWORLD) or ""
        assert "install software its setup gives no file of" in reason, reason
    given = [{"type": "download", "parameters": {"files": [{"url": "u", "path": "/tmp/e.zip"}]}}]
    assert unsolvable_reason(task("Install the extension on the Desktop.", given), OSWORLD) is None
    local = 'Install an extension in VS Code from a local VSIX file "/home/user/test.vsix".'
    assert web_need_of_instruction(task(local)) is None


def test_what_needs_no_network_is_not_refused() -> None:
    for instruction in (
        "Send the report to anna@example.com from Thunderbird.",  # an address, not a site
        "Open http://localhost:8080/ and save the page.",
        "Rename the file todo_list_Jan_1 to todo_list_Jan_2.",
        "Set the minimum number of undo steps to 100.",
    ):
        assert unsolvable_reason(task(instruction), OSWORLD) is None, instruction


def test_sound_and_conda_are_apps_the_image_must_have(tmp_path: Path) -> None:
    volume = task(
        "Turn up to the max volume",
        result={"type": "vm_command_line", "command": "pulseaudio --start\npactl list sinks"},
    )
    assert [n.app for n in task_needs(volume)] == ["sound"]
    ok, reason = support(volume, ctx(OSWORLD))
    assert not ok and "PulseAudio's pactl" in (reason or "") and "'osworld' lacks" in reason
    conda = task('When I ran "conda install datasets" I got "conda: command not found".')
    ok, reason = support(conda, ctx(OSWORLD))
    assert not ok and "the instruction names `conda`" in (reason or ""), reason
    # An image that has them: the probe finds pactl and conda where their files are.
    for rel in ("usr/bin/pactl", "opt/conda/bin/conda"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    found = probe_apps(tmp_path, "img")
    assert {"sound", "conda"} <= found.apps
    assert support(volume, ctx(found)) == (True, None)


HOTKEY_T = "import pyautogui; pyautogui.hotkey('ctrl', 'alt', 't'); pyautogui.write('stty size')"


def test_a_checker_reading_the_terminal_ctrl_alt_t_opens_is_refused() -> None:
    # 13584542: its postconfig presses ctrl+alt+t, then reads the terminal's text.
    post = [{"type": "execute", "parameters": {"command": ["python", "-c", HOTKEY_T]}}]
    checks = task(postconfig=post, result={"type": "vm_terminal_output"})
    for manifest in (OSWORLD, OFFICE):
        reason = unsolvable_reason(checks, manifest) or ""
        assert "ctrl+alt+t" in reason, reason
    # A setup that opens a terminal the same way leaves the task solvable (the dock opens one).
    opens = task(
        config=[{"type": "execute", "parameters": {"command": ["python", "-c", HOTKEY_T]}}]
    )
    assert unsolvable_reason(opens, OSWORLD) is None


def test_the_terminal_getter_needs_a_desktop_that_runs_its_xterm() -> None:
    # 4127319a: the getter reads the desktop's xterm; the osworld session's terminal is GNOME's.
    reads = task(result={"type": "vm_terminal_output"})
    reason = unsolvable_reason(reads, OSWORLD) or ""
    assert "'vm_terminal_output'" in reason and "image 'osworld' runs none" in reason
    assert unsolvable_reason(reads, OFFICE) is None
    assert OFFICE.desktop_xterm and not OSWORLD.desktop_xterm


def test_a_checker_that_passes_untouched_is_refused() -> None:
    # 937087b6: VLC is the only video player there; 99146c54: OSWorld's getter's own bug.
    player = task(result={"type": "default_video_player"})
    assert "only video player" in (unsolvable_reason(player, OSWORLD) or "")
    with_totem = AppManifest("ubuntu", OSWORLD_APPS | {"totem"})
    assert unsolvable_reason(player, with_totem) is None
    delete = task(result={"type": "data_delete_automacally"})
    assert "passes untouched" in (unsolvable_reason(delete, OSWORLD) or "")


def test_an_infeasible_task_is_not_refused_for_its_solution() -> None:
    # Its answer is FAIL, which needs nothing from the desktop.
    spotify = Task.model_validate(
        {"id": "t1", "instruction": "Install Spotify.", "evaluator": {"func": "infeasible"}}
    )
    assert support(spotify, ctx(OSWORLD)) == (True, None)


def test_the_session_is_in_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "etc/drums").mkdir(parents=True)
    assert probe_apps(tmp_path).session == "openbox"  # no session file: the default
    (tmp_path / "etc/drums/session").write_text("osworld\n")
    manifest = probe_apps(tmp_path, "osworld")
    assert manifest.session == "osworld" and not manifest.desktop_xterm
    assert AppManifest.from_json(manifest.to_json()).session == "osworld"


def test_a_setup_writing_chromes_profile_needs_one_made_at_build(tmp_path: Path) -> None:
    # 93eabf48 writes dark mode into Preferences; on an image whose Chromium never ran, Chromium
    # starting on the bare profile rewrote it, and opening the settings page alone scored 1.
    dark = {
        "type": "execute",
        "parameters": {"command": "mkdir -p /home/user/.config/google-chrome/Default && true"},
    }
    history = {"type": "update_browse_history", "parameters": {"history": []}}
    for step, kind in ((dark, "execute"), (history, "update_browse_history")):
        needs = {n.app: n.why for n in task_needs(task(config=[step]))}
        assert needs.get("chrome_profile") == f"its {kind} step writes into Chrome's profile"
    assert "chrome_profile" not in {n.app for n in task_needs(task(config=[CLICK]))}
    prefs = tmp_path / "home/user/.config/chromium/Default/Preferences"
    assert "chrome_profile" not in probe_apps(tmp_path).apps
    prefs.parent.mkdir(parents=True)
    prefs.write_text("{}")
    assert "chrome_profile" in probe_apps(tmp_path).apps
