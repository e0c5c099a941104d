"""OSWorld's offline getters on real restored desktops (office image), through the API: inline
tasks whose checkers are OSWorld's own metrics score 1 after a scripted solution made of real
desktop actions and 0 when nothing is done. DRUMS_LIVE=1 (root, CRIU, the office image; an image
built from this tree's guest sources with DRUMS_LIVE_IMAGES_DIR, since desktop-init changed).

- Chromium over DevTools: the active tab's URL (active_url_from_accessTree), its info
  (active_tab_info), an element's text and an input's value (active_tab_html_parse), on pages a
  server in the slot serves, the input typed into by a click and keystrokes.
- The terminal a task starts itself (an xterm from a launch step) is the one the terminal route
  and vm_terminal_output read.
- background_image_in_slide: the image a slide's background fills with, read from the .pptx in
  the slot (compare_images against the same picture on the Desktop).
- vm_screen_size, vm_window_size (is_vlc_fullscreen over a fullscreen xterm) and
  default_video_player (check_include_exclude after `xdg-mime default`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from drumsd.tasks.testing import png_image, pptx_with_media
from gate_daemons import (
    create,
    destroy,
    episode,
    execute,
    final,
    office_daemon,
    put_file,
    settled_gates,
    verify,
)
from harness import poll
from live_daemon import http_client

SITE = "/home/user/Desktop/site"
PAGE_A = "<html><head><title>Page A</title></head><body><h1>Page A</h1></body></html>"
# The input covers the whole viewport: a click anywhere on the page focuses it.
PAGE_B = (
    "<!DOCTYPE html><html><head><title>Page B</title></head><body><h1>Page B</h1>"
    "<input id='name' style='position:fixed;inset:0;width:100%;height:100%;font-size:40px'>"
    "</body></html>"
)
URL_A = "http://localhost:8765/a.html"
URL_B = "http://localhost:8765/b.html"


def _write(path: str, text: str) -> str:
    return f"mkdir -p $(dirname {path}) && printf '%s' \"{text}\" > {path}"


CHROME_TASK: dict[str, Any] = {
    "id": "drums-getters-chrome",
    "instruction": "Open page B in a new tab and type Ada into its box.",
    "related_apps": ["chrome"],
    "config": [
        {"type": "execute", "parameters": {"shell": True, "command": (
            _write(f"{SITE}/a.html", PAGE_A) + " && " + _write(f"{SITE}/b.html", PAGE_B))}},
        {"type": "launch", "parameters": {"command": [
            "python3", "-m", "http.server", "8765", "--bind", "127.0.0.1", "--directory", SITE]}},
        {"type": "launch", "parameters": {"command": [
            "google-chrome", "--remote-debugging-port=1337"]}},
        {"type": "chrome_open_tabs", "parameters": {"urls_to_open": [URL_A]}},
    ],
    "evaluator": {
        "func": ["is_expected_active_tab", "is_expected_active_tab", "check_direct_json_object",
                 "check_direct_json_object", "exact_match"],
        "result": [
            {"type": "active_url_from_accessTree", "goto_prefix": "http://"},
            {"type": "active_tab_info", "goto_prefix": "http://"},
            {"type": "active_tab_html_parse", "goto_prefix": "http://", "category": "xpath",
             "xpathObject": {"//h1": "heading"}},
            {"type": "active_tab_html_parse", "goto_prefix": "http://", "category": "input",
             "inputObject": {"//input[@id='name']": "name"}},
            {"type": "chrome_appearance_mode_ui"},
        ],
        "expected": [
            {"type": "rule", "rules": {"type": "url", "url": URL_B}},
            {"type": "rule", "rules": {"type": "url", "url": URL_B}},
            {"type": "rule", "rules": {"expected": {"heading": "Page B"}}},
            {"type": "rule", "rules": {"expected": {"name": "Ada"}}},
            {"type": "rule", "rules": {"expected": "system"}},  # Chromium's default appearance
        ],
    },
}  # fmt: skip

TERMINAL_TASK: dict[str, Any] = {
    "id": "drums-getters-terminal",
    "instruction": "In the terminal that opened, print the answer.",
    "config": [{"type": "launch", "parameters": {"command": ["xterm", "-T", "task-terminal"]}}],
    "evaluator": {
        "func": "check_include_exclude",
        "result": {"type": "vm_terminal_output"},
        "expected": {"type": "rule", "rules": {"include": ["drums-42"], "exclude": []}},
    },
}

DESKTOP_TASK: dict[str, Any] = {
    "id": "drums-getters-desktop",
    "instruction": "Make Chromium the default video player and open a fullscreen terminal.",
    "evaluator": {
        "func": ["exact_match", "check_include_exclude", "is_vlc_fullscreen"],
        "result": [
            {"type": "vm_screen_size"},
            {"type": "default_video_player"},
            {"type": "vm_window_size", "app_class_name": "BigTerm"},
        ],
        "expected": [
            {"type": "rule", "rules": {"expected": {"width": 1920, "height": 1080}}},
            {"type": "rule", "rules": {"include": ["chromium.desktop"], "exclude": []}},
            {"type": "vm_screen_size"},
        ],
    },
}


@pytest.fixture(scope="module")
def office():
    return office_daemon()


def _step(http: Any, sid: str, action: dict[str, Any]) -> dict[str, Any]:
    r = http.post(f"/v1/slots/{sid}/step", json={"action": action})
    assert r.status_code == 200, r.text
    return r.json()


def _ok(out: dict[str, Any]) -> str:
    assert out["output"]["returncode"] == 0, out
    return str(out["output"].get("stdout", ""))


def _episode(daemon: Any, task: dict[str, Any], solve: Any) -> dict[str, Any]:
    return episode(daemon, task, None, "done" if solve is not None else None, solve=solve)


def _open_b_and_type(http: Any, sid: str) -> None:
    # A new tab from DevTools (it becomes the active one), then a real click and keystrokes.
    opened = "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:1337/json/new?%s' % '{}', method='PUT'), timeout=20).read()"  # noqa: E501
    _ok(execute(http, sid, f'python3 -c "{opened.format(URL_B)}"'))
    check = (
        'python3 -c "import json,urllib.request as u; '
        "print(json.load(u.urlopen('http://127.0.0.1:1337/json/list'))[0]['title'])\""
    )
    poll("page B loaded", lambda: "Page B" in _ok(execute(http, sid, check)), limit_s=60)
    _step(http, sid, {"type": "click", "x": 400, "y": 600})  # inside the 955 px wide window
    _step(http, sid, {"type": "type", "text": "Ada"})


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
def test_chromium_active_tab_getters(office, solved):
    result = _episode(office, CHROME_TASK, _open_b_and_type if solved else None)
    assert result["score"] == (1.0 if solved else 0.0), result
    # Verify froze the slot to read its files and scan it (issue 36); these getters ask the
    # live browser over DevTools after the thaw, and it answers.
    assert "not_frozen" not in result["audit"]["flags"], result["audit"]


def test_the_terminal_a_task_starts_is_the_one_read(office):
    with http_client(office) as http:
        sid = create(http)["id"]
        try:
            before = http.get(f"/v1/slots/{sid}/terminal").json()
            assert before["text"] is not None, before  # desktop-init's xterm
            r = http.post(f"/v1/slots/{sid}/task", json={"task": TERMINAL_TASK})
            assert r.status_code == 200, r.text
            r = verify(http, sid)
            assert r.status_code == 200 and r.json()["score"] == 0.0, r.text
            newest = _ok(execute(http, sid, "pgrep -n -x xterm")).strip()
            assert newest and f"xterm pid {newest}" != before["source"], (newest, before)
            _step(http, sid, {"type": "type", "text": "echo drums-$((6*7))\n"})

            def printed() -> dict[str, Any] | None:
                got = http.get(f"/v1/slots/{sid}/terminal").json()
                return got if "drums-42" in (got["text"] or "").split("echo", 1)[-1] else None

            got = poll("the task's xterm shows the answer", printed, limit_s=20)
            assert got["source"] == f"xterm pid {newest}", got
            final(http, sid, "done")
            settled_gates(http, sid)
            r = verify(http, sid)
            assert r.status_code == 200, r.text
            assert r.json()["score"] == 1.0 and r.json()["valid"] is True, r.json()
        finally:
            destroy(http, sid)


def _player_and_fullscreen(http: Any, sid: str) -> None:
    types = "video/mp4 video/x-matroska video/webm"
    _ok(execute(http, sid, f"xdg-mime default chromium.desktop {types}"))
    _ok(execute(http, sid, "setsid -f xterm -class BigTerm -fullscreen >/dev/null 2>&1"))
    find = "xdotool search --onlyvisible --class BigTerm || true"
    poll("the fullscreen xterm is mapped", lambda: _ok(execute(http, sid, find)).strip())


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
def test_screen_window_and_default_player(office, solved):
    result = _episode(office, DESKTOP_TASK, _player_and_fullscreen if solved else None)
    assert result["score"] == (1.0 if solved else 0.0), result


PICTURE = png_image(64, 64)
DECK = "/home/user/Desktop/deck.pptx"
LANDSCAPE = "/home/user/Desktop/landscape.png"
PLAIN_DECK = pptx_with_media([("", [])], image=PICTURE)
BACKGROUND_DECK = pptx_with_media(
    [("rId2", [("rId2", "image", "../media/image1.png", None)])], image=PICTURE
)


SLIDE_TASK: dict[str, Any] = {
    "id": "drums-getters-slide",
    "instruction": "Make landscape.png the background of the first slide.",
    "config": [
        {"type": "execute", "parameters": {"shell": True, "command": (
            put_file(DECK, PLAIN_DECK) + " && " + put_file(LANDSCAPE, PICTURE))}},
    ],
    "evaluator": {
        "func": "compare_images",
        "result": {"type": "background_image_in_slide", "ppt_file_path": DECK, "slide_index": 0,
                   "dest": "bg.png"},
        "expected": {"type": "vm_file", "path": LANDSCAPE,
                     "dest": "landscape.png"},
    },
}  # fmt: skip


@pytest.mark.parametrize("solved", [True, False], ids=["solved", "nothing"])
def test_slide_background_image(office, solved):
    def save_deck(http: Any, sid: str) -> None:
        _ok(execute(http, sid, put_file(DECK, BACKGROUND_DECK)))

    result = _episode(office, SLIDE_TASK, save_deck if solved else None)
    assert result["score"] == (1.0 if solved else 0.0), result


def test_python_in_a_slot_loads_the_images_compiled_modules(office):
    """A task's `python3 -c` (a setup step, a vm_command_line check) runs as the desktop user, who
    cannot write a pycache under /usr: the image holds its modules compiled
    (`image._compile_python`), so each start loads the stdlib's .pyc files rather than
    compiling the sources again (office image: zipfile's import 80 ms of CPU against 10 ms)."""
    with http_client(office) as http:
        sid = create(http)["id"]
        try:
            out = _ok(execute(http, sid, "id -u; python3 -v -c 'import zipfile' 2>&1"))
        finally:
            destroy(http, sid)
    uid, _, verbose = out.partition("\n")
    assert uid.strip() != "0", out[:200]
    loaded = [line for line in verbose.splitlines() if "zipfile" in line and ".py" in line]
    assert any(".pyc matches" in line for line in loaded), loaded
    assert "# code object from /usr/lib/python3.11/zipfile.py" not in loaded, loaded
