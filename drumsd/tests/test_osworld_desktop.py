"""The osworld image's pieces that need no slot: its profile, the session desktop-init starts
from it, the accessibility dump's XML and its parsing, and the apps probe that turns an image with
AT-SPI into the `accessibility_tree` slot feature (issues 19 and 21; live:
tests/live/test_osworld_image_live.py)."""

from __future__ import annotations

import dataclasses
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from drumsd.guest import a11y, session
from drumsd.linux import image, image_osworld
from drumsd.linux.image_apps import features, probe_apps
from drumsd.tasks import accessibility


def test_the_osworld_profile_has_osworlds_apps_on_the_office_base() -> None:
    prof = image.PROFILES["osworld"]
    office = image.PROFILES["office"]
    for pkg in (
        "gnome-terminal",
        "nautilus",
        "yaru-theme-gtk",
        "yaru-theme-icon",
        "thunderbird",
        "vlc",
        "gimp",
        "chromium",
        "libreoffice-calc",
        "at-spi2-core",
        "python3-pyatspi",
        "gsettings-desktop-schemas",
        "gnome-settings-daemon-common",
        "dconf-service",
        "bc",
    ):
        assert pkg in prof.packages, pkg  # fmt: skip
    assert "code" not in prof.packages  # VS Code needs the network: recorded absent
    assert not {"openbox", "pcmanfm"} & set(prof.packages)
    # office's files (the google-chrome wrapper, app defaults) come along, and its pip packages.
    assert set(office.files) <= set(prof.files) and prof.pip == office.pip
    assert prof.files["etc/drums/session"][1].strip() in session.SESSIONS
    assert "glib-compile-schemas" in prof.setup


def test_a_setup_script_changes_the_layer_key_only_when_a_profile_has_one() -> None:
    office = image.PROFILES["office"]
    assert image.layer_key(dataclasses.replace(office, setup="")) == image.layer_key(office)
    assert image.layer_key(dataclasses.replace(office, setup="true")) != image.layer_key(office)
    osworld = image.PROFILES["osworld"]
    assert image.layer_key(dataclasses.replace(osworld, setup="")) != image.layer_key(osworld)


def test_the_session_follows_the_image_file(tmp_path: Path) -> None:
    marker = tmp_path / "session"
    default = session.read_session(str(tmp_path / "absent"))
    assert default.name == "openbox" and default.xterm
    assert session.apply_env({"A": "1"}, default) == {"A": "1", "NO_AT_BRIDGE": "1"}
    marker.write_text("osworld\n")
    osw = session.read_session(str(marker))
    assert osw.name == "osworld" and not osw.xterm
    names = [name for name, _ in osw.programs]
    # The buses before the Shell: it connects to both as it starts.
    assert names == ["system-bus", "at-spi-bus", "gnome-shell"]
    assert osw.env["DBUS_SYSTEM_BUS_ADDRESS"] == f"unix:path={session.SYSTEM_BUS}"
    panels = session.SESSIONS["osworld-panels"]
    assert [n for n, _ in panels.programs][:2] == ["at-spi-bus", "metacity"]
    for _, argv in (*osw.programs, *panels.programs):  # every config file named is shipped
        for arg in " ".join(argv).replace("=", " ").split():
            if arg.startswith(session.FILES):
                rel = arg.removeprefix(session.FILES + "/").rstrip(";")
                assert (Path(session.__file__).parent / "session_files" / rel).is_file(), arg
    env = session.apply_env({"NO_AT_BRIDGE": "1", "HOME": "/home/user"}, osw)
    assert "NO_AT_BRIDGE" not in env and env["XDG_CURRENT_DESKTOP"] == "GNOME"
    marker.write_text("no-such-session\n")
    assert session.read_session(str(marker)).name == "openbox"


# ------------------------------------------------------------------ the dump, on a fake AT-SPI


class _Enum:
    def __init__(self, value_name: str) -> None:
        self.value_name = value_name


