"""Screenshots on a real restored desktop, through the daemon and the SDK: formats and sizes
decode as asked, an unchanged screen comes back from the guest's cache (no encode), and a change
on the screen (a character typed into the desktop's xterm) gives a new image. Seconds, on the
session's daemon."""

from __future__ import annotations

import base64
import io

import drums
from live_daemon import Daemon, http_client
from PIL import Image


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def test_formats_cache_and_change(live_daemon: Daemon) -> None:
    with http_client(live_daemon) as http:
        slot = http.post("/v1/slots", json={}).json()
        sid = slot["id"]
        try:
            shot = f"/v1/slots/{sid}/screenshot"
            for params, fmt, size, ctype in [
                ({}, "PNG", (1920, 1080), "image/png"),
                ({"format": "jpeg", "width": "1280"}, "JPEG", (1280, 720), "image/jpeg"),
                ({"format": "webp", "quality": "50", "height": "540"}, "WEBP", (960, 540), None),
                ({"width": "640", "height": "480"}, "PNG", (640, 480), "image/png"),
            ]:
                r = http.get(shot, params=params)
                assert r.status_code == 200, r.text
                image = decoded(r.content)
                assert (image.format, image.size) == (fmt, size), params
                assert r.headers["content-type"] == (ctype or "image/webp")

            first = http.get(shot)
            again = http.get(shot)
            assert again.headers["x-drums-screenshot-cached"] == "true", "screen unchanged"
            assert again.content == first.content

            r = http.get(shot, params={"format": "gif"})
            assert r.status_code == 422 and r.json()["error"]["detail"]["field"] == "format"

            step = http.post(
                f"/v1/slots/{sid}/step",
                json={"action": {"type": "type", "text": "drums"}, "screenshot": True},
            ).json()
            assert step["screenshot_cached"] is False, "typing changed the screen"
            after = base64.b64decode(step["screenshot_png_b64"])
            assert after != first.content
            assert decoded(after).size == (1920, 1080)
            same = http.get(shot)
            assert same.headers["x-drums-screenshot-cached"] == "true"
            assert same.content == after
        finally:
            http.delete(f"/v1/slots/{sid}")


def test_sdk_observe_and_step_with_options(live_daemon: Daemon) -> None:
    with drums.connect(live_daemon.url, token=live_daemon.token) as client:
        with client.create() as env:
            obs = env.observe(format="jpeg", quality=70, width=1280)
            assert obs.content_type == "image/jpeg" and obs.image.size == (1280, 720)
            result = env.step(
                {"type": "type", "text": "x"}, screenshot={"format": "webp", "width": 960}
            )
            image = decoded(result.screenshot_bytes() or b"")
            assert (image.format, image.size) == ("WEBP", (960, 540))
            assert result.screenshot_cached is False
