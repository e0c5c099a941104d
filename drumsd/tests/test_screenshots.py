"""Screenshot options, encoding and the guest's change cache (unit: no desktop), and the API's
screenshot parameters through the real app on the in-memory runtime."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from drumsd.guest import screen
from drumsd.guest.framebuffer import Frame
from drumsd.guest.protocol import PNG_FULL, ProtocolError, ShotSpec, parse_shot
from harness import Api, create, error_of, open_api
from PIL import Image

# ---------------------------------------------------------------- parsing


def test_no_options_is_the_full_png() -> None:
    assert parse_shot(None) is PNG_FULL
    assert parse_shot({}) is PNG_FULL
    assert PNG_FULL.content_type == "image/png" and PNG_FULL.to_request() == {}


@pytest.mark.parametrize(
    ("raw", "spec"),
    [
        ({"format": "jpeg"}, ShotSpec("jpeg", 80)),
        ({"format": "JPG", "quality": "55"}, ShotSpec("jpeg", 55)),  # query strings are text
        ({"format": "webp", "quality": 1}, ShotSpec("webp", 1)),
        ({"width": 1280, "height": 720}, ShotSpec("png", None, 1280, 720)),
        ({"format": "png", "width": "960"}, ShotSpec("png", None, 960, None)),
    ],
)
def test_good_options(raw: dict, spec: ShotSpec) -> None:
    assert parse_shot(raw) == spec
    assert parse_shot(spec.to_request()) == spec, "a spec survives the trip to the guest"


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"format": "gif"}, "format", "not one of png, jpeg, webp"),
        ({"format": 3}, "format", "not one of"),
        ({"format": "jpeg", "quality": 0}, "quality", "within [1, 100]"),
        ({"format": "webp", "quality": 101}, "quality", "within [1, 100]"),
        ({"format": "jpeg", "quality": "high"}, "quality", "must be an integer"),
        ({"format": "jpeg", "quality": 7.5}, "quality", "must be an integer"),
        ({"quality": 50}, "quality", "not to png"),
        ({"width": 4000}, "width", "within [16, 1920]"),
        ({"height": 0}, "height", "within [16, 1080]"),
        ({"width": True}, "width", "must be an integer"),
        ({"scale": 0.5}, "scale", "unknown parameter(s) scale"),
    ],
)
def test_bad_options_name_the_parameter(raw: dict, field: str, words: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_shot(raw)
    assert err.value.code == "invalid_action" and err.value.field == field
    assert words in err.value.message, err.value.message


def test_size_keeps_the_aspect_ratio_when_one_side_is_given() -> None:
    assert ShotSpec().size_for(1920, 1080) == (1920, 1080)
    assert ShotSpec(width=1280).size_for(1920, 1080) == (1280, 720)
    assert ShotSpec(height=540).size_for(1920, 1080) == (960, 540)
    assert ShotSpec(width=1000, height=1000).size_for(1920, 1080) == (1000, 1000)


# ---------------------------------------------------------------- encoding and the cache


def desktop(width: int = 1920, height: int = 1080) -> Image.Image:
    image = Image.new("RGB", (width, height), (40, 60, 90))
    image.paste((230, 230, 230), (100, 100, 900, 700))  # a window
    image.paste((10, 10, 10), (120, 130, 500, 150))  # a line of text
    return image


@pytest.mark.parametrize(
    ("spec", "pil_format", "size"),
    [
        (PNG_FULL, "PNG", (1920, 1080)),
        (ShotSpec("jpeg", 70), "JPEG", (1920, 1080)),
        (ShotSpec("webp", 70, 1280), "WEBP", (1280, 720)),
        (ShotSpec("png", None, 640, 480), "PNG", (640, 480)),
    ],
)
def test_encode_gives_the_format_and_size_asked_for(
    spec: ShotSpec, pil_format: str, size: tuple[int, int]
) -> None:
    data, w, h = screen.encode(desktop(), spec)
    decoded = Image.open(io.BytesIO(data))
    assert decoded.format == pil_format and decoded.size == size == (w, h)


class FakeX(screen.Screen):
    """The agent's Screen with the X framebuffer replaced by an image the test changes."""

    def __init__(self) -> None:
        super().__init__(":0")
        self.image = desktop()
        self.use_damage = False  # no X server: every band is checked

    @contextmanager
    def _frame(self) -> Iterator[Frame]:
        w, h = self.image.size
        yield Frame(w, h, w * 4, "fake", buffer=self.image.tobytes("raw", "BGRX"))

    def _legacy_image(self) -> Image.Image:
        return self.image.copy()


