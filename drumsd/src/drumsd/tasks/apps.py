"""Which desktop apps a task needs (issue 19), against what its image has.

The support check compares a task's `related_apps`, the programs its setup, postconfig and
command getters run, and the GNOME settings schemas it reads or writes with the image's app
manifest (`linux/image_apps.py`, written by the image builder). A task that needs what the image
lacks is unsupported, with the app named, instead of failing half-way through setup (or scoring
0 for ever, as a settings task does when `gsettings get` has no schema to read). Pure.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from drumsd.linux.image_apps import APPS, AppManifest

if TYPE_CHECKING:
    from .model import Task

# OSWorld's related_apps spellings -> drums' app names ("os": the desktop itself, always there).
ALIASES: dict[str, str] = {
    "google_chrome": "chrome",
    "chromium": "chrome",
    "vs_code": "vscode",
    "code": "vscode",
    "visual_studio_code": "vscode",
    "file_manager": "files",
    "writer": "libreoffice_writer",
    "calc": "libreoffice_calc",
    "impress": "libreoffice_impress",
    "browser": "chrome",  # the only browser on OSWorld's desktop
    "ubuntu_media_player": "totem",
}
ALWAYS_PRESENT = frozenset({"os"})

# Programs a setup step or command getter may start, by the app they belong to. Only these are
# checked: anything else (coreutils, python3, socat's port forward for OSWorld's host) is either
# in every image or not an app a task is about.
COMMAND_APPS: dict[str, str] = {
    "google-chrome": "chrome",
    "google-chrome-stable": "chrome",
    "chromium": "chrome",
    "localc": "libreoffice_calc",
    "lowriter": "libreoffice_writer",
    "loimpress": "libreoffice_impress",
    "gimp": "gimp",
    "thunderbird": "thunderbird",
    "vlc": "vlc",
    "cvlc": "vlc",
    "code": "vscode",
    "nautilus": "nautilus",
    "gnome-terminal": "gnome_terminal",
    "gsettings": "gsettings",
    "dconf": "dconf",
    "pactl": "sound",
    "pacmd": "sound",
    "pulseaudio": "sound",
}
# Programs a task's instruction names as the way to its solution ("I ran conda install ..."):
# without one on the desktop the task cannot be solved as asked (48d05431: appending conda's
# init comment to ~/.bashrc satisfies its checker, conda stays absent).
INSTRUCTION_PROGRAMS: dict[str, str] = {"conda": "conda"}
_WORD = re.compile(r"[A-Za-z][\w.+-]*")
# `libreoffice --calc` and the like name the module by flag.
LIBREOFFICE_FLAGS = {
    "--calc": "libreoffice_calc",
    "--writer": "libreoffice_writer",
    "--impress": "libreoffice_impress",
}
# What an `open` step's file opens in (xdg-open on OSWorld's desktop, by the file's type).
OPEN_APPS: dict[str, str] = {
    **dict.fromkeys(("xlsx", "xls", "ods", "csv"), "libreoffice_calc"),
    **dict.fromkeys(("docx", "doc", "odt", "rtf"), "libreoffice_writer"),
    **dict.fromkeys(("pptx", "ppt", "odp"), "libreoffice_impress"),
    **dict.fromkeys(("mp4", "mkv", "avi", "mov", "webm", "mp3", "wav", "flac", "ogg"), "vlc"),
    "xcf": "gimp",
    "pdf": "pdf",
    **dict.fromkeys(("jpg", "jpeg", "png", "bmp", "gif", "webp"), "image"),
}
_GSETTINGS = re.compile(
    r"\bgsettings\s+(?:--schemadir\s+\S+\s+)?"
    r"(?:get|set|reset|range|describe|writable|monitor|list-keys|list-children|list-recursively)"
    r"\s+['\"]?([A-Za-z0-9_.-]+?)(?::[^\s'\"]*)?['\"]?(?=\s|$)"
)
COMMAND_GETTERS = ("vm_command_line", "vm_command_error")
_SHELL_SEPARATORS = re.compile(r"&&|\|\||[;|&\n()`]|\$\(")


def app_name(related: str) -> str:
    """OSWorld's spelling of an app ('libreoffice calc', 'vs_code') as drums' name."""
    key = re.sub(r"[\s-]+", "_", related.strip().lower())
    return ALIASES.get(key, key)


# ---------------------------------------------------------------- pure: what a task needs


@dataclass(frozen=True)
class Need:
    app: str  # drums' name (or the unknown related_apps spelling)
    why: str  # "related_apps", "runs `code`", ...


def _setup_commands(
    task: Task, kinds: tuple[str, ...] = ("execute", "command", "launch")
) -> Iterator[list[str] | str]:
    """The commands of a task's setup and postconfig steps of these kinds."""
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type in kinds:
            command = step.parameters.get("command")
            if isinstance(command, (list, str)):
                yield command


