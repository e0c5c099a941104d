"""The `osworld` image profile: the closest Debian 12 gets to OSWorld's Ubuntu 22.04 GNOME VM.

Its package list, the files that make it look and behave like that desktop (GSettings defaults:
the Yaru theme, the dock's apps, accessibility on; the GTK and panel configs) and the setup run in
the chroot after them (compile the schemas). Which session a slot of it runs (a GNOME-like top bar
and dock over metacity, AT-SPI's buses) is the guest's `session` module's, chosen by the
`etc/drums/session` file written here, so changing the session rebuilds no package layer.
docs/image.md says what it has, what differs from OSWorld's Ubuntu and what CRIU cannot dump.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drumsd.linux.image import Profile

# Packages, by what they are for. Everything comes from bookworm main: no Ubuntu font (non-free
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

# Ubuntu 22.04's top bar: "Activities" on the left, the clock in the middle, on black.
TINT2_TOP = """\
# drums osworld image: the top bar
rounded = 0
border_width = 0
background_color = #000000 100
border_color = #000000 0
rounded = 4
border_width = 0
background_color = #ffffff 18
border_color = #000000 0
panel_items = PFCF
panel_size = 100% 32
panel_margin = 0 0
panel_padding = 8 0 8
panel_background_id = 1
panel_position = top center horizontal
panel_layer = top
panel_dock = 0
strut_policy = follow_size
wm_menu = 0
font_shadow = 0
button = new
button_text = Activities
button_font = Cantarell Bold 11
button_font_color = #ffffff 100
button_padding = 10 4
button_background_id = 0
button_lclick_command = xdotool key super
time1_format = %b %-d  %H:%M
time1_font = Cantarell Bold 11
clock_font_color = #ffffff 100
clock_padding = 8 4
clock_background_id = 0
"""

# Ubuntu's dock: the favourites and running apps, down the left edge.
TINT2_DOCK = """\
# drums osworld image: the dock
rounded = 0
border_width = 0
background_color = #1d1d1d 92
border_color = #000000 0
rounded = 6
border_width = 0
background_color = #ffffff 22
border_color = #000000 0
panel_items = LT
panel_size = 100% 64
panel_margin = 0 0
panel_padding = 6 8 6
panel_background_id = 1
panel_position = center left vertical
panel_layer = top
panel_dock = 0
strut_policy = follow_size
wm_menu = 0
launcher_padding = 0 4 4
launcher_background_id = 0
launcher_icon_size = 48
launcher_icon_theme = Yaru
launcher_item_app = /usr/share/applications/chromium.desktop
launcher_item_app = /usr/share/applications/thunderbird.desktop
launcher_item_app = /usr/share/applications/vlc.desktop
launcher_item_app = /usr/share/applications/libreoffice-writer.desktop
launcher_item_app = /usr/share/applications/libreoffice-calc.desktop
launcher_item_app = /usr/share/applications/libreoffice-impress.desktop
launcher_item_app = /usr/share/applications/gimp.desktop
launcher_item_app = /usr/share/applications/org.gnome.Nautilus.desktop
launcher_item_app = /usr/share/applications/org.gnome.Terminal.desktop
taskbar_mode = single_desktop
taskbar_padding = 0 4 4
taskbar_background_id = 0
task_text = 0
task_icon = 1
task_centered = 1
task_maximum_size = 56 56
task_padding = 4 4 4
task_background_id = 0
task_active_background_id = 2
mouse_left = toggle_iconify
"""

FILES: dict[str, tuple[int, str]] = {
    "etc/drums/session": (0o644, "osworld\n"),
    "usr/share/glib-2.0/schemas/90_drums-osworld.gschema.override": (0o644, SCHEMA_OVERRIDE),
    "etc/gtk-3.0/settings.ini": (0o644, GTK3_SETTINGS),
    "etc/xdg/tint2/drums-top.tint2rc": (0o644, TINT2_TOP),
    "etc/xdg/tint2/drums-dock.tint2rc": (0o644, TINT2_DOCK),
}

# Run in the chroot after FILES: the override above only counts once compiled, and OSWorld's
# tasks open a terminal with x-terminal-emulator or gnome-terminal alike.
SETUP = (
    "glib-compile-schemas /usr/share/glib-2.0/schemas; "
    "update-alternatives --set x-terminal-emulator /usr/bin/gnome-terminal.wrapper"
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
    )


# office's lightweight stand-ins that GNOME's own apps replace here.
DROPPED_FROM_OFFICE = frozenset({"openbox", "pcmanfm", "mousepad"})
