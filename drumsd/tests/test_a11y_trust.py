"""The trusted accessibility reader (guest/a11y.py --trusted, issue 36): which processes it reads
the tree from, judged on real processes and files of this host; and the daemon's command for a
task's getter (tasks/accessibility.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from drumsd.guest import a11y
from drumsd.tasks import accessibility

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root-owned files of its own")


@pytest.fixture
def sleeper() -> Iterator[int]:
    """A process running an image binary (root's /usr/bin/sleep)."""
    proc = subprocess.Popen([shutil.which("sleep") or "/bin/sleep", "30"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def test_a_root_owned_file_in_root_owned_dirs_is_trusted(tmp_path: Path) -> None:
    assert a11y.file_doubt("/usr/bin/env") is None
    mine = tmp_path / "libfake.so"
    mine.write_bytes(b"x")
    tmp_path.chmod(0o755)
    os.chown(mine, 1000, 1000)  # what the desktop user writes
    assert "owned by uid 1000" in (a11y.file_doubt(str(mine)) or "")
    os.chown(mine, 0, 0)
    mine.chmod(0o666)
    assert "mode 666" in (a11y.file_doubt(str(mine)) or "")
    mine.chmod(0o644)
    os.chown(tmp_path, 1000, 1000)  # a root file in the user's directory can be swapped
    assert "its directory" in (a11y.file_doubt(str(mine)) or "")


def test_a_script_app_is_not_an_image_binary(sleeper: int) -> None:
    assert a11y.process_doubt(sleeper) is None
    assert "interpreter" in (a11y.process_doubt(os.getpid()) or "")  # python: any script's app
    assert "not one of the task's apps" in (
        a11y.process_doubt(sleeper, frozenset({"soffice.bin"})) or ""
    )
    assert a11y.process_doubt(sleeper, frozenset({"sleep"})) is None
    assert "cannot read" in (a11y.process_doubt(2**22 + 7) or "")


def test_a_preloaded_library_of_the_user_is_seen(tmp_path: Path) -> None:
    lib = tmp_path / "libpreload.so"
    shutil.copy(next(Path("/lib/x86_64-linux-gnu").glob("libz.so.1*")), lib)
    os.chown(lib, 1000, 1000)
    tmp_path.chmod(0o755)
    sleep = shutil.which("sleep") or "/bin/sleep"
    proc = subprocess.Popen([sleep, "30"], env={"LD_PRELOAD": str(lib)})
    try:
        deadline = 50
        while deadline and str(lib) not in Path(f"/proc/{proc.pid}/maps").read_text():
            subprocess.run([sleep, "0.05"], check=True)
            deadline -= 1
        doubt = a11y.process_doubt(proc.pid) or ""
    finally:
        proc.kill()
        proc.wait()
    assert f"runs code from {lib}" in doubt and "uid 1000" in doubt, doubt


class _App:
    """An accessible of a fake bus: `pid` its process, `bus` its connection."""

    def __init__(self, name: str, pid: int, bus: str, children: list[Any] | None = None) -> None:
        self.name, self.pid, self.children = name, pid, children or []
        self.app = type("A", (), {"bus_name": bus})()

    def get_name(self) -> str:
        return self.name

    def get_role_name(self) -> str:
        return "application" if self.name.startswith("app") else "label"

    def get_process_id(self) -> int:
        return self.pid

    def get_child_count(self) -> int:
        return len(self.children)

    def get_child_at_index(self, i: int) -> Any:
        return self.children[i]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("get_"):
            return lambda *a: None
        raise AttributeError(name)


class _Atspi:
    def __init__(self, desktop: _App) -> None:
        self.desktop = desktop

    def set_timeout(self, *_: int) -> None:
        pass

    def get_desktop(self, _i: int) -> _App:
        return self.desktop


def test_the_trusted_tree_leaves_out_script_apps_and_their_objects(sleeper: int) -> None:
    own = os.getpid()  # python: a script's app
    honest = _App("app-honest", sleeper, ":1.2", [_App("ok", sleeper, ":1.2")])
    # An honest app's child served by another connection (a plug) of a script: left out too.
    honest.children.append(_App("planted", own, ":1.9"))
    fake = _App("app-fake", own, ":1.9", [_App("Slides View", own, ":1.9")])
    desktop = _App("desktop", sleeper, ":1.0", [honest, fake])
    everything = ET.fromstring(a11y.desktop_xml(_Atspi(desktop)))
    assert [a.get("name") for a in everything] == ["app-honest", "app-fake"]
    trust = a11y.Trust(frozenset())
    root = ET.fromstring(a11y.desktop_xml(_Atspi(desktop), trust))
    assert [a.get("name") for a in root] == ["app-honest"]
    assert [c.get("name") for c in root[0]] == ["ok"]
    assert "interpreter" in trust.left_out[own]


def test_a_registry_of_the_users_own_is_refused(sleeper: int) -> None:
    desktop = _App("desktop", os.getpid(), ":1.0", [_App("app-honest", sleeper, ":1.2")])
    with pytest.raises(ValueError, match=r"the accessibility registry: .* interpreter"):
        a11y.desktop_xml(_Atspi(desktop), a11y.Trust(frozenset()))


def test_arguments() -> None:
    assert a11y.parse_args([]) is None
    trust = a11y.parse_args(["--trusted", "--app", "soffice.bin"])
    assert trust is not None and trust.names == {"soffice.bin"}
    with pytest.raises(SystemExit, match="usage"):
        a11y.parse_args(["--app"])


def test_the_getter_reads_the_tasks_apps_only() -> None:
    argv = accessibility.getter_argv(["libreoffice_impress"])
    assert argv == [*accessibility.ARGV, "--trusted", "--app", "soffice.bin"]
    assert accessibility.getter_argv(["thunderbird", "chrome"])[-6:] == [
        "--app", "thunderbird", "--app", "chromium", "--app", "chrome"
    ]  # fmt: skip
    # `os` (the desktop itself) or no app listed: any image binary.
    assert accessibility.getter_argv(["thunderbird", "os"]) == [*accessibility.ARGV, "--trusted"]
    assert accessibility.getter_argv([]) == [*accessibility.ARGV, "--trusted"]
    untrusted = accessibility.parse(5, "", "drums-a11y: untrusted: the accessibility bus (fd 3)")
    assert untrusted.xml is None and "not the desktop's own" in (untrusted.reason or "")


def test_the_reader_runs_as_a_script_of_the_image() -> None:
    """a11y.py's --trusted mode imports only the stdlib at the top (the guest runs it with the
    image's python3 -I); it must run bare, without gi, and say so."""
    done = subprocess.run(
        [sys.executable, "-I", a11y.__file__, "--trusted"], capture_output=True, text=True
    )
    assert done.returncode in (3, 4), done.stderr


def test_a_bus_of_the_users_own_is_refused(sleeper: int) -> None:
    """The reader's connection to the bus is checked before any application is touched: a
    script serving the bus (here this process, on the other end of a socket pair) could say
    any application runs any binary."""
    import socket

    desktop = _App("desktop", sleeper, ":1.0", [_App("app-honest", sleeper, ":1.2")])
    ours, theirs = socket.socketpair()
    try:
        with pytest.raises(ValueError, match=r"the accessibility bus \(fd \d+\): .* interpreter"):
            a11y.desktop_xml(_Atspi(desktop), a11y.Trust(frozenset()))
    finally:
        ours.close()
        theirs.close()
    assert ET.fromstring(a11y.desktop_xml(_Atspi(desktop), a11y.Trust(frozenset())))[0] is not None