def _commands(task: Task) -> Iterator[list[str] | str]:
    yield from _setup_commands(task)
    ev = task.evaluator
    getters: list[Any] = []
    for value in (ev.result, ev.expected):
        getters += value if isinstance(value, list) else [value]
    if ev.redundant:
        for key in ("result", "expected"):
            value = ev.redundant.get(key)
            getters += value if isinstance(value, list) else [value]
    for getter in getters:
        if isinstance(getter, dict) and getter.get("type") in COMMAND_GETTERS:
            command = getter.get("command")
            if isinstance(command, (list, str)):
                yield command


def _programs(command: list[str] | str) -> Iterator[list[str]]:
    """Each simple command's argv (a shell string split at its separators)."""
    if isinstance(command, list):
        if command and all(isinstance(a, str) for a in command):
            if command[0] in ("bash", "sh") and len(command) >= 3 and command[1] == "-c":
                yield from _programs(command[2])
            else:
                yield list(command)
        return
    for part in _SHELL_SEPARATORS.split(command):
        try:
            words = shlex.split(part)
        except ValueError:
            words = part.split()
        while words and ("=" in words[0] or words[0] in ("sudo", "timeout", "nohup", "env")):
            words.pop(0)
            while words and words[0].startswith("-"):
                words.pop(0)
            if words and re.fullmatch(r"\d+[smh]?", words[0]):
                words.pop(0)  # timeout's duration
        if words:
            yield words


# Chrome's profile directory as OSWorld's setups name it (mapped to Chromium's by setup_plan).
_CHROME_PROFILE = re.compile(r"\.config/(?:google-chrome|chromium)\b")


def _names_chrome_profile(value: Any) -> bool:
    if isinstance(value, str):
        return _CHROME_PROFILE.search(value) is not None
    if isinstance(value, dict):
        return any(_names_chrome_profile(v) for v in value.values())
    if isinstance(value, list):
        return any(_names_chrome_profile(v) for v in value)
    return False


def task_needs(task: Task) -> list[Need]:
    """The apps a task needs, each with why (its related_apps, or a program it runs)."""
    needs: dict[str, Need] = {}
    for related in task.related_apps:
        name = app_name(related)
        if name not in ALWAYS_PRESENT:
            needs.setdefault(name, Need(name, f"related_apps lists {related!r}"))
    for word in _WORD.findall(task.instruction):
        app = INSTRUCTION_PROGRAMS.get(word.lower())
        if app:
            needs.setdefault(app, Need(app, f"the instruction names `{word}`"))
    for step in [*task.config, *task.evaluator.postconfig]:
        if step.type == "update_browse_history" or _names_chrome_profile(step.parameters):
            why = f"its {step.type} step writes into Chrome's profile"
            needs.setdefault("chrome_profile", Need("chrome_profile", why))
        path = step.parameters.get("path") if step.type == "open" else None
        if isinstance(path, str) and "." in Path(path).name:
            app = OPEN_APPS.get(Path(path).suffix.lower().lstrip("."))
            if app:
                needs.setdefault(app, Need(app, f"opens a .{Path(path).suffix[1:]} file"))
    for command in _commands(task):
        for argv in _programs(command):
            program = Path(argv[0]).name
            app = COMMAND_APPS.get(program)
            if program in ("libreoffice", "soffice"):
                app = next((LIBREOFFICE_FLAGS[a] for a in argv[1:] if a in LIBREOFFICE_FLAGS), None)
            if app:
                needs.setdefault(app, Need(app, f"runs `{program}`"))
    return list(needs.values())


