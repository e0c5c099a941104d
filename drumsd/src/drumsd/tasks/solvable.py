"""Whether a task that runs here can also be solved here (issue 32): "supported" means solvable.

The apps a task needs are `apps.py`'s (related_apps, the programs its steps and getters run, sound,
the programs its instruction names); this is what its solution or its checker needs beyond them:

- the network, when the instruction sends the agent to a web site (a URL, a domain, a store) or
  asks it to install software the task's setup gives it nothing to install from (slots have none);
- a terminal on ctrl+alt+t, when the checker presses it to read the terminal it opens (no drums
  desktop binds ctrl+alt+t: 13584542's check could only ever see no terminal);
- the desktop's xterm, when a getter reads the terminal's text: it reads that xterm, and a desktop
  whose session runs none (the osworld image's terminal is GNOME Terminal) gives it nothing;
- a check an untouched desktop fails: a task whose checker already passes on the desktop as it
  starts (found by the do-nothing sweep) poses nothing to solve and scores an idle agent 1.

Pure: the task and the image's app manifest in, the first reason (or None) out.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from drumsd.linux.image_apps import AppManifest

if TYPE_CHECKING:
    from .model import Task

_URL = re.compile(r"https?://(?!(?:localhost|127\.0\.0\.1|0\.0\.0\.0)[:/])[^\s'\"]+")
# A domain name, not an e-mail address's (writing to someone@example.com needs no network).
_DOMAIN = re.compile(
    r"(?<![@\w.-])(?:[a-z0-9-]+\.)+(?:com|org|net|io|edu|gov|dev)\b(?!\.)", re.IGNORECASE
)
_STORE = re.compile(
    r"\b(?:plug-?in|extension|app|web|chrome web|add-?on)s? store\b|\bmarketplace\b", re.IGNORECASE
)
_INSTALL = re.compile(r"\binstall(?:s|ed|ing)?\b", re.IGNORECASE)
# A local file the instruction points at ("/home/user/test.vsix", "~/x", "the Desktop directory").
_LOCAL = re.compile(r"(?:^|[\s\"'(])(?:/|~/)\w|\b(?:Desktop|Downloads|Documents)\b")
# Setup steps that put a file on the desktop to install from.
FILE_STEPS = frozenset({"download", "upload_file", "drums_files"})
_CTRL_ALT_T = re.compile(
    r"hotkey\(\s*['\"]ctrl['\"]\s*,\s*['\"]alt['\"]\s*,\s*['\"]t['\"]\s*\)", re.IGNORECASE
)
TERMINAL_GETTER = "vm_terminal_output"


def web_need_of_instruction(task: Task) -> str | None:
    """What in the instruction needs the network to be done."""
    text = task.instruction
    for pattern, what in ((_URL, "the web site"), (_DOMAIN, "the web site"), (_STORE, "the")):
        found = pattern.search(text)
        if found:
            return f"its instruction sends the agent to {what} {found.group(0).rstrip('.,;:)')!r}"
    if _INSTALL.search(text) and not _LOCAL.search(text):
        if not any(step.type in FILE_STEPS for step in task.config):
            return "its instruction asks to install software its setup gives no file of"
    return None


def _getters(task: Task) -> list[dict[str, object]]:
    ev = task.evaluator
    out: list[dict[str, object]] = []
    values = [ev.result, ev.expected]
    if ev.redundant:
        values += [ev.redundant.get("result"), ev.redundant.get("expected")]
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                out.append(item)
    return out


def checker_terminal_hotkey(task: Task) -> bool:
    """Whether the checker's postconfig presses ctrl+alt+t (to open the terminal it reads)."""
    for step in task.evaluator.postconfig:
        command = step.parameters.get("command")
        texts = command if isinstance(command, list) else [command]
        if any(isinstance(t, str) and _CTRL_ALT_T.search(t) for t in texts):
            return True
    return False


def untouched_pass_reason(task: Task, manifest: AppManifest | None) -> str | None:
    """Why the task's checker passes on the desktop as it starts, or None."""
    for getter in _getters(task):
        kind = getter.get("type")
        if kind == "data_delete_automacally":
            # OSWorld's getter answers "true" when Preferences has
            # profile.default_content_setting_values at all, which Chromium writes on its own.
            return (
                "its checker passes untouched: OSWorld's data_delete_automacally getter answers "
                "true for any profile with content settings, which Chromium writes by itself"
            )
        if kind == "default_video_player" and manifest is not None:
            # The check is that VLC is the default; on an image with no other video player
            # (OSWorld's Ubuntu has Totem), xdg-mime already answers vlc.desktop.
            if "vlc" in manifest.apps and "totem" not in manifest.apps:
                return (
                    "its checker passes untouched: VLC is the image's only video player, so it "
                    "is the default already (OSWorld's Ubuntu has Totem as the default)"
                )
    return None


def unsolvable_reason(task: Task, manifest: AppManifest | None) -> str | None:
    """Why a task the host can run and score still cannot be solved here, or None."""
    untouched = untouched_pass_reason(task, manifest)
    if untouched:
        return untouched
    web = web_need_of_instruction(task)
    if web:
        return f"{web}: solving it needs the network, and slots have none"
    if checker_terminal_hotkey(task):
        return (
            "its checker opens a terminal with ctrl+alt+t and reads it, and no drums desktop "
            "opens a terminal on ctrl+alt+t"
        )
    reads_terminal = any(g.get("type") == TERMINAL_GETTER for g in _getters(task))
    if reads_terminal and manifest is not None and not manifest.desktop_xterm:
        image = f"image {manifest.profile!r}" if manifest.profile else "this image"
        return (
            f"getter {TERMINAL_GETTER!r} reads the desktop's xterm, and {image} runs none (its "
            "session's terminal is another program, whose text no getter reads)"
        )
    return None
