"""Which desktop apps an image has, and which ones a task needs (issue 19).

The image builder writes an app manifest (`apps.json`, next to `image.json`) by probing the built
tree for each app's files; the support check compares a task's `related_apps`, the programs its
setup, postconfig and command getters run, and the GNOME settings schemas it reads or writes with
those the image has. A task that needs what the image lacks is unsupported, with the app named,
instead of failing half-way through setup (or scoring 0 for ever, as a settings task does when
`gsettings get` has no schema to read).

Pure but for `probe_apps`, which only stats files under an image root.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .model import Task

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
# A manifest probed with another table than this one is stale (re-probed, never trusted).
TABLE_KEY = hashlib.sha256(
    json.dumps(
        [[a.name, a.files, a.commands] for a in APPS.values()] + [sorted(ALL_FILES_NEEDED)]
    ).encode()
).hexdigest()[:16]

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
}
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


@dataclass(frozen=True)
class AppManifest:
    """What one image has: apps (drums' names) and the GSettings schemas it ships."""

    profile: str
    apps: frozenset[str]
    schemas: frozenset[str] = frozenset()
    found: dict[str, str] = field(default_factory=dict)  # app -> the file that showed it

    def to_json(self) -> dict[str, Any]:
        return {
            "version": MANIFEST_VERSION,
            "table": TABLE_KEY,
            "profile": self.profile,
            "apps": sorted(self.apps),
            "missing": sorted(set(APPS) - self.apps),
            "found": dict(sorted(self.found.items())),
            "gsettings_schemas": sorted(self.schemas),
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
    schemas = set()
    if schema_dir.is_dir():
        for path in schema_dir.glob("*.gschema.xml"):
            schemas.update(_schema_ids(path))
    return AppManifest(
        profile=profile, apps=frozenset(found), schemas=frozenset(schemas), found=found
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


def task_needs(task: Task) -> list[Need]:
    """The apps a task needs, each with why (its related_apps, or a program it runs)."""
    needs: dict[str, Need] = {}
    for related in task.related_apps:
        name = app_name(related)
        if name not in ALWAYS_PRESENT:
            needs.setdefault(name, Need(name, f"related_apps lists {related!r}"))
    for step in [*task.config, *task.evaluator.postconfig]:
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
