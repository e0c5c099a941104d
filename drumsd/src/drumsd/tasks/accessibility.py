"""The desktop's accessibility tree, OSWorld's `accessibility_tree` observation and getter.

The guest's a11y.py walks AT-SPI and prints OSWorld's XML; it runs as the desktop user through
the agent's exec (the bus is the desktop user's session's), so this module only names the
command and reads its answer. Images whose session runs no AT-SPI bus answer with a reason.

The observation shows the whole bus, the agent's own windows included. The getter a checker
reads (`getter_argv`) asks for the tree of image binaries only, and of the task's apps when its
related_apps all name known ones: the bus is the desktop user's, who can register an app of its
own whose objects carry any role and name (issue 36, the `atspi` exploit strategy).
"""

from __future__ import annotations

from dataclasses import dataclass

from drumsd.guest import protocol

from .apps import app_name

ARGV = ["python3", "-I", protocol.A11Y_SCRIPT]
TIMEOUT_S = 30.0
# a11y.py's exit codes for "this desktop cannot give a tree" (not a failure of the reader).
NO_BINDINGS, NO_BUS = 3, 4
UNTRUSTED = 5  # a process the trusted reader talked to is not an image binary

# The executables (base names, as /proc/PID/exe ends) of the apps whose accessibility trees
# OSWorld's checkers read, by drums' app name (tasks/apps.py's spelling).
APP_EXECUTABLES: dict[str, tuple[str, ...]] = {
    "libreoffice": ("soffice.bin",),
    "libreoffice_calc": ("soffice.bin",),
    "libreoffice_writer": ("soffice.bin",),
    "libreoffice_impress": ("soffice.bin",),
    "chrome": ("chromium", "chrome"),
    "thunderbird": ("thunderbird",),
    "vlc": ("vlc",),
    "gimp": ("gimp-2.10", "gimp"),
    "gedit": ("gedit",),
    "files": ("nautilus",),
    "nautilus": ("nautilus",),
    "gnome_terminal": ("gnome-terminal-server",),
}


def app_executables(related_apps: list[str]) -> list[str]:
    """The executables the task's apps run, or [] (any image binary) when a related app is
    not in the table (`os`: the desktop itself) or none is listed."""
    names: list[str] = []
    for related in related_apps:
        known = APP_EXECUTABLES.get(app_name(related))
        if known is None:
            return []
        names += known
    return list(dict.fromkeys(names))


def getter_argv(related_apps: list[str]) -> list[str]:
    """The trusted reader's command for a task's accessibility_tree getter."""
    argv = [*ARGV, "--trusted"]
    for name in app_executables(related_apps):
        argv += ["--app", name]
    return argv


@dataclass(frozen=True)
class AccessibilityTree:
    xml: str | None  # None: no tree (the reason says why)
    reason: str | None = None


def parse(returncode: int, stdout: str, stderr: str) -> AccessibilityTree:
    if returncode == 0 and stdout.startswith("<desktop-frame"):
        return AccessibilityTree(stdout)
    detail = (stderr or stdout).strip()[-300:]
    if returncode == 127 or (returncode == 2 and "No such file" in detail):
        detail = f"this image has no accessibility dump ({protocol.A11Y_SCRIPT}): {detail}"
    elif returncode in (NO_BINDINGS, NO_BUS):
        detail = f"this desktop runs no AT-SPI accessibility bus (the osworld image does): {detail}"
    elif returncode == UNTRUSTED:
        detail = f"the accessibility bus is not the desktop's own: {detail}"
    return AccessibilityTree(None, reason=f"no accessibility tree ({returncode}): {detail}")