class _FakeAtspi:
    """The part of gi's Atspi the walker uses."""

    class CoordType:
        SCREEN = "screen"

    names = {1: "ATSPI_STATE_VISIBLE", 2: "ATSPI_STATE_SHOWING", 3: "ATSPI_STATE_MULTI_LINE"}

    def __init__(self, desktop: Any) -> None:
        self.desktop = desktop
        self.timeout: tuple[int, int] | None = None

    def StateType(self, value: int) -> _Enum:  # gi spells it so
        return _Enum(self.names[value])

    def set_timeout(self, call_ms: int, startup_ms: int) -> None:
        self.timeout = (call_ms, startup_ms)

    def get_desktop(self, index: int) -> Any:
        return self.desktop


@dataclasses.dataclass
class _Box:
    x: int
    y: int
    width: int
    height: int


@dataclasses.dataclass
class _Node:
    name: str
    role: str
    states: list[int] = dataclasses.field(default_factory=list)
    children: list[Any] = dataclasses.field(default_factory=list)
    text: str | None = None
    box: _Box | None = None
    fail: bool = False

    def get_name(self) -> str:
        if self.fail:
            raise RuntimeError("the application does not answer")
        return self.name

    def get_role_name(self) -> str:
        return self.role

    def get_state_set(self) -> Any:
        return type("S", (), {"get_states": lambda _s: self.states})()

    def get_attributes(self) -> dict[str, str]:
        return {"toolkit": "gtk", "odd key": "x"}

    def get_component_iface(self) -> Any:
        box = self.box
        return None if box is None else type("C", (), {"get_extents": lambda _s, _c: box})()

    def get_text_iface(self) -> Any:
        text = self.text
        if text is None:
            return None
        return type("T", (), {"get_character_count": lambda _s: len(text),
                              "get_text": lambda _s, a, b: text[a:b]})()  # fmt: skip

    def get_value_iface(self) -> None:
        return None

    def get_action_iface(self) -> None:
        return None

    def get_child_count(self) -> int:
        return len(self.children)

    def get_child_at_index(self, i: int) -> Any:
        return self.children[i]


def test_the_shell_starts_with_its_lock_warning_already_shown(tmp_path: Path) -> None:
    # Without GDM, GNOME Shell shows a "Screen Lock disabled" banner once, unless
    # ~/.local/share/gnome-shell/lock-warning-shown exists; the template was captured with the
    # banner up (issue 32). The session's start command, run with stand-ins for dconf and the
    # Shell, leaves the file before the Shell starts.
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name in ("dconf", "gnome-shell"):
        (stubs / name).write_text("#!/bin/sh\nexit 0\n")
        (stubs / name).chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    (argv,) = [argv for name, argv in session.SESSIONS["osworld"].programs if name == "gnome-shell"]
    command = argv[-1].replace(session.FILES, str(Path(session.__file__).parent / "session_files"))
    env = {"HOME": str(home), "PATH": f"{stubs}:/usr/bin:/bin"}
    subprocess.run([*argv[:-1], command], env=env, check=True, timeout=30)
    assert (home / ".local/share/gnome-shell/lock-warning-shown").is_file()


def test_vlc_starts_without_its_privacy_dialog(tmp_path: Path) -> None:
    # The image's setup leaves ~/.config/vlc/vlcrc answering VLC's first-run privacy and network
    # dialog (issue 32: every VLC task opened on it). Run here on a stand-in vlcrc as VLC's
    # --save-config leaves it, and on none (VLC not run), with runuser and vlc stubbed.
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "runuser").write_text('#!/bin/sh\nshift 3\nexec "$@"\n')  # runuser -u user -- ...
    (stubs / "vlc").write_text("#!/bin/sh\nexit 0\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    vlcrc = tmp_path / "vlc" / "vlcrc"
    part = image_osworld.SETUP[
        image_osworld.SETUP.index("runuser -u user -- env HOME=/home/user timeout 60 vlc") :
    ]
    script = part.replace(image_osworld.VLCRC.rsplit("/", 1)[0], str(vlcrc.parent))
    env = {"PATH": f"{stubs}:/usr/bin:/bin"}
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=30)
    assert vlcrc.read_text() == "[qt]\nqt-privacy-ask=0\n"
    vlcrc.write_text(
        "[qt]\n# Show privacy dialog (boolean)\n#qt-privacy-ask=1\n#qt-updates-notif=1\n"
    )
    subprocess.run(["sh", "-c", script], env=env, check=True, timeout=30)
    lines = vlcrc.read_text().splitlines()
    assert "qt-privacy-ask=0" in lines and "#qt-privacy-ask=1" not in lines
    assert "#qt-updates-notif=1" in lines


