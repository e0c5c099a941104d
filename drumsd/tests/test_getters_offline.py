"""The getters of OSWorld's offline-runnable tasks (getters_desktop.py, getters_chrome.py): their
pure parts, and whole tasks through OSWorld's own metrics on a directory slot. The live proof on
restored desktops is tests/live/test_getters_live.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from drumsd.tasks import getters_chrome as chrome
from drumsd.tasks import getters_desktop as desktop
from drumsd.tasks.evaluate import default_runner, evaluate
from drumsd.tasks.getters import FileArg, GetterEnv, GetterError, ResultMissing, get_value
from drumsd.tasks.host_support import SUPPORTED_GETTERS
from drumsd.tasks.model import TaskContext, resolve_task
from drumsd.tasks.testing import DirSlot, checker_context, png_image, pptx_with_media

OFFLINE_GETTERS = (
    "vlc_config", "vlc_playing_info", "active_url_from_accessTree", "active_tab_html_parse",
    "audio_in_slide", "vm_wallpaper", "url_path_parse", "chrome_appearance_mode_ui",
    "active_tab_info", "background_image_in_slide", "default_video_player", "vm_screen_size",
    "vm_window_size",
)  # fmt: skip


def test_every_offline_getter_is_implemented_and_listed_supported() -> None:
    from drumsd.tasks.getters import GETTERS

    for name in OFFLINE_GETTERS:
        assert name in GETTERS and name in SUPPORTED_GETTERS, name


@pytest.mark.parametrize(
    ("url", "text"),
    [
        ("https://www.example.com/", "example.com"),
        ("https://www.example.com/a/b?q=1", "example.com/a/b?q=1"),
        ("http://localhost:8000/page.html", "localhost:8000/page.html"),
        ("https://docs.python.org/3/", "docs.python.org/3/"),
        ("chrome://settings/", "chrome://settings/"),
        ("file:///home/user/a.html", "file:///home/user/a.html"),
    ],
)
def test_the_address_bar_text_of_a_url(url: str, text: str) -> None:
    assert chrome.omnibox_text(url) == text


def test_macys_url_fields() -> None:
    url = (
        "https://www.macys.com/shop/mens-clothing/shirts/Product_department,Sleeve_length,"
        "Price_discount_range/Shirts,Short%20Sleeve,50_PERCENT_%20off%20%26%20more?id=20626"
    )
    got = chrome.macys_url_fields(url, ["Sleeve_length", "Price_discount_range", "Nope"])
    assert got == {
        "mens_clothing": True,
        "shirts": True,
        "short_sleeve": True,
        "Sleeve_length": "Short Sleeve",
        "Price_discount_range": "50_PERCENT_ off & more",
    }
    assert chrome.macys_url_fields("https://www.macys.com/", [])["mens_clothing"] is None


def test_url_dash_part() -> None:
    url = "https://www.x.com/store/item-name?id=7"
    assert chrome.url_dash_part(url, {"partIndex": 4, "returnType": "string"}) == "item-name?id=7"
    config = {"partIndex": 4, "needDeleteId": True, "returnType": "json", "key": "item"}
    assert chrome.url_dash_part(url, config) == {"item": "item-name"}
    assert chrome.url_dash_part(url, {"partIndex": 9, "returnType": "string"}) is None


def test_query_fields_renamed_and_split() -> None:
    url = "https://x.org/s?from=SEA&to=NYC,BOS&d=1"
    config = {"parse_keys": ["from", "to"], "replace": {"from": "origin"}, "split_list": True}
    assert chrome.query_fields(url, config) == {"to": ["NYC", "BOS"], "origin": ["SEA"]}


@pytest.mark.parametrize(
    ("prefs", "mode"),
    [
        (None, "system"),
        ({}, "system"),
        ({"browser": {"theme": {"color_scheme2": 2}}}, "dark"),
        ({"browser": {"theme": {"color_scheme": 1}}}, "light"),
        ({"browser": {"theme": {"color_scheme2": "dark"}}}, "dark"),
        ({"browser": {"theme": {"color_scheme2": 2}}, "extensions": {"theme": {"system_theme": 0}}},
         "light"),
    ],
)  # fmt: skip
def test_appearance_mode_from_preferences(prefs: Any, mode: str) -> None:
    assert chrome.color_scheme(prefs) == mode


def test_png_size() -> None:
    assert desktop.png_size(png_image(64, 48)) == (64, 48)
    assert desktop.png_size(b"\x89PNG\r\n\x1a\n") is None


def test_wallpaper_path_and_default_player_answers() -> None:
    assert desktop.wallpaper_path("'file:///usr/share/backgrounds/a b.png'\n") == (
        "/usr/share/backgrounds/a b.png"
    )
    assert desktop.wallpaper_path("''") is None
    assert desktop.most_common_app("vlc.desktop\nvlc.desktop\ntotem.desktop\n\n") == "vlc.desktop"
    assert desktop.most_common_app("\n") == "unknown"


# ---- slides: a .pptx laid out as PowerPoint and LibreOffice write one --------------------------


def test_slide_media_embedded_and_external() -> None:
    pptx = pptx_with_media(
        [
            ("rId2", [("rId1", "slideLayout", "../slideLayouts/slideLayout1.xml", None),
                      ("rId2", "image", "../media/image1.png", None),
                      ("rId3", "audio", "../media/media1.wav", None)]),
            ("", [("rId1", "audio", "file:///home/user/Music/a.mp3", "External")]),
        ]
    )  # fmt: skip
    audio = desktop.slide_audio(pptx, 0)
    assert audio is not None and audio.data == b"RIFF....WAVEfmt " and audio.external is None
    background = desktop.slide_background_image(pptx, 0)
    assert background is not None and desktop.png_size(background.data or b"") == (4, 4)
    linked = desktop.slide_audio(pptx, 1)
    assert linked is not None and linked.external == "/home/user/Music/a.mp3"
    assert desktop.slide_background_image(pptx, 1) is None  # no p:bgPr image
    assert desktop.slide_audio(pptx, 5) is None  # no such slide


# ---- the getters on a directory slot ---------------------------------------------------------


def _env(slot: DirSlot, role: str = "result", **ctx: Any) -> GetterEnv:
    context = TaskContext(user_home=str(slot.home), **ctx)
    task = resolve_task({"id": "t", "evaluator": {"func": "exact_match"}}, [])
    return GetterEnv(slot, context, task, "result0", None, role)


async def test_slide_getters_read_the_presentation_of_the_slot(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    deck = slot.home / "Desktop" / "deck.pptx"
    music = slot.home / "Music" / "a.mp3"
    music.parent.mkdir(parents=True)
    music.write_bytes(b"ID3 external")
    deck.write_bytes(
        pptx_with_media(
            [
                ("rId2", [("rId2", "image", "../media/image1.png", None)]),
                ("", [("rId1", "audio", f"file://{music}", "External")]),
            ]
        )
    )
    config = {"ppt_file_path": str(deck), "slide_index": 1, "dest": "a.mp3"}
    got = await get_value({"type": "audio_in_slide", **config}, _env(slot))
    assert got == FileArg("result0/a.mp3", b"ID3 external")
    config = {"ppt_file_path": str(deck), "slide_index": 0, "dest": "bg.png"}
    got = await get_value({"type": "background_image_in_slide", **config}, _env(slot))
    assert isinstance(got, FileArg) and desktop.png_size(got.data or b"") == (4, 4)
    assert await get_value({"type": "audio_in_slide", **config}, _env(slot)) is None


async def test_wallpaper_player_and_screen_size_through_the_slot(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    picture = slot.home / "Pictures" / "w.png"
    picture.parent.mkdir(parents=True)
    picture.write_bytes(png_image(8, 8))
    slot.add_fake_command("gsettings", f"echo \"'file://{picture}'\"\n")
    got = await get_value({"type": "vm_wallpaper", "dest": "bg.png"}, _env(slot))
    assert got == FileArg("result0/bg.png", picture.read_bytes())
    slot.add_fake_command(
        "xdg-mime", 'case "$3" in video/mp4|video/webm) echo vlc.desktop;; *) echo;; esac\n'
    )
    assert await get_value({"type": "default_video_player"}, _env(slot)) == "vlc.desktop"
    # DirSlot's screenshot is only a PNG signature: no size to read.
    with pytest.raises(GetterError, match="not a PNG"):
        await get_value({"type": "vm_screen_size"}, _env(slot))


# What VLC 3.0 writes to ~/.config/vlc/vlcrc (every option, defaults commented out), trimmed to
# the sections OSWorld's VLC checkers read.
VLCRC = """\
###
###  vlc 3.0.18
###

