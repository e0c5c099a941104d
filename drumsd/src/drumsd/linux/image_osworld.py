"""The `osworld` image profile: the closest Debian 12 gets to OSWorld's Ubuntu 22.04 GNOME VM.

Its package list, the files that make it look and behave like that desktop (GSettings defaults:
the Yaru theme, the dock's apps, accessibility on; the GTK config) and the setup run in
the chroot after them (compile the schemas). Which session a slot of it runs (a GNOME-like top bar
and dock over metacity, AT-SPI's buses) is the guest's `session` module's, chosen by the
`etc/drums/session` file written here, so changing the session rebuilds no package layer.
docs/image.md says what it has, what differs from OSWorld's Ubuntu and what CRIU cannot dump.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from drumsd.linux import libreoffice_registry

if TYPE_CHECKING:
    from drumsd.linux.image_profiles import Profile

# Packages, by what they are for (the session's panels and bus configs are the guest's:
# guest/session_files). Everything comes from bookworm main: no Ubuntu font (non-free
# in Debian) and no VS Code (Microsoft's .deb needs the network; the app manifest records it
# absent).
DESKTOP = (
    # GNOME Shell and its dock extension: installed so it can be tried under CRIU (docs/image.md
    # records what happened); the default session is the checkpointable one below.
    "gnome-shell",
    "gnome-shell-extension-dashtodock",
    "libgl1-mesa-dri",  # llvmpipe: software GL for gnome-shell and GTK4 on Xvfb
    # The session slots run: metacity (GNOME's X11 window manager) with two tint2 panels drawn
    # as Ubuntu's top bar and left dock, gnome-settings-daemon's schemas for the settings tasks.
    "metacity",
    "tint2",
    "hsetroot",
    "gnome-settings-daemon",
    "gnome-settings-daemon-common",
    "gsettings-desktop-schemas",
    "gnome-control-center",
    "dconf-service",
    "nautilus",
    "gnome-terminal",
    "gedit",
    "yaru-theme-gtk",
    "yaru-theme-icon",
    "yaru-theme-gnome-shell",
    "adwaita-icon-theme",
    "fonts-cantarell",
    "fonts-noto-core",
    "fonts-noto-color-emoji",
    "xdg-utils",
    "bc",  # a settings task's checker pipes into bc
    # Accessibility: the AT-SPI buses and the reader the guest's a11y dump uses.
    "at-spi2-core",
    "python3-pyatspi",
    "gir1.2-atspi-2.0",
)
APPS = (
    "libreoffice-calc",
    "libreoffice-writer",
    "libreoffice-impress",
    "libreoffice-gtk3",  # the GTK VCL: Yaru look and an AT-SPI tree (the x11 VCL has neither)
    "fonts-liberation2",
    "chromium",
    "gimp",
    "thunderbird",
    "vlc",
)

# GSettings defaults of OSWorld's Ubuntu that Debian's schemas do not have. toolkit-accessibility
# makes the AT-SPI bus report itself enabled, which Chromium and LibreOffice wait for.
SCHEMA_OVERRIDE = """\
[org.gnome.desktop.interface]
gtk-theme='Yaru'
icon-theme='Yaru'
cursor-theme='Yaru'
font-name='Cantarell 11'
document-font-name='Cantarell 11'
monospace-font-name='DejaVu Sans Mono 11'
toolkit-accessibility=true
enable-hot-corners=false

[org.gnome.desktop.wm.preferences]
button-layout=':minimize,maximize,close'
theme='Yaru'

[org.gnome.desktop.background]
picture-options='none'
primary-color='#2c001e'
color-shading-type='solid'

[org.gnome.shell]
favorite-apps=['chromium.desktop', 'thunderbird.desktop', 'vlc.desktop', \
'libreoffice-writer.desktop', 'libreoffice-calc.desktop', 'libreoffice-impress.desktop', \
'gimp.desktop', 'org.gnome.Nautilus.desktop', 'org.gnome.Terminal.desktop']
enabled-extensions=['dash-to-dock@micxgx.gmail.com']

