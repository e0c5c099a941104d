"""The desktop session desktop-init starts: chosen by the image's etc/drums/session file.

An image names its session in one line (`osworld`); without the file a slot runs the `openbox`
session (openbox and the printing xterm, as every image before profiles had sessions). A session
is the environment every session process and every command the agent runs sees, and the programs
started after Xvfb and the session bus; their config files are in session_files/. Kept apart from
the image's package layer so changing a session rebuilds no packages, only the image's guest
files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

SESSION_FILE = "/etc/drums/session"
# The sessions' own config files (panels, a bus config), as the image holds the guest package.
FILES = "/opt/drums/guest/drums_guest/session_files"
SYSTEM_BUS = "/run/user/1000/system_bus"  # in the desktop user's runtime dir: the user runs it
DEFAULT = "openbox"
AT_SPI_BUS_LAUNCHER = "/usr/libexec/at-spi-bus-launcher"


@dataclass(frozen=True)
class Session:
    name: str
    # Merged into the session environment; a None value removes the variable.
    env: dict[str, str | None] = field(default_factory=dict)
    # (log name, argv), started in order after Xvfb and the session D-Bus.
    programs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The xterm whose printer the terminal-output getter reads.
    xterm: bool = True
    # A template of this session is dumped once no process of it started or exited for this
    # long (0: no such wait): helpers the session starts on its own after login must be done,
    # or every restored desktop finishes their work (and fails the state_hash gate).
    settle_s: float = 0.0


# What OSWorld's Ubuntu session sets, and what makes GTK and GL run on Xvfb without a GPU.
_GNOME_ENV: dict[str, str | None] = {
    "XDG_CURRENT_DESKTOP": "GNOME",
    "XDG_SESSION_DESKTOP": "gnome",
    "XDG_SESSION_TYPE": "x11",
    "DESKTOP_SESSION": "gnome",
    "LIBGL_ALWAYS_SOFTWARE": "1",
    "GSK_RENDERER": "cairo",  # GTK4 (Files, Settings): no GL context to keep per window
    "NO_AT_BRIDGE": None,  # the accessibility tree is the point here
}
# The accessibility bus: at-spi-bus-launcher runs its own dbus-daemon and registers it on the
# session bus as org.a11y.Bus; the registry is activated on that bus by the first toolkit that
# registers (the Shell, a GTK app), so both are in the tree the template checkpoint dumps.
_A11Y_BUS = ("at-spi-bus", (AT_SPI_BUS_LAUNCHER, "--launch-immediately"))
# Without GDM the Shell has no lock screen and says so once, in a "Screen Lock disabled"
# notification, unless this file exists (its main.js creates it after showing that banner); the
# template was captured with the banner up, so every restored desktop showed it. OSWorld's VM runs
# GDM: no banner there.
_LOCK_WARNING_SHOWN = (
    'mkdir -p "$HOME/.local/share/gnome-shell" && '
    'touch "$HOME/.local/share/gnome-shell/lock-warning-shown"'
)

SESSIONS: dict[str, Session] = {
    "openbox": Session(
        "openbox",
        env={"NO_AT_BRIDGE": "1"},  # no accessibility bus: one process less, nothing lost here
        programs=(("openbox", ("openbox", "--sm-disable")),),
    ),
    # OSWorld's desktop: GNOME Shell in X11 mode on llvmpipe, with Ubuntu's dock (dash-to-dock
    # as Ubuntu 22.04 sets it up: session_files/osworld.dconf, loaded before the Shell starts so
    # it comes up on the desktop, not in the overview). The Shell talks to a system bus for
    # logind, UPower and the like; a slot has none, so the desktop user runs an empty one.
    "osworld": Session(
        "osworld",
        env={**_GNOME_ENV, "DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={SYSTEM_BUS}"},
        programs=(
            (
                "system-bus",
                (
                    "dbus-daemon",
                    f"--config-file={FILES}/system-bus.conf",
                    "--nofork",
                    "--nopidfile",
                ),
            ),
            _A11Y_BUS,
            (
                "gnome-shell",
                (
                    "sh",
                    "-c",
                    f"dconf load / < {FILES}/osworld.dconf; {_LOCK_WARNING_SHOWN}; "
                    "exec gnome-shell --x11 --replace",
                ),
            ),
        ),
        xterm=False,
        # Seen on a template boot (2026-12-06): dash-to-dock D-Bus-activates Nautilus as the
        # Shell starts (it runs some seconds, writing ~/.local/share/nautilus/tags, then exits),
        # and Tracker's file miner starts its crawl 15 s after login (tracker-extract comes and
        # goes ~30 s in). Dumped right after the Shell started, restored desktops ran
        # Nautilus's writes and failed state_hash.
        settle_s=20.0,
    ),
    # The GNOME look-alike without the Shell (metacity and two tint2 panels drawn as Ubuntu's top
    # bar and dock): lighter, and what to fall back to where the Shell cannot run.
    "osworld-panels": Session(
        "osworld-panels",
        env=_GNOME_ENV,
        programs=(
            _A11Y_BUS,
            ("metacity", ("metacity", "--replace")),
            ("wallpaper", ("hsetroot", "-solid", "#2c001e")),
            ("top-bar", ("tint2", "-c", f"{FILES}/osworld-top.tint2rc")),
            ("dock", ("tint2", "-c", f"{FILES}/osworld-dock.tint2rc")),
        ),
        xterm=False,
    ),
}


def read_session(path: str = SESSION_FILE) -> Session:
    """The session the image names, or the default one when it names none. An unknown name
    falls back to the default too: a desktop that boots beats a slot that never gets ready."""
    try:
        name = Path(path).read_text().strip()
    except OSError:
        name = ""
    return SESSIONS.get(name or DEFAULT, SESSIONS[DEFAULT])


def apply_env(env: dict[str, str], session: Session) -> dict[str, str]:
    """`env` with the session's variables set (and those it maps to None removed)."""
    out = dict(env)
    for key, value in session.env.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out
