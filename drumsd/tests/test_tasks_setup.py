"""Setup-step planning (pure) and execution through SlotAccess, on a directory-backed fake slot.

A unit test of the task bridge's layer: the live proof on restored desktops uses the runtime's
SlotAccess. Nothing here acts on the host's desktop: background launches are only recorded.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import pytest
import trio
from drumsd.tasks.model import Step, TaskContext, find_task, resolve_task
from drumsd.tasks.setup import SlotAccess, apply_operations, run_setup
from drumsd.tasks.setup_plan import (
    OpenFile,
    PutFile,
    RunTrusted,
    RunUser,
    SetupError,
    plan_steps,
    strip_sudo,
    translate_command,
)
from drumsd.tasks.testing import DirSlot

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "osworld"


def context(slot: DirSlot, tmp_path: Path, **kw: object) -> TaskContext:
    return TaskContext(
        user_home=str(slot.home),
        cache_dir=tmp_path / "cache",
        assets_dir=tmp_path / "assets",
        step_timeout_s=10,
        **kw,
    )


def make_task(steps: list[dict], task_id: str = "t1"):
    evaluator = {"func": "exact_match", "result": {"type": "rule", "rules": {}}}
    return resolve_task({"id": task_id, "config": steps, "evaluator": evaluator}, [])


def test_dir_slot_is_a_slot_access(tmp_path: Path) -> None:
    assert isinstance(DirSlot(tmp_path), SlotAccess)


def test_sudo_steps_become_trusted_without_the_password(tmp_path: Path) -> None:
    task = find_task("e0df059f-28a6-4169-924f-b9623e7184cc", [SHARED])
    ctx = TaskContext(user_home="/home/user", client_password="s3cret")
    ops = plan_steps(task.config, task, ctx)
    assert ops[0] == RunTrusted(shell="mkdir /home/user/Desktop/todo_list_Jan_1", timeout_s=60.0)
    assert isinstance(ops[1], RunUser) and "pyautogui.click(960, 540)" in ops[1].command[2]
    assert ops[1].command[0] == "python3"
    assert "s3cret" not in repr(ops)


@pytest.mark.parametrize(
    ("command", "root_part"),
    [
        ("echo password | sudo -S mkdir ~/x", "mkdir /h/x"),
        ("echo 'pw' | sudo -S -k apt-get install -y foo", "apt-get install -y foo"),
        ("cd /tmp && sudo rm -rf x", "cd /tmp && rm -rf x"),
        (["sudo", "-S", "touch", "/etc/x"], "touch /etc/x"),
        ("ls ~/sudoers-notes", None),
        (["ls"], None),
    ],
)
def test_strip_sudo(command: str | list[str], root_part: str | None) -> None:
    assert strip_sudo(command, TaskContext(user_home="/h")) == root_part


async def test_e0df059f_setup_runs_on_the_slot(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    task = find_task("e0df059f-28a6-4169-924f-b9623e7184cc", [SHARED])
    ctx = context(slot, tmp_path, client_password="s3cret")
    report = await run_setup(task, slot, ctx)
    assert (slot.home / "Desktop" / "todo_list_Jan_1").is_dir()
    assert slot.trusted_commands == [f"mkdir {slot.home}/Desktop/todo_list_Jan_1"]
    assert all("s3cret" not in str(c) for c in slot.user_commands + slot.trusted_commands)
    # pyautogui is not on this host: OSWorld also goes on after a failing user command.
    assert [r.kind for r in report.records] == ["RunTrusted", "RunUser"]
    assert report.records[1].rc != 0 and not report.records[1].ok and not report.ok


async def test_chrome_launch_maps_to_chromium(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    task = find_task("030eeff7-b492-4218-b312-701ec99ee0cc", [SHARED])
    await run_setup(task, slot, context(slot, tmp_path))
    assert len(slot.launched) == 2
    # The images' google-chrome wrapper runs Chromium maximized, without its first-run import
    # (Debian's bookmarks); a bare `chromium` opened half-width with them (issue 32).
    assert "google-chrome --remote-debugging-port=1337" in slot.launched[0]
    assert "chromium" not in slot.launched[0]
    post = plan_steps(task.evaluator.postconfig, task, context(slot, tmp_path))
    assert post[0] == RunUser(command=["pkill", "chromium"], timeout_s=10, background=True)


async def test_download_upload_and_drums_files_come_from_local_dirs(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    ctx = context(slot, tmp_path)
    (ctx.cache_dir / "t1").mkdir(parents=True)
    (ctx.cache_dir / "t1" / "Data.xlsx").write_bytes(b"cached")
    (ctx.assets_dir / "t1").mkdir(parents=True)
    (ctx.assets_dir / "t1" / "seed.txt").write_bytes(b"seed")
    url = "https://example.invalid/files/t1/Data.xlsx"
    task = make_task(
        [
            {"type": "download", "parameters": {"files": [{"url": url, "path": "~/Data.xlsx"}]}},
            {"type": "upload_file", "parameters": {"files": [
                {"local_path": "t1/seed.txt", "path": f"{slot.home}/up/seed.txt"}]}},
            {"type": "drums_files", "parameters": {"files": [
                {"src": "seed.txt", "path": "~/Desktop/seed.txt"}]}},
        ]
    )  # fmt: skip
    report = await run_setup(task, slot, ctx)
    assert (slot.home / "Data.xlsx").read_bytes() == b"cached"
    assert (slot.home / "up" / "seed.txt").read_bytes() == b"seed"
    assert (slot.home / "Desktop" / "seed.txt").read_bytes() == b"seed"
    assert report.seeded[f"{slot.home}/Desktop/seed.txt"] == hashlib.sha256(b"seed").hexdigest()
    missing = make_task(
        [{"type": "download", "parameters": {"files": [{"url": url + "x", "path": "~/a"}]}}]
    )
    with pytest.raises(SetupError, match="not in the cache"):
        plan_steps(missing.config, missing, ctx)
    escape = make_task(
        [{"type": "drums_files", "parameters": {"files": [{"src": "../../x", "path": "~/x"}]}}]
    )
    with pytest.raises(SetupError, match="outside"):
        plan_steps(escape.config, escape, ctx)


def history_db(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE urls (id INTEGER PRIMARY KEY, url TEXT, title TEXT, visit_count INTEGER,"
        " typed_count INTEGER, last_visit_time INTEGER, hidden INTEGER);"
        "CREATE TABLE visits (id INTEGER PRIMARY KEY, url INTEGER, visit_time INTEGER,"
        " from_visit INTEGER, transition INTEGER, segment_id INTEGER, visit_duration INTEGER);"
        "INSERT INTO urls (url, title) VALUES ('https://old.example', 'old');"
    )
    conn.commit()
    conn.close()


async def test_update_browse_history_rewrites_chromium_history(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    ctx = context(slot, tmp_path)
    history = slot.home / ".config" / "chromium" / "Default" / "History"
    history.parent.mkdir(parents=True)
    history_db(history)
    items = [
        {"url": "https://a.example/", "title": "A", "visit_time_from_now_in_seconds": 3600},
        {"url": "https://b.example/", "title": "B", "visit_time_from_now_in_seconds": 60},
    ]
    task = make_task([{"type": "update_browse_history", "parameters": {"history": items}}])
    await run_setup(task, slot, ctx)
    conn = sqlite3.connect(history)
    rows = conn.execute("SELECT url, title FROM urls ORDER BY last_visit_time").fetchall()
    visits = conn.execute("SELECT count(*) FROM visits").fetchone()[0]
    conn.close()
    assert rows == [("https://a.example/", "A"), ("https://b.example/", "B")] and visits == 2


async def test_windows_are_matched_like_osworld(tmp_path: Path) -> None:
    title = "Student_Level_Fill_Blank.xlsx - LibreOffice Calc"
    slot = DirSlot(tmp_path / "slot", windows=[{"id": "0x3a00007", "title": title}])
    ctx = context(slot, tmp_path)
    steps = [
        {"type": "activate_window", "parameters": {"window_name": title, "strict": True}},
        {"type": "close_window", "parameters": {"window_name": "libreoffice calc"}},
        {"type": "activate_window", "parameters": {"window_name": "Writer", "strict": True}},
    ]
    report = await run_setup(make_task(steps), slot, ctx)
    wm = [c for c in slot.user_commands if isinstance(c, str) and c.startswith("wmctrl")]
    assert wm[0].startswith("wmctrl -i -a 0x3a00007") and wm[1].startswith("wmctrl -i -c")
    assert report.records[2].rc == 1 and "no window" in (report.records[2].detail or "")


async def test_open_waits_for_the_window(tmp_path: Path) -> None:
    path = "/home/user/Report.docx"
    slot = DirSlot(tmp_path / "slot", windows=[{"id": "0x1", "title": "Report.docx - Writer"}])
    ctx = context(slot, tmp_path)
    await apply_operations([OpenFile(path, timeout_s=5)], slot, ctx)
    assert "xdg-open /home/user/Report.docx" in slot.launched[0]
    lonely = DirSlot(tmp_path / "slot2")
    with trio.fail_after(10):
        with pytest.raises(SetupError, match=r"no window showing 'Report\.docx'"):
            await apply_operations([OpenFile(path, timeout_s=1)], lonely, ctx)


async def test_a_hung_step_hits_its_deadline(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    slot.hang = True
    ctx = context(slot, tmp_path).model_copy(update={"step_timeout_s": 0.5})
    task = make_task([{"type": "execute", "parameters": {"command": ["true"]}}])
    start = trio.current_time()
    with pytest.raises(SetupError, match="timed out") as info:
        await run_setup(task, slot, ctx)
    assert trio.current_time() - start < 5
    assert info.value.report is not None


async def test_a_failing_root_step_is_recorded_and_setup_goes_on(tmp_path: Path) -> None:
    """As OSWorld's execute: a462a795's `echo password | sudo -S su - charles` fails on every
    image without that user, and the task (infeasible) is still meant to run."""
    slot = DirSlot(tmp_path / "slot")
    task = make_task(
        [
            {
                "type": "execute",
                "parameters": {"command": "echo pw | sudo -S false", "shell": True},
            },
            {"type": "execute", "parameters": {"command": ["touch", "after"]}},
        ]
    )
    report = await run_setup(task, slot, context(slot, tmp_path))
    assert [(r.kind, r.rc, r.ok) for r in report.records] == [
        ("RunTrusted", 1, False),
        ("RunUser", 0, True),
    ]
    assert (slot.home / "after").exists()


async def test_execute_until_retries(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    slot.add_fake_command(
        "warmup",
        'n=$(cat "$HOME/n" 2>/dev/null || echo 0); n=$((n+1)); echo $n > "$HOME/n"\n'
        '[ "$n" -ge 3 ] && echo ready || echo starting\n',
    )
    task = make_task(
        [{"type": "execute", "parameters": {"command": ["warmup"], "until": {"stdout": "ready"},
                                            "stdout": "warm.txt"}}]
    )  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    await run_setup(task, slot, context(slot, tmp_path), run_dir=run_dir)
    assert (slot.home / "n").read_text().strip() == "3"
    assert (run_dir / "warm.txt").read_text() == "ready\n"


class FakeDevTools(BaseHTTPRequestHandler):
    pages: list[dict] = []

    def _answer(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/json/list":
            self._answer(self.pages)
        elif self.path.startswith("/json/close/"):
            target = self.path.rsplit("/", 1)[1]
            self.pages[:] = [p for p in self.pages if p["id"] != target]
            self._answer("Target is closing")
        else:
            self.send_error(404)

    def do_PUT(self) -> None:
        url = unquote(self.path.split("?", 1)[1])
        page = {"id": f"p{len(self.pages) + 10}", "type": "page", "url": url, "title": url}
        self.pages.append(page)
        self._answer(page)

    def log_message(self, *args: object) -> None:
        return


async def test_chrome_tabs_through_the_devtools_endpoint(tmp_path: Path) -> None:
    FakeDevTools.pages = [{"id": "p0", "type": "page", "url": "chrome://newtab/", "title": "New"}]
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeDevTools)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        slot = DirSlot(tmp_path / "slot")
        ctx = context(slot, tmp_path, devtools_port=server.server_address[1])
        urls = ["https://www.example.com/a", "https://docs.example.org/"]
        steps = [
            Step(type="chrome_open_tabs", parameters={"urls_to_open": urls}),
            Step(type="chrome_close_tabs", parameters={"urls_to_close": ["example.com/a"]}),
        ]
        task = make_task([s.model_dump() for s in steps])
        await run_setup(task, slot, ctx)
        assert [p["url"] for p in FakeDevTools.pages] == ["https://docs.example.org/"]
    finally:
        server.shutdown()
        server.server_close()


async def test_put_file_plan_names_sources(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path / "slot")
    ctx = context(slot, tmp_path)
    (ctx.assets_dir / "t1").mkdir(parents=True)
    (ctx.assets_dir / "t1" / "f").write_text("x")
    task = make_task(
        [{"type": "drums_files", "parameters": {"files": [{"src": "f", "path": "/x"}]}}]
    )
    assert plan_steps(task.config, task, ctx) == [
        PutFile(source=(ctx.assets_dir / "t1" / "f").resolve(), dest="/x")
    ]


# Setup commands of OSWorld's current ec4e3f68 (os) and 93eabf48 (chrome), as they are there.
EC4E3F68_FAVOURITES = (
    "export DBUS_SESSION_BUS_ADDRESS='unix:path=/run/user/1000/bus'\n"
    "gsettings set org.gnome.shell favorite-apps "
    "\"['thunderbird.desktop', 'vim.desktop', 'google-chrome.desktop']\""
)
DARK_MODE_PREFS = (
    "mkdir -p /home/user/.config/google-chrome/Default && if [ ! -f "
    "/home/user/.config/google-chrome/Default/Preferences ]; then echo '{}' > "
    '/home/user/.config/google-chrome/Default/Preferences; fi && python3 -c "import json; '
    "p='/home/user/.config/google-chrome/Default/Preferences'; d=json.load(open(p)); "
    "d.setdefault('browser', {}).setdefault('theme', {})['color_scheme'] = 2; "
    "d['browser']['theme']['color_scheme2'] = 2; json.dump(d, open(p, 'w'))\""
)


def test_values_naming_chrome_are_left_as_they_are() -> None:
    """ec4e3f68: the favourite 'google-chrome.desktop' is a value, not a command: rewritten to
    Chromium's command line, the task's correct fix scored 0."""
    assert translate_command(EC4E3F68_FAVOURITES, True, TaskContext()) == EC4E3F68_FAVOURITES


def test_chrome_profile_paths_become_chromium_profile_paths() -> None:
    """93eabf48: the profile path stays a path (the mkdir failed on a path with Chromium's command
    line in it); Google Chrome's profile directory is Chromium's, so its Preferences are read."""
    got = translate_command(DARK_MODE_PREFS, True, TaskContext())
    assert "google-chrome" not in got and "--no-sandbox" not in got
    assert got == DARK_MODE_PREFS.replace("/.config/google-chrome/", "/.config/chromium/")


@pytest.mark.parametrize(
    ("shell", "translated"),
    [
        ("google-chrome --remote-debugging-port=1337 &", "CHROME --remote-debugging-port=1337 &"),
        ("pkill google-chrome; nohup google-chrome >/dev/null 2>&1 &",
         "pkill chromium; nohup CHROME >/dev/null 2>&1 &"),
        ("FOO=1 sudo -S google-chrome-stable", "FOO=1 sudo -S CHROME"),
        ("if true; then google-chrome; fi", "if true; then CHROME; fi"),
        ("cat x | google-chrome", "cat x | CHROME"),
        ("echo google-chrome > /tmp/google-chrome", "echo google-chrome > /tmp/google-chrome"),
        ("ls /opt/google-chrome; echo 'google-chrome'",
         "ls /opt/google-chrome; echo 'google-chrome'"),
    ],
)  # fmt: skip
def test_only_command_words_become_chromium(shell: str, translated: str) -> None:
    chrome = "google-chrome --remote-debugging-port=1337"
    got = translate_command(shell, True, TaskContext())
    assert got == translated.replace("CHROME", chrome)