[org.gnome.metacity.theme]
type='gtk'
"""

# GTK reads these when no settings daemon publishes XSETTINGS (the checkpointable session runs
# none: gsd-xsettings needs gnome-session).
GTK3_SETTINGS = """\
[Settings]
gtk-theme-name=Yaru
gtk-icon-theme-name=Yaru
gtk-cursor-theme-name=Yaru
gtk-font-name=Cantarell 11
gtk-application-prefer-dark-theme=0
"""

# LibreOffice's icons drawn from colibre's SVG set. With the PNG set (LibreOffice's default when
# it finds no theme of the desktop's), the GTK3 VCL drew some toolbar items blank for good: in
# Impress the Basic, Symbol, Arrow, Flowchart, Callout and Star Shapes, Display Views and Media
# (each enabled, each icon in the set; pixel-identical 30 s later, so not a late load). The X11
# VCL and the SVG set draw them all (docs/osworld.md, "The first screenshot").
LIBREOFFICE_ICONS = libreoffice_registry.xcd(
    """\
<oor:component-data oor:name="Common" oor:package="org.openoffice.Office">
 <node oor:name="Misc">
  <prop oor:name="SymbolStyle" oor:op="fuse"><value>colibre_svg</value></prop>
 </node>
</oor:component-data>
"""
)

FILES: dict[str, tuple[int, str]] = {
    "etc/drums/session": (0o644, "osworld\n"),
    "usr/share/glib-2.0/schemas/90_drums-osworld.gschema.override": (0o644, SCHEMA_OVERRIDE),
    "etc/gtk-3.0/settings.ini": (0o644, GTK3_SETTINGS),
    "etc/libreoffice/registry/drums-osworld.xcd": (0o644, LIBREOFFICE_ICONS),
}

# Run in the chroot after FILES: the override above only counts once compiled; OSWorld's tasks
# open a terminal with x-terminal-emulator or gnome-terminal alike; and what package scripts left
# in /run/systemd (seats, sessions) would tell GNOME that logind runs, which no slot has.
# And Chromium's profile made once, headless, as the desktop user: OSWorld's
# update_browse_history writes into the profile's History database (OSWorld fetches an empty one
# from Google Drive; a slot has no network). Its caches go, the databases and Preferences stay.
CHROMIUM_PROFILE = "/home/user/.config/chromium"
GIMP_CONFIG = "/home/user/.config/GIMP/2.10"
VLCRC = "/home/user/.config/vlc/vlcrc"
SETUP = (
    "glib-compile-schemas /usr/share/glib-2.0/schemas; "
    "update-alternatives --set x-terminal-emulator /usr/bin/gnome-terminal.wrapper; "
    "rm -rf /run/systemd; "
    "runuser -u user -- env HOME=/home/user timeout 120 chromium --headless=new --no-sandbox "
    "--disable-gpu --no-first-run --disable-background-networking --disable-component-update "
    f"--user-data-dir={CHROMIUM_PROFILE} --dump-dom about:blank >/dev/null 2>&1 || true; "
    f"test -s {CHROMIUM_PROFILE}/Default/History || "
    "{ echo 'chromium left no History in its profile' >&2; exit 1; }; "
    f"cd {CHROMIUM_PROFILE} && rm -rf Default/Cache 'Default/Code Cache' Default/GPUCache "
    "Default/DawnGraphiteCache Default/DawnWebGPUCache GPUPersistentCache GrShaderCache "
    "GraphiteDawnCache ShaderCache component_crx_cache Crashpad 'Crash Reports'; cd /; "
    # GIMP run once, headless, as the desktop user (OSWorld's VM had run it before): its first
    # start queries each of its ~120 plug-ins, seconds of helpers starting and exiting, and a
    # task whose setup launches GIMP was captured mid-query; its repeat episodes restored a
    # plug-in that then exited (alive_after_resume failed on unit-editor, warp). With pluginrc
    # written here GIMP starts straight to its window. Its darktable and RawTherapee loaders go
    # first: without those programs (not in the image) they register nothing, so GIMP queried
    # them again at every start, and repeats still restored one mid-query (file-darktable,
    # file-rawtherape exited, and a `gimp`, likely a fork about to run one). RAW files meet GIMP's
    # placeholder loader as on a machine without either program.
    "rm -rf /usr/lib/gimp/2.0/plug-ins/file-darktable /usr/lib/gimp/2.0/plug-ins/file-rawtherapee; "
    "runuser -u user -- env HOME=/home/user timeout 300 gimp -i -b '(gimp-quit 0)' "
    ">/dev/null 2>&1 || true; "
    f"test -s {GIMP_CONFIG}/pluginrc || "
    "{ echo 'gimp left no pluginrc in its config dir' >&2; exit 1; }; "
    # VLC's settings file as a first run leaves it, with its privacy and network dialog answered
    # (OSWorld's VM had run VLC): without it, VLC opens on that dialog in every task. The file
    # is the one VLC's --save-config writes (every setting, those at their default commented
    # out, as vlc_config reads it on OSWorld) with the dialog's key set; a [qt] section with the
    # key alone if VLC wrote none.
    "runuser -u user -- env HOME=/home/user timeout 60 vlc -I dummy --no-qt-privacy-ask "
    "--save-config vlc://quit >/dev/null 2>&1 || true; "
    f"if grep -q '^#*qt-privacy-ask=' {VLCRC} 2>/dev/null; then "
    f"runuser -u user -- sed -i 's/^#*qt-privacy-ask=.*/qt-privacy-ask=0/' {VLCRC}; "
    f"else runuser -u user -- sh -c 'mkdir -p {VLCRC.rsplit('/', 1)[0]} && "
    f'printf "[qt]\\nqt-privacy-ask=0\\n" >> {VLCRC}\'; fi; '
    f"grep -qx 'qt-privacy-ask=0' {VLCRC} || "
    "{ echo 'vlcrc does not turn off the privacy dialog' >&2; exit 1; }"
)

# Helpers of this desktop that exit on their own some seconds after a restore (image_profiles.
# Profile.natural_exits; comm names, 15 characters). Each was seen exiting normally in repeat
# episodes of the OSWorld sweep (docs/tasks-osworld.md):
NATURAL_EXITS = (
    # Tracker's metadata extractor (tracker-extract-3): D-Bus activated by the file miner when a
    # setup writes files (4783cc41's mkdir on the Desktop), it quits once idle.
    "tracker-extract",
)
# Caches the desktop rewrites in place after a restore, through a shared memory map, so on the
# slot's tmpfs upper neither the file's mtime nor its ctime moves and the state_hash gate cannot
# tell the write from a copy that differs (image_profiles.Profile.caches):
CACHES = (
    # Mesa's shader cache: gnome-shell on llvmpipe compiles the shaders of what it draws and
    # records each in the mmapped `index`. Compiled shaders keyed by their source's hash, checked
    # by Mesa on read, and never read by a task or checker: deleting it only costs compile time.
    "home/user/.cache/mesa_shader_cache",
    "home/user/.cache/mesa_shader_cache/*",
)

# Run after every restore (image_profiles.Profile.after_restore): the top bar's clock current at
# once. GNOME Shell's clock (gnome-desktop's GnomeWallClock) waits for its next minute on a
# CLOCK_REALTIME timerfd armed at an absolute time, which CRIU re-arms relative to the restore
# (the time left at the dump, from the restore on), so a restored Shell showed the template's
# minute for up to a minute. The clock also updates, and re-arms on the minute, on any `changed`
# of its org.gnome.desktop.interface settings, which dconf's clients hear as this session-bus
# signal of dconf's writer. Emitting it writes nothing (no dconf database, no state_hash change).
# The change list [''] names the prefix key itself; dconf drops a Notify with an empty list.
CLOCK_NOTIFY = (
    "gdbus",
    "emit",
    "--session",
    "--object-path",
    "/ca/desrt/dconf/Writer/user",
    "--signal",
    "ca.desrt.dconf.Writer.Notify",
    "'/org/gnome/desktop/interface/clock-format'",
    "['']",
    "'drums'",
)


def profile(office: Profile) -> Profile:
    """The osworld profile: office's base, pip packages and files (the google-chrome wrapper,
    LibreOffice and Chromium defaults) plus the GNOME desktop and the apps above."""
    packages = [p for p in office.packages if p not in DROPPED_FROM_OFFICE]
    return dataclasses.replace(
        office,
        name="osworld",
        packages=(*packages, *DESKTOP, *APPS),
        pip=office.pip,
        files={**office.files, **FILES},
        setup=SETUP,
        natural_exits=NATURAL_EXITS,
        caches=CACHES,
        after_restore=CLOCK_NOTIFY,
    )


# office's lightweight stand-ins that GNOME's own apps replace here.
DROPPED_FROM_OFFICE = frozenset({"openbox", "pcmanfm", "mousepad"})