def test_an_unchanged_screen_returns_the_cached_encoding_per_spec() -> None:
    screen = FakeX()
    first = screen.grab(PNG_FULL)
    assert not first.cached and screen.encodes == 1
    again = screen.grab(PNG_FULL)
    assert again.cached and again.data is first.data and screen.encodes == 1
    small = screen.grab(ShotSpec("jpeg", 60, 640))
    assert not small.cached and (small.width, small.height) == (640, 360)
    assert screen.grab(ShotSpec("jpeg", 60, 640)).cached and screen.encodes == 2
    assert screen.grab(PNG_FULL).cached, "each spec keeps its encoding of the frame"

    screen.image.putpixel((5, 5), (255, 0, 0))  # one pixel changes
    changed = screen.grab(PNG_FULL)
    assert not changed.cached and changed.data != first.data and screen.encodes == 3
    assert not screen.grab(ShotSpec("jpeg", 60, 640)).cached, "a new frame drops old encodings"


def test_a_fresh_grab_always_encodes() -> None:
    screen = FakeX()
    screen.grab(PNG_FULL)
    assert not screen.grab(PNG_FULL, fresh=True).cached and screen.encodes == 2
    assert screen.grab(PNG_FULL).cached, "a fresh grab leaves the cache as it was"
    assert screen.encodes == 2


def test_the_cache_holds_a_bounded_number_of_specs() -> None:
    screen = FakeX()
    for width in range(100, 100 + 10 * (screen.MAX_CACHED_SPECS + 2), 10):
        screen.grab(ShotSpec("png", None, width))
    assert len(screen.encoded) == screen.MAX_CACHED_SPECS


# ---------------------------------------------------------------- the API


@pytest.fixture
async def api(tmp_path) -> Api:
    async with open_api(tmp_path) as a:
        yield a


async def test_screenshot_query_gives_format_and_size(api: Api) -> None:
    sid = (await create(api))["id"]
    c = api.client
    r = await c.get(f"/v1/slots/{sid}/screenshot", params={"format": "jpeg", "width": "640"})
    assert r.status_code == 200 and r.headers["content-type"] == "image/jpeg"
    image = Image.open(io.BytesIO(r.content))
    assert image.format == "JPEG" and image.size == (640, 360)
    assert r.headers["x-drums-screenshot-width"] == "640"
    again = await c.get(f"/v1/slots/{sid}/screenshot", params={"format": "jpeg", "width": "640"})
    assert again.headers["x-drums-screenshot-cached"] == "true"
    r = await c.get(f"/v1/slots/{sid}/screenshot", params={"format": "webp", "quality": "50"})
    assert Image.open(io.BytesIO(r.content)).format == "WEBP"
    plain = await c.get(f"/v1/slots/{sid}/screenshot")
    assert plain.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(plain.content)).size == tuple(api.runtime.screen)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"format": "bmp"}, "format"),
        ({"format": "jpeg", "quality": "0"}, "quality"),
        ({"quality": "80"}, "quality"),
        ({"width": "99999"}, "width"),
        ({"height": "tall"}, "height"),
    ],
)
async def test_bad_screenshot_query_is_422_naming_it(api: Api, params: dict, field: str) -> None:
    sid = (await create(api))["id"]
    err = error_of(
        await api.client.get(f"/v1/slots/{sid}/screenshot", params=params), 422, "invalid_request"
    )
    assert err["detail"]["field"] == field and field in err["message"], err


async def test_step_screenshot_options(api: Api) -> None:
    sid = (await create(api))["id"]
    r = await api.client.post(
        f"/v1/slots/{sid}/step",
        json={
            "action": {"type": "move", "x": 5, "y": 5},
            "screenshot_options": {"format": "webp", "quality": 60, "height": 540},
        },
    )
    step = r.json()
    assert r.status_code == 200 and step["screenshot_png_b64"] is None, step
    assert step["screenshot_content_type"] == "image/webp" and step["screenshot_cached"] is False
    image = Image.open(io.BytesIO(base64.b64decode(step["screenshot_b64"])))
    assert image.format == "WEBP" and image.size == (960, 540)
    plain = (
        await api.client.post(
            f"/v1/slots/{sid}/step",
            json={"action": {"type": "move", "x": 6, "y": 6}, "screenshot": True},
        )
    ).json()
    assert plain["screenshot_content_type"] == "image/png" and plain["screenshot_b64"] is None
    assert base64.b64decode(plain["screenshot_png_b64"]).startswith(b"\x89PNG")


async def test_a_bad_step_screenshot_option_is_422_and_runs_no_action(api: Api) -> None:
    sid = (await create(api))["id"]
    r = await api.client.post(
        f"/v1/slots/{sid}/step",
        json={"action": {"type": "move", "x": 5, "y": 5}, "screenshot_options": {"format": "tiff"}},
    )
    err = error_of(r, 422, "invalid_request")
    assert err["detail"]["field"] == "screenshot_options.format", err
    assert api.sup.slots[sid].actions == 0, "the action did not run"
