"""OSWorld's desktop, VLC and slide getters (screen size, wallpaper, default video player, VLC's
config and playing status, a slide's audio or background image), read through SlotAccess.

Each answers in the shape OSWorld's getter gives the metric: a dict, a string, or a file (a
`FileArg`); None where OSWorld's getter returns None (nothing to read, the app not answering).
"""

from __future__ import annotations

import json
import posixpath
import struct
import xml.etree.ElementTree as ET
import zipfile
from collections import Counter
from dataclasses import dataclass
from io import BytesIO
from typing import Any

import trio

from .getters import FileArg, GetterEnv, GetterError, ResultMissing, _read, getter, run_python

# ---- the desktop -----------------------------------------------------------------------------


def png_size(png: bytes) -> tuple[int, int] | None:
    """Width and height from a PNG's IHDR chunk (None if the bytes are not a PNG)."""
    if len(png) < 24 or png[:8] != b"\x89PNG\r\n\x1a\n" or png[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", png[16:24])
    return width, height


@getter("vm_screen_size")
async def vm_screen_size(config: dict[str, Any], env: GetterEnv) -> dict[str, int]:
    # OSWorld asks the X server for the root window's size; the screenshot is that window.
    with trio.fail_after(env.timeout_s):
        size = png_size(await env.access.screenshot())
    if size is None:
        raise GetterError("vm_screen_size: the slot's screenshot is not a PNG")
    return {"width": size[0], "height": size[1]}


# The first client window whose WM_CLASS has the name (case-insensitive), as OSWorld's server
# looks it up in _NET_CLIENT_LIST; its size from xwininfo. Prints {"width", "height"} or null.
_WINDOW_SIZE_SCRIPT = r"""
import json, re, subprocess, sys
def run(*argv):
    return subprocess.run(argv, capture_output=True, text=True).stdout
want = sys.argv[1].lower()
clients = run("xprop", "-root", "_NET_CLIENT_LIST").split("#", 1)[-1]
for wid in re.findall(r"0x[0-9a-fA-F]+", clients):
    classes = re.findall(r'"([^"]*)"', run("xprop", "-id", wid, "WM_CLASS"))
    if want in [c.lower() for c in classes]:
        info = run("xwininfo", "-id", wid)
        size = [re.search(r"%s: +(\d+)" % k, info) for k in ("Width", "Height")]
        if all(size):
            print(json.dumps({"width": int(size[0].group(1)), "height": int(size[1].group(1))}))
            sys.exit(0)
print("null")
"""


@getter("vm_window_size")
async def vm_window_size(config: dict[str, Any], env: GetterEnv) -> Any:
    rc, out, err = await run_python(env, _WINDOW_SIZE_SCRIPT, [str(config["app_class_name"])])
    if rc != 0:
        raise GetterError(f"vm_window_size: the window lookup failed ({rc}): {err[-300:]}")
    return json.loads(out)  # None: no such window (OSWorld's server answers nothing then)


def wallpaper_path(gsettings_output: str) -> str | None:
    """`gsettings get org.gnome.desktop.background picture-uri` -> the file path, as OSWorld's
    server reads it (the quotes and `file://` dropped)."""
    path = gsettings_output.strip().replace("file://", "").replace("'", "")
    return path or None


@getter("vm_wallpaper")
async def vm_wallpaper(config: dict[str, Any], env: GetterEnv) -> Any:
    argv = ["gsettings", "get", "org.gnome.desktop.background", "picture-uri"]
    rc, out, err = await env.access.exec_user(argv, env.timeout_s)
    path = wallpaper_path(out) if rc == 0 else None
    data = await _read(env, path) if path else None
    if data is None and env.role == "result":
        why = f"{path} does not exist" if path else f"gsettings answered {rc}: {err.strip()[-200:]}"
        raise ResultMissing(f"vm_wallpaper: no wallpaper file ({why})")
    return FileArg(env.file_name(config["dest"]), data)


# OSWorld's list (video/<type>), each once: the most common default handler wins.
VIDEO_TYPES = (
    "3gp", "3gpp", "3gpp2", "avi", "divx", "dv", "fli", "flv", "mp2t", "mp4", "mp4v-es", "mpeg",
    "mpeg-system", "msvideo", "ogg", "quicktime", "vnd.divx", "vnd.mpegurl", "vnd.rn-realvideo",
    "webm", "x-anim", "x-avi", "x-flc", "x-fli", "x-flv", "x-m4v", "x-matroska", "x-mpeg",
    "x-mpeg-system", "x-mpeg2", "x-ms-asf", "x-ms-asf-plugin", "x-ms-asx", "x-ms-wm", "x-ms-wmv",
    "x-ms-wmx", "x-ms-wvx", "x-msvideo", "x-nsv", "x-ogm", "x-ogm+ogg", "x-theora",
    "x-theora+ogg",
)  # fmt: skip
_DEFAULT_PLAYER_SCRIPT = (
    f"for t in {' '.join(VIDEO_TYPES)}; do xdg-mime query default video/$t; done"
)


def most_common_app(lines: str) -> str:
    apps = [line.strip() for line in lines.splitlines() if line.strip()]
    return Counter(apps).most_common(1)[0][0] if apps else "unknown"


@getter("default_video_player")
async def default_video_player(config: dict[str, Any], env: GetterEnv) -> str:
    # One shell for every type (OSWorld makes one request per type; the answers are the same).
    rc, out, err = await env.access.exec_user(_DEFAULT_PLAYER_SCRIPT, env.timeout_s)
    if rc != 0 and not out.strip():
        raise GetterError(f"default_video_player: xdg-mime failed ({rc}): {err.strip()[-300:]}")
    return most_common_app(out)


# ---- VLC -------------------------------------------------------------------------------------


@getter("vlc_config")
async def vlc_config(config: dict[str, Any], env: GetterEnv) -> Any:
    path = f"{env.ctx.user_home}/.config/vlc/vlcrc"
    data = await _read(env, path)
    if data is None and env.role == "result":
        raise ResultMissing(f"VLC's config {path} does not exist in the slot (VLC never saved it)")
    return FileArg(env.file_name(config.get("dest", "vlcrc")), data)


# VLC's HTTP interface inside the slot (OSWorld: port 8080, user "", password "password").
_VLC_STATUS_SCRIPT = r"""
import base64, sys, urllib.request
req = urllib.request.Request("http://127.0.0.1:%s/requests/status.xml" % sys.argv[1])
req.add_header("Authorization", "Basic " + base64.b64encode((":" + sys.argv[2]).encode()).decode())
try:
    with urllib.request.urlopen(req, timeout=10) as r:
        sys.stdout.buffer.write(r.read())
except Exception as exc:
    print("vlc status: %s" % exc, file=sys.stderr)
    sys.exit(3)
"""


@getter("vlc_playing_info")
async def vlc_playing_info(config: dict[str, Any], env: GetterEnv) -> Any:
    args = [str(env.ctx.vlc_http_port), env.ctx.vlc_http_password]
    rc, out, err = await run_python(env, _VLC_STATUS_SCRIPT, args)
    if rc != 0:
        # OSWorld hands its metric None here, on which is_vlc_playing crashes; VLC not answering
        # means nothing plays: a missing result, scored 0.
        if env.role == "result":
            raise ResultMissing(f"VLC's HTTP interface did not answer: {err.strip()[-200:]}")
        return None
    return FileArg(env.file_name(config.get("dest", "status.xml")), out.encode())


# ---- slides ----------------------------------------------------------------------------------

_REL_NS = {"r": "http://schemas.openxmlformats.org/package/2006/relationships"}
_BG_PR = "{http://schemas.openxmlformats.org/presentationml/2006/main}bgPr"
_BLIP = "{http://schemas.openxmlformats.org/drawingml/2006/main}blip"
_EMBED = "{http://schemas.openxmlformats.org/officeDocument/2006/relationships}embed"


@dataclass
class SlideMedia:
    """What a slide points at: bytes inside the .pptx, or a file outside it (a path)."""

    name: str
    data: bytes | None = None
    external: str | None = None


def _relationships(pptx: zipfile.ZipFile, slide_no: int) -> list[ET.Element]:
    rels = f"ppt/slides/_rels/slide{slide_no}.xml.rels"
    if rels not in pptx.namelist():
        return []
    return ET.fromstring(pptx.read(rels)).findall("r:Relationship", _REL_NS)


def _resolve(pptx: zipfile.ZipFile, rel: ET.Element) -> SlideMedia | None:
    target = rel.attrib.get("Target", "")
    if rel.attrib.get("TargetMode") == "External" or target.startswith("file://"):
        return SlideMedia(posixpath.basename(target), external=target.removeprefix("file://"))
    inner = posixpath.normpath(posixpath.join("ppt/slides", target))
    if inner not in pptx.namelist():
        return None
    return SlideMedia(posixpath.basename(inner), data=pptx.read(inner))


def slide_audio(pptx_bytes: bytes, slide_index: int) -> SlideMedia | None:
    """The first audio a slide links (OSWorld assumes one), embedded or external."""
    with zipfile.ZipFile(BytesIO(pptx_bytes)) as pptx:
        for rel in _relationships(pptx, slide_index + 1):
            if "audio" in rel.attrib.get("Type", ""):
                return _resolve(pptx, rel)
    return None


def slide_background_image(pptx_bytes: bytes, slide_index: int) -> SlideMedia | None:
    """The image a slide's background (`p:bgPr`) fills with, embedded or external."""
    with zipfile.ZipFile(BytesIO(pptx_bytes)) as pptx:
        slide = f"ppt/slides/slide{slide_index + 1}.xml"
        if slide not in pptx.namelist():
            return None
        image_id = None
        for background in ET.fromstring(pptx.read(slide)).iter(_BG_PR):
            blip = next(background.iter(_BLIP), None)
            if blip is not None and _EMBED in blip.attrib:
                image_id = blip.attrib[_EMBED]
                break
        if image_id is None:
            return None
        for rel in _relationships(pptx, slide_index + 1):
            if rel.attrib.get("Id") == image_id and "image" in rel.attrib.get("Type", ""):
                return _resolve(pptx, rel)
    return None


async def _slide_media(config: dict[str, Any], env: GetterEnv, find: Any) -> Any:
    path = config["ppt_file_path"]
    data = await _read(env, path)
    if data is None:
        if env.role == "result":
            raise ResultMissing(f"presentation {path} does not exist in the slot")
        return None
    try:
        media = await trio.to_thread.run_sync(find, data, int(config["slide_index"]))
    except (zipfile.BadZipFile, ET.ParseError, KeyError) as exc:
        raise ResultMissing(f"{path} is not a readable .pptx: {exc}") from exc
    if media is None:
        return None  # OSWorld: the slide has none -> None
    if media.external is not None:
        media.data = await _read(env, media.external)
        if media.data is None:
            return None
    return FileArg(env.file_name(config["dest"]), media.data)


@getter("audio_in_slide")
async def audio_in_slide(config: dict[str, Any], env: GetterEnv) -> Any:
    return await _slide_media(config, env, slide_audio)


@getter("background_image_in_slide")
async def background_image_in_slide(config: dict[str, Any], env: GetterEnv) -> Any:
    return await _slide_media(config, env, slide_background_image)
