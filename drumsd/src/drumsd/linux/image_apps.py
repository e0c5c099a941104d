"""Which desktop apps an image has: the app table, the manifest the image builder writes next to
an image (`apps.json`, beside `image.json`) by probing the built tree for each app's files, and
the slot features those apps give. What a task needs of them is `tasks/apps.py`'s.

Pure but for `probe_apps` (stats files under an image root) and the manifest's read and write.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drumsd.guest.session import DEFAULT as DEFAULT_SESSION
from drumsd.guest.session import SESSION_FILE as SESSION_PATH
from drumsd.guest.session import SESSIONS

MANIFEST_NAME = "apps.json"
MANIFEST_VERSION = 1

BIN_DIRS = ("usr/local/bin", "usr/bin", "bin", "usr/games")
SCHEMA_DIR = "usr/share/glib-2.0/schemas"


@dataclass(frozen=True)
class App:
    """An app as a task names it, and the files that show an image has it (any one will do)."""

    name: str
    label: str
    files: tuple[str, ...] = ()  # paths under the image root
    commands: tuple[str, ...] = ()  # executables on PATH that belong to the app


# Keyed by drums' name; OSWorld's spellings map onto these through ALIASES.
APPS: dict[str, App] = {
    app.name: app
    for app in (
        App("chrome", "Chromium (as google-chrome)", commands=("google-chrome", "chromium")),
        App(
            "libreoffice_calc",
            "LibreOffice Calc",
            files=("usr/lib/libreoffice/program/libsclo.so",),
        ),
        App(
            "libreoffice_writer",
            "LibreOffice Writer",
            files=("usr/lib/libreoffice/program/libswlo.so",),
        ),
        App(
            "libreoffice_impress",
            "LibreOffice Impress",
            files=("usr/lib/libreoffice/program/libsdlo.so",),
        ),
        App(
            "libreoffice",
            "LibreOffice",
            files=("usr/lib/libreoffice/program/soffice.bin",),
        ),
        App("gimp", "GIMP", commands=("gimp",)),
        App("thunderbird", "Thunderbird", commands=("thunderbird",)),
        App("vlc", "VLC", commands=("vlc", "cvlc")),
        App("vscode", "VS Code", commands=("code",), files=("usr/share/code/code",)),
        App("nautilus", "Files (Nautilus)", commands=("nautilus",)),
        App("gnome_terminal", "GNOME Terminal", commands=("gnome-terminal",)),
        # What a task means by "terminal" or "files": any terminal emulator or file manager.
        App(
            "terminal",
            "a terminal emulator",
            commands=("gnome-terminal", "x-terminal-emulator", "xterm"),
        ),
        App("files", "a file manager", commands=("nautilus", "pcmanfm")),
        # OSWorld's "pdf" and "image" tasks make, sort or read such files; what they need is a
        # program the desktop opens them in (Ubuntu's Document Viewer and Image Viewer there; on
        # a Debian image without those, xdg-open hands PDFs to LibreOffice Draw and images to
        # GIMP, which is what the osworld image's mimeinfo.cache says).
        App(
            "pdf",
            "a program that opens PDF files",
            commands=("evince", "okular", "atril", "mupdf", "qpdfview"),
            files=("usr/lib/libreoffice/program/libpdfimportlo.so",),
        ),
        App("image", "an image viewer", commands=("eog", "ristretto", "gthumb", "gimp")),
        # Named by one task each; no image drums builds has them (and installing them needs the
        # network), so these tasks stay refused with the app named.
        App("picard", "MusicBrainz Picard", commands=("picard",)),
        App("totem", "GNOME Videos (Ubuntu's media player)", commands=("totem",)),
        # The settings store itself: gsettings over dconf (each schema is checked on its own).
        App(
            "gsettings",
            "gsettings with the dconf backend",
            commands=("gsettings",),
            files=("usr/lib/x86_64-linux-gnu/gio/modules/libdconfsettings.so",),
        ),
        App("dconf", "dconf", commands=("dconf",)),
        # Chromium's profile made at image build (the osworld image): a task whose setup writes
        # into it (Preferences, the History database) needs it there before Chromium first runs,
        # or Chromium starting on a bare profile rewrites what the setup wrote (93eabf48).
        App(
            "chrome_profile",
            "a Chromium profile made at image build",
            files=("home/user/.config/chromium/Default/Preferences",),
        ),
        # Sound: OSWorld's volume task reads the sink with PulseAudio's pactl. No drums image has
        # a sound server (a slot has no sound device), so such a task is refused with this named.
        App("sound", "a sound server with PulseAudio's pactl", commands=("pactl",)),
        # Programs a task's instruction names for its solution (tasks/solvable.py).
        App(
            "conda",
            "conda (Anaconda or Miniconda)",
            commands=("conda",),
            files=(
                "opt/conda/bin/conda",
                "home/user/anaconda3/bin/conda",
                "home/user/miniconda3/bin/conda",
            ),
        ),
        # AT-SPI's bus launcher and the bindings the guest's tree dump reads it with (an image
        # whose session starts the bus: the osworld profile).
        App(
            "accessibility",
            "the AT-SPI accessibility bus and its Python bindings",
            files=(
                "usr/libexec/at-spi-bus-launcher",
                "usr/lib/python3/dist-packages/pyatspi/__init__.py",
            ),
        ),
    )
}
# gsettings needs both its command and the dconf backend (without it, settings do not persist);
# the accessibility tree needs both the bus and the bindings.
ALL_FILES_NEEDED = frozenset({"gsettings", "accessibility"})
# Slot features (host_support.GETTERS_NEEDING) an image gives by having an app.
FEATURES = {"accessibility": "accessibility_tree"}
# The file naming the session an image's desktop runs (guest/session.py reads the same file).
SESSION_FILE = SESSION_PATH.lstrip("/")
# A manifest probed with another table than this one is stale (re-probed, never trusted); the
# last item names what else the probe records (the session), so older manifests are re-probed.
TABLE_KEY = hashlib.sha256(
    json.dumps(
        [[a.name, a.files, a.commands] for a in APPS.values()]
        + [sorted(ALL_FILES_NEEDED), "session"]
    ).encode()
).hexdigest()[:16]


@dataclass(frozen=True)
class AppManifest:
    """What one image has: apps (drums' names) and the GSettings schemas it ships."""

    profile: str
    apps: frozenset[str]
    schemas: frozenset[str] = frozenset()
    found: dict[str, str] = field(default_factory=dict)  # app -> the file that showed it
    session: str = DEFAULT_SESSION  # the desktop session its slots run (guest/session.py)

    @property
    def desktop_xterm(self) -> bool:
        """Whether the image's session starts the xterm the terminal-output getter reads."""
        return SESSIONS.get(self.session, SESSIONS[DEFAULT_SESSION]).xterm

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "table": TABLE_KEY,
            "profile": self.profile,
            "apps": sorted(self.apps),
            "missing": sorted(set(APPS) - self.apps),
            "found": dict(sorted(self.found.items())),
            "gsettings_schemas": sorted(self.schemas),
            "session": self.session,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AppManifest:
        if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
            raise ValueError(f"not an app manifest of version {MANIFEST_VERSION}")
        if data.get("table") != TABLE_KEY:
            raise ValueError("probed with another app table: stale")
        return cls(
            profile=str(data.get("profile", "")),
            apps=frozenset(map(str, data.get("apps", []))),
            schemas=frozenset(map(str, data.get("gsettings_schemas", []))),
            found={str(k): str(v) for k, v in dict(data.get("found", {})).items()},
            session=str(data.get("session") or DEFAULT_SESSION),
        )


# ---------------------------------------------------------------- the probe (stats files only)


def _exists(root: Path, rel: str) -> bool:
    # An absolute symlink inside the image points into the image, not the host.
    path = root / rel
    for _ in range(8):
        if not path.is_symlink():
            return path.exists()
        target = Path(path.readlink())
        path = root / str(target).lstrip("/") if target.is_absolute() else path.parent / target
    return False


def probe_apps(root: Path, profile: str = "") -> AppManifest:
    """Look in an image root for each app's files and the GSettings schemas it ships."""
    found: dict[str, str] = {}
    for app in APPS.values():
        commands = [f"{d}/{c}" for c in app.commands for d in BIN_DIRS]
        hit_cmd = next((rel for rel in commands if _exists(root, rel)), None)
        hit_file = next((rel for rel in app.files if _exists(root, rel)), None)
        if app.name in ALL_FILES_NEEDED:
            if (hit_cmd or not app.commands) and all(_exists(root, f) for f in app.files):
                found[app.name] = hit_cmd or app.files[0]
        elif hit_cmd or hit_file:
            found[app.name] = hit_cmd or hit_file or ""
    schema_dir = root / SCHEMA_DIR
    schemas: set[str] = set()
    if schema_dir.is_dir():
        for path in schema_dir.glob("*.gschema.xml"):
            schemas.update(_schema_ids(path))
    try:
        session = (root / SESSION_FILE).read_text().strip() or DEFAULT_SESSION
    except OSError:
        session = DEFAULT_SESSION
    return AppManifest(
        profile=profile,
        apps=frozenset(found),
        schemas=frozenset(schemas),
        found=found,
        session=session,
    )


def _schema_ids(path: Path) -> Iterator[str]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    yield from re.findall(r"<schema\b[^>]*\bid=\"([^\"]+)\"", text)


def features(manifest: AppManifest | None) -> frozenset[str]:
    """The slot features an image's apps give (no manifest: none known)."""
    if manifest is None:
        return frozenset()
    return frozenset(f for app, f in FEATURES.items() if app in manifest.apps)


def write_manifest(image_dir: Path, manifest: AppManifest) -> Path:
    out = image_dir / MANIFEST_NAME
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest.to_json(), indent=2) + "\n")
    tmp.replace(out)
    return out


def read_manifest(image_dir: Path) -> AppManifest | None:
    """The manifest the builder wrote next to the image's root; None when there is none or it
    was probed with another app table than this drumsd's."""
    try:
        return AppManifest.from_json(json.loads((image_dir / MANIFEST_NAME).read_text()))
    except (OSError, ValueError):
        return None


def manifest_for_root(root: Path, profile: str = "") -> AppManifest:
    """The manifest of an image root: the builder's when it wrote one, else a fresh probe (an
    image built before manifests existed, or a hand-made root)."""
    return read_manifest(root.parent) or probe_apps(root, profile or root.parent.name)
