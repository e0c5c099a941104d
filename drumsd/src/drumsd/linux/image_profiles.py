"""What goes into each desktop image: the profiles (package lists, pip pins, extra files).

Pure data: `image.layer_key` hashes a profile, `image.build_image` builds one. A new profile is a
new entry in PROFILES.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from drumsd.linux import image_osworld, libreoffice_registry


@dataclass(frozen=True)
class Profile:
    name: str
    packages: tuple[str, ...]
    pip: tuple[str, ...] = ()
    # Extra files (path in image -> (mode, content)) that belong to the package layer.
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    # A shell script run in the chroot after the files are written (compile schemas, pick
    # alternatives).
    setup: str = ""
    # What the gates allow of this image's desktops; no file of the image changes with them, so
    # they are not in its layer key and a change takes effect at the daemon's next start.
    # Process names (comm, 15 characters) of helpers that exit on their own some seconds after
    # a restore: alive_after_resume does not count them (with the daemon's natural_exits).
    natural_exits: tuple[str, ...] = ()
    # Globs (fnmatch, relative to the slot's root; `*` crosses `/`) of caches the desktop
    # rewrites in place after a restore, where the file's times do not show it: the state_hash
    # gate does not compare them. Each must be a cache, never a file a task or checker reads.
    caches: tuple[str, ...] = ()
    # A command (argv) the desktop user runs right after every restore of a desktop of this
    # image (a create's, a reset's, a fork child's, a warm spare's claim), before the episode's
    # start gates read the tree: what the desktop must hear at once, having been asleep. It
    # must write no file (the state_hash gate) and exit at once; a failure is logged, never the
    # episode's (runtime/episodes.after_restore).
    after_restore: tuple[str, ...] = ()


BASE_PACKAGES: tuple[str, ...] = (
    "xvfb",
    "openbox",
    "xterm",
    "xdotool",
    "x11-utils",
    "x11-xserver-utils",
    "xclip",
    "scrot",
    "python3",
    "python-is-python3",
    "python3-pil",
    "python3-xlib",
    "python3-tk",  # pyautogui imports mouseinfo, which exits without tkinter
    "python3-pip",
    "dbus",
    "dbus-x11",
    "dconf-cli",
    "dconf-gsettings-backend",
    "libglib2.0-bin",
    "fonts-dejavu-core",
    "iproute2",
    "procps",
    "psmisc",
    "less",
    "ca-certificates",
)

# Chromium as OSWorld drives it, with what a checkpointable browser needs: no sandbox (its
# namespaces conflict with the slot's), no GPU process, nothing that phones home or syncs. Started
# without the desktop's name (XDG_CURRENT_DESKTOP, DESKTOP_SESSION): on GNOME Chromium 150 takes
# its GTK theme by default, which ignores the light/dark mode a task sets (93eabf48 started in
# light mode with dark mode in its Preferences, and the settings page offered no mode); without
# it Chromium runs its Classic theme, where the mode shows and can be changed.
GOOGLE_CHROME_WRAPPER = """\
#!/bin/sh
# drums: OSWorld calls google-chrome; this image ships Chromium with checkpoint-friendly flags.
port=--remote-debugging-port=1337
for a in "$@"; do case "$a" in --remote-debugging-port=*) port=;; esac; done
exec env -u XDG_CURRENT_DESKTOP -u DESKTOP_SESSION \\
    /usr/bin/chromium --no-sandbox --disable-gpu --no-first-run --no-default-browser-check \\
    --disable-background-networking --disable-component-update --disable-sync \\
    --password-store=basic --disable-dev-shm-usage --start-maximized $port "$@"
"""

# pyautogui and its pure-Python dependencies, pinned and installed with --no-deps: its declared
# dependency on the abandoned `python3-Xlib` 0.15 would shadow Debian's python3-xlib 0.33.
PYAUTOGUI: tuple[str, ...] = (
    "pyautogui==0.9.54",
    "pymsgbox==2.0.1",
    "pytweening==1.2.0",
    "pyscreeze==1.0.1",
    "pygetwindow==0.0.9",
    "pyrect==0.2.0",
    "mouseinfo==0.1.3",
    "pyperclip==1.11.0",
)

# System-wide LibreOffice defaults: no tip-of-the-day dialog and no "first run of 7.4" infobar,
# so the first frame of a task shows the document, as on OSWorld's VM.
LIBREOFFICE_DEFAULTS = libreoffice_registry.xcd(
    """\
<oor:component-data oor:name="Common" oor:package="org.openoffice.Office">
 <node oor:name="Misc">
  <prop oor:name="ShowTipOfTheDay" oor:op="fuse"><value>false</value></prop>
  <prop oor:name="FirstRun" oor:op="fuse"><value>false</value></prop>
 </node>
</oor:component-data>
<oor:component-data oor:name="Setup" oor:package="org.openoffice">
 <node oor:name="Product">
  <prop oor:name="ooSetupLastVersion" oor:op="fuse"><value>7.4</value></prop>
 </node>
</oor:component-data>
"""
)

# Chromium policies: no "unsupported command-line flag: --no-sandbox" infobar over every page, no
# default-browser or metrics prompts.
CHROMIUM_POLICY = (
    json.dumps(
        {
            "CommandLineFlagSecurityWarningsEnabled": False,
            "DefaultBrowserSettingEnabled": False,
            "MetricsReportingEnabled": False,
            "PromotionalTabsEnabled": False,
        },
        indent=2,
    )
    + "\n"
)

PROFILES: dict[str, Profile] = {
    "base": Profile("base", BASE_PACKAGES, pip=PYAUTOGUI),
    "office": Profile(
        "office",
        (
            *BASE_PACKAGES,
            "libreoffice-calc",
            "libreoffice-writer",
            "libreoffice-impress",
            "fonts-liberation2",
            "chromium",
            "gimp",
            "mousepad",
            "pcmanfm",
        ),
        pip=PYAUTOGUI,
        files={
            "usr/local/bin/google-chrome": (0o755, GOOGLE_CHROME_WRAPPER),
            "usr/local/bin/google-chrome-stable": (0o755, GOOGLE_CHROME_WRAPPER),
            "etc/libreoffice/registry/drums.xcd": (0o644, LIBREOFFICE_DEFAULTS),
            "etc/chromium/policies/managed/drums.json": (0o644, CHROMIUM_POLICY),
        },
    ),
}
PROFILES["osworld"] = image_osworld.profile(PROFILES["office"])


def natural_exits(image: str | None) -> tuple[str, ...]:
    """The natural exits the profile of `image` declares (none for an image no profile built)."""
    found = PROFILES.get(image or "")
    return found.natural_exits if found else ()


def state_caches(image: str | None) -> tuple[str, ...]:
    """The cache globs the state_hash gate skips on `image` (none for an unknown image)."""
    found = PROFILES.get(image or "")
    return found.caches if found else ()


def after_restore(image: str | None) -> tuple[str, ...]:
    """The after-restore command of `image`'s profile (none for an unknown image)."""
    found = PROFILES.get(image or "")
    return found.after_restore if found else ()