def test_the_dump_writes_osworlds_xml() -> None:
    button = _Node("OK", "push button", [1, 2], box=_Box(10, 20, 80, 30))
    entry = _Node("bad\x07name", "text", [1, 3], text="hello\ufffc world\x1b[0m\x00")
    hung = _Node("", "frame", fail=True)
    app = _Node("gedit", "application", [1], [_Node("Doc", "frame", [1, 2], [button, entry]), hung])
    fake = _FakeAtspi(_Node("main", "desktop frame", children=[app]))
    xml = a11y.desktop_xml(fake)
    root = ET.fromstring(xml)
    assert root.tag == "desktop-frame" and fake.timeout is not None
    (gedit,) = list(root)
    assert gedit.tag == "application" and gedit.get("name") == "gedit"
    assert len(gedit) == 1  # the application that did not answer is left out, not waited on
    ok = gedit.find("frame/push-button")
    assert ok is not None and ok.get("name") == "OK"
    st, cp, attr = a11y.NS["st"], a11y.NS["cp"], a11y.NS["attr"]
    assert ok.get(f"{{{st}}}showing") == "true" and ok.get(f"{{{cp}}}screencoord") == "(10, 20)"
    assert ok.get(f"{{{cp}}}size") == "(80, 30)" and ok.get(f"{{{attr}}}toolkit") == "gtk"
    assert ok.get(f"{{{attr}}}odd_key") == "x"  # an attribute name XML can hold
    text = gedit.find("frame/text")
    # Control characters (a terminal's escape sequences, a NUL) cannot be in XML: dropped.
    assert text is not None and text.text == "hello world[0m" and text.get("name") == "badname"
    assert text.get(f"{{{st}}}multi_line") == "true" and text.get(f"{{{cp}}}size") is None
    assert 'xmlns:st="https://accessibility.ubuntu.example.org/ns/state"' in xml


def test_the_dump_cuts_wide_nodes_as_osworld_does() -> None:
    cells = [_Node(f"c{i}", "table cell") for i in range(a11y.MAX_WIDTH + 5)]
    fake = _FakeAtspi(
        _Node("main", "desktop frame", children=[_Node("t", "table", children=cells)])
    )
    root = ET.fromstring(a11y.desktop_xml(fake))
    assert len(root[0]) == a11y.MAX_WIDTH
    assert a11y.tag_of("") == "unknown" and a11y.tag_of("3d thing") == "_3d-thing"


def test_the_daemon_reads_the_dump_or_says_why_not() -> None:
    ok = accessibility.parse(0, "<desktop-frame />", "")
    assert ok.xml == "<desktop-frame />" and ok.reason is None
    no_bus = accessibility.parse(4, "", "drums-a11y: cannot reach the accessibility bus")
    assert no_bus.xml is None and "runs no AT-SPI" in (no_bus.reason or "")
    old_image = accessibility.parse(2, "", "python3: can't open file: No such file or directory")
    assert "has no accessibility dump" in (old_image.reason or "")
    crashed = accessibility.parse(1, "", "Traceback ... boom")
    assert crashed.xml is None and "boom" in (crashed.reason or "")


def test_an_image_with_the_bus_and_bindings_has_the_accessibility_feature(tmp_path: Path) -> None:
    root = tmp_path / "root"
    bus, bindings = image_osworld_files()
    (root / bus).parent.mkdir(parents=True)
    (root / bus).write_text("")
    assert "accessibility" not in probe_apps(root).apps  # the bus alone is not enough
    (root / bindings).parent.mkdir(parents=True)
    (root / bindings).write_text("")
    manifest = probe_apps(root)
    assert "accessibility" in manifest.apps
    assert features(manifest) == {"accessibility_tree"} and features(None) == frozenset()


def image_osworld_files() -> tuple[str, str]:
    from drumsd.linux.image_apps import APPS

    bus, bindings = APPS["accessibility"].files
    assert image_osworld.DESKTOP.count("at-spi2-core") == 1
    return bus, bindings