# Getters that read GNOME settings (vm_wallpaper: `gsettings get` of the background's picture-uri).
GETTER_SCHEMAS = {"vm_wallpaper": "org.gnome.desktop.background"}


def task_schemas(task: Task) -> list[str]:
    """The GSettings schemas a task's commands read or write (`gsettings get SCHEMA KEY`), and
    the ones its getters read."""
    seen: dict[str, None] = {}
    for command in _commands(task):
        text = " ".join(command) if isinstance(command, list) else command
        for match in _GSETTINGS.finditer(text):
            seen.setdefault(match.group(1), None)
    for role in (task.evaluator.result, task.evaluator.expected):
        for getter in role if isinstance(role, list) else [role]:
            schema = GETTER_SCHEMAS.get(str(getter.get("type"))) if getter else None
            if schema:
                seen.setdefault(schema, None)
    return list(seen)


def missing_app_reason(task: Task, manifest: AppManifest) -> str | None:
    """Why the image cannot run the task (the first app or schema it lacks), or None."""
    image = f"image {manifest.profile!r}" if manifest.profile else "this image"
    for need in task_needs(task):
        if need.app not in APPS:
            return f"needs the app {need.app!r} ({need.why}), which drums cannot find in an image"
        if need.app not in manifest.apps:
            return f"needs {APPS[need.app].label} ({need.why}), which {image} lacks"
    for schema in task_schemas(task):
        if schema not in manifest.schemas:
            return (
                f"needs the GSettings schema {schema!r} (GNOME settings via gsettings/dconf), "
                f"which {image} lacks"
            )
    return None


def missing_apps(tasks: Iterable[Task], manifest: AppManifest) -> dict[str, int]:
    """How many tasks each missing app (or schema) blocks, for the coverage table."""
    counts: dict[str, int] = {}
    for task in tasks:
        for need in task_needs(task):
            if need.app not in manifest.apps:
                counts[need.app] = counts.get(need.app, 0) + 1
        for schema in task_schemas(task):
            if schema not in manifest.schemas:
                counts[f"schema {schema}"] = counts.get(f"schema {schema}", 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


# Package managers' subcommands that fetch from the network: a slot has none, so a setup step that
# runs one fails (OSWorld's VM installs `jq` or `sysstat` at setup; the image may even have them,
# but `apt update` still fails offline).
NETWORK_SUBCOMMANDS = {
    "apt": {"update", "install", "upgrade"},
    "apt-get": {"update", "install", "upgrade"},
    "pip": {"install", "download"},
    "pip3": {"install", "download"},
    "snap": {"install"},
}


def network_setup_command(task: Task) -> str | None:
    """The first setup or postconfig program that fetches packages (`apt update`), or None."""
    for command in _setup_commands(task, ("execute", "command")):
        for argv in _programs(command):
            program = Path(argv[0]).name
            if program in NETWORK_SUBCOMMANDS and NETWORK_SUBCOMMANDS[program] & set(argv[1:]):
                return " ".join(argv[:3])
    return None


# systemd's own tools talk to its daemons over the system bus (timedated, hostnamed, localed,
# logind, pid 1); a slot runs no systemd, so they print nothing (`timedatectl status` on a slot:
# empty output, which OSWorld's is_utc_0 then indexes into).
SYSTEMD_TOOLS = frozenset(
    {"timedatectl", "hostnamectl", "localectl", "loginctl", "systemctl", "journalctl"}
)


def systemd_command(task: Task) -> str | None:
    """The first program of a task's setup, postconfig or command getters that needs systemd."""
    for command in _commands(task):
        for argv in _programs(command):
            if argv and Path(argv[0]).name in SYSTEMD_TOOLS:
                return " ".join(argv[:2])
    return None