###
### lines beginning with a '#' character are comments
###

[qt] # Qt interface

# Show notification popup on track change (integer)
#qt-notification=1

# Start in minimal view (without menus) (boolean)
{minimal}

# Display background cone or art (boolean)
#qt-bgcone=1

[core] # core program

# Record directory (string)
#input-record-path=
"""


@pytest.fixture(scope="session")
def venv_ctx() -> TaskContext:
    return checker_context()


async def test_vlc_config_task_scores_with_osworlds_metric(
    venv_ctx: TaskContext, tmp_path: Path
) -> None:
    task = resolve_task(
        {"id": "a5bbbcd5", "evaluator": {
            "func": "check_qt_minimal_view",
            "result": {"type": "vlc_config", "dest": "vlcrc"},
            "expected": {"type": "rule", "rules": {"expected_qt_minimal_view": 1}}}},
        [],
    )  # fmt: skip
    slot = DirSlot(tmp_path)
    ctx = venv_ctx.model_copy(update={"user_home": str(slot.home)})

    async def score() -> Any:
        return (await evaluate(task, slot, ctx, default_runner(ctx), last_action="DONE")).score

    assert await score() == 0.0  # VLC never saved its config: the result is missing
    vlcrc = slot.home / ".config" / "vlc" / "vlcrc"
    vlcrc.parent.mkdir(parents=True)
    vlcrc.write_text(VLCRC.format(minimal="#qt-minimal-view=0"))
    assert await score() == 0.0
    vlcrc.write_text(VLCRC.format(minimal="qt-minimal-view=1"))
    assert await score() == 1.0


async def test_vlc_playing_info_is_missing_when_vlc_does_not_answer(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    # Port 9 (discard) on the host's loopback: nothing listens there.
    config = {"type": "vlc_playing_info", "dest": "status.xml"}
    with pytest.raises(ResultMissing, match="VLC's HTTP interface did not answer"):
        await get_value(config, _env(slot, vlc_http_port=9))
    assert await get_value(config, _env(slot, role="expected", vlc_http_port=9)) is None


async def test_devtools_getters_say_chromium_is_not_answering(tmp_path: Path) -> None:
    slot = DirSlot(tmp_path)
    env = _env(slot, devtools_port=9)
    with pytest.raises(GetterError, match=r"DevTools \(port 9\) did not answer"):
        await get_value({"type": "active_url_from_accessTree"}, env)
    with pytest.raises(GetterError, match="unknown category 'css'"):
        await get_value({"type": "active_tab_html_parse", "category": "css"}, env)


def test_the_cdp_script_compiles() -> None:
    compile(chrome.CDP_SCRIPT, "cdp", "exec")
    compile(desktop._VLC_STATUS_SCRIPT, "vlc", "exec")
    assert json.dumps(chrome._HTML_PARSE_JS)  # a plain string the page evaluates


def test_wallpaper_tasks_need_gnomes_background_schema() -> None:
    from drumsd.linux.image_apps import AppManifest
    from drumsd.tasks.host_support import support

    task = resolve_task(
        {"id": "w", "evaluator": {"func": "exact_match",
                                  "result": {"type": "vm_wallpaper", "dest": "bg.png"},
                                  "expected": {"type": "rule", "rules": {"expected": 1}}}},
        [],
    )  # fmt: skip
    bare = TaskContext(apps=AppManifest(profile="office", apps=frozenset({"gsettings"})))
    ok, why = support(task, bare)
    assert not ok and "'org.gnome.desktop.background'" in (why or "") and "office" in (why or "")
    schemas = frozenset({"org.gnome.desktop.background"})
    gnome = TaskContext(apps=AppManifest(profile="osworld", apps=frozenset(), schemas=schemas))
    assert "schema" not in (support(task, gnome)[1] or "")
