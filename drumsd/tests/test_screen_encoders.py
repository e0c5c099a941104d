"""The guest's screenshot encoders (unit: no desktop): the banded PNG decodes to the exact pixels,
only changed bands are redone, scaled views kept up to date band by band equal a full resize,
each format takes the encoder chosen for it, and the framebuffer's XWD header is read right."""

from __future__ import annotations

import io
import math
import random
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from drumsd.guest import damage, framebuffer, jpegbands, pngbands, screen
from drumsd.guest.framebuffer import Frame, FramebufferMissing
from drumsd.guest.protocol import PNG_FULL, ShotSpec
from PIL import Image, ImageChops, ImageDraw


def desktop(width: int = 1920, height: int = 1080, seed: int = 1) -> Image.Image:
    """Flat colours, windows, text-like strokes and a gradient: what screens are made of."""
    rng = random.Random(seed)
    image = Image.new("RGB", (width, height), (40, 60, 90))
    draw = ImageDraw.Draw(image)
    for x in range(0, width, 7):
        draw.line((x, 0, x, height // 8), fill=(x % 256, 80, 255 - x % 256))
    for _ in range(12):
        x0, y0 = rng.randrange(width), rng.randrange(height)
        draw.rectangle((x0, y0, x0 + rng.randrange(400), y0 + rng.randrange(300)), fill=(235,) * 3)
        for line in range(8):
            draw.text((x0 + 5, y0 + 5 + 14 * line), "drums " * 6, fill=(10, 10, 10))
    return image


def decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def same_pixels(a: Image.Image, b: Image.Image) -> bool:
    return (
        a.size == b.size
        and ImageChops.difference(a.convert("RGB"), b.convert("RGB")).getbbox() is None
    )


# ---------------------------------------------------------------- the banded PNG


@pytest.mark.parametrize(
    "lengths", [(0, 5), (5, 0), (1, 1), (70000, 3), (3, 200000), (99991, 65521)]
)
def test_adler32_combine_is_the_checksum_of_the_joined_bytes(lengths: tuple[int, int]) -> None:
    rng = random.Random(sum(lengths))
    first, second = (bytes(rng.randrange(256) for _ in range(n)) for n in lengths)
    combined = pngbands.adler32_combine(zlib.adler32(first), zlib.adler32(second), len(second))
    assert combined == zlib.adler32(first + second)


@pytest.mark.parametrize(
    ("width", "height", "band_rows"), [(1920, 1080, 24), (17, 5, 2), (1, 1, 24), (333, 100, 7)]
)
def test_banded_png_decodes_to_the_exact_pixels(width: int, height: int, band_rows: int) -> None:
    image = desktop(width, height)
    data = pngbands.encode_rgb(image.tobytes(), width, height, band_rows)
    out = decoded(data)
    assert out.format == "PNG" and out.mode == "RGB" and same_pixels(out, image)
    # and zlib itself agrees on the stream (checksum included)
    idat = data[data.index(b"IDAT") + 4 : data.index(b"IEND") - 8]
    assert len(zlib.decompress(idat)) == height * (width * 3 + 1)


class FakeX(screen.Screen):
    """Screen over an image the test edits, counting deflated bands."""

    def __init__(self, image: Image.Image) -> None:
        super().__init__(":0")
        self.image = image
        self.use_damage = False  # no X server: every band is checked

    @contextmanager
    def _frame(self) -> Iterator[Frame]:
        w, h = self.image.size
        yield Frame(w, h, w * 4, "fake", buffer=self.image.tobytes("raw", "BGRX"))

    def _legacy_image(self) -> Image.Image:
        return self.image.copy()


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = pngbands.deflate_band

    def deflate_band(rgb, width):
        calls.append(width)
        return real(rgb, width)

    monkeypatch.setattr(pngbands, "deflate_band", deflate_band)
    return calls


def test_a_change_redoes_only_its_band_and_the_png_is_the_new_screen(counted: list[int]) -> None:
    x = FakeX(desktop())
    first = x.grab(PNG_FULL)
    bands = -(-1080 // screen.BAND_ROWS)
    assert len(counted) == bands and same_pixels(decoded(first.data), x.image)
    x.image.paste((255, 0, 0), (300, 485, 310, 500))  # a typed character: one band
    counted.clear()
    after = x.grab(PNG_FULL)
    assert len(counted) == 1, f"{len(counted)} bands redeflated for a change inside one"
    assert not after.cached and same_pixels(decoded(after.data), x.image)
    assert x.grab(PNG_FULL).cached and len(counted) == 1
    assert after.data == pngbands.encode_rgb(x.image.tobytes(), 1920, 1080, screen.BAND_ROWS)


class Drawn:
    """DamageWatch's stand-in: answers the rows (whole width) or the box the test says were
    drawn."""

    def __init__(self) -> None:
        self.rows: tuple[int, int] | str | None = damage.EVERYTHING
        self.box: damage.Box | None = None

    def take(self) -> damage.Box | str | None:
        if self.box is not None:
            return self.box
        if isinstance(self.rows, tuple):
            return (0, self.rows[0], 1920, self.rows[1])
        return self.rows


def test_only_bands_x_damage_reports_are_checked_until_the_full_check() -> None:
    x = FakeX(desktop())
    x.use_damage, x.damage = True, Drawn()
    x.grab(PNG_FULL)
    assert x.full_checks == 1
    x.damage.rows = None  # nothing drawn: no band is read, the encoding is the cached one
    x.image.paste((255, 0, 0), (300, 485, 310, 500))  # (a change DAMAGE did not report)
    assert x.grab(PNG_FULL).cached
    x.damage.rows = (490, 492)  # drawn on the band of rows 480..503: it is checked
    shot = x.grab(PNG_FULL)
    assert not shot.cached and same_pixels(decoded(shot.data), x.image)
    x.image.paste((0, 255, 0), (300, 900, 310, 910))
    x.damage.rows = (0, 24)  # drawn elsewhere: the change at row 900 waits for a full check
    assert not same_pixels(decoded(x.grab(PNG_FULL).data), x.image)
    x.full_check_at -= screen.FULL_CHECK_MAX_S + 1
    assert same_pixels(decoded(x.grab(PNG_FULL).data), x.image) and x.full_checks == 2
    x.damage.rows = damage.EVERYTHING  # a lost connection: every band again
    x.image.paste((0, 0, 255), (0, 0, 5, 5))
    assert same_pixels(decoded(x.grab(PNG_FULL).data), x.image) and x.full_checks == 3


def test_grabs_seconds_apart_trust_damage_until_the_net_grab_count() -> None:
    x = FakeX(desktop())
    x.use_damage, x.damage = True, Drawn()
    x.grab(PNG_FULL)
    x.damage.rows = (490, 492)
    for _ in range(40):
        x.full_check_at -= screen.FULL_CHECK_S + 1  # an agent thinking between its steps
        x.grab(PNG_FULL)
    assert x.full_checks == 1 + 40 // screen.FULL_CHECK_GRABS
    for _ in range(3):
        x.full_check_at -= screen.FULL_CHECK_MAX_S + 1  # a minute idle: checked anyway
        x.grab(PNG_FULL)
    assert x.full_checks == 4 + 40 // screen.FULL_CHECK_GRABS


@pytest.mark.parametrize(
    ("width", "height"), [(1280, 720), (1280, 800), (1920, 1080), (1000, 555), (17, 5), (64, 49)]
)
def test_banded_jpeg_decodes_to_the_pixels_of_a_whole_encode(width: int, height: int) -> None:
    image = desktop(width, height)
    rows = jpegbands.BAND_ROWS
    header, scans = b"", []
    for y in range(0, height, rows):
        band_header, scan = jpegbands.split(
            jpegbands.encode_band(image.crop((0, y, width, min(height, y + rows))), 80)
        )
        header = header or band_header
        scans.append(scan)
    joined = jpegbands.join(header, width, height, scans)
    whole = io.BytesIO()
    image.save(whole, "JPEG", quality=80, subsampling=jpegbands.SUBSAMPLING_420)
    out = decoded(joined)
    assert out.format == "JPEG" and out.size == (width, height)
    assert same_pixels(out, decoded(whole.getvalue())), "restart-joined bands decode differently"


def test_a_change_reencodes_only_its_jpeg_band(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = jpegbands.encode_band
    monkeypatch.setattr(
        jpegbands, "encode_band", lambda image, q: calls.append(image.height) or real(image, q)
    )
    x = FakeX(desktop())
    spec = ShotSpec("jpeg", 80, 1280, 720)
    first = decoded(x.grab(spec).data)
    assert len(calls) == 720 // jpegbands.BAND_ROWS and first.size == (1280, 720)
    x.image.paste((255, 0, 0), (300, 485, 310, 500))  # output rows 323..333: one 16-row band
    calls.clear()
    after = x.grab(spec)
    assert len(calls) == 1, f"{len(calls)} JPEG bands re-encoded for a change inside one"
    whole = io.BytesIO()
    x.image.resize((1280, 720), Image.Resampling.BOX).save(whole, "JPEG", quality=80)
    diff = ImageChops.difference(decoded(after.data).convert("RGB"), decoded(whole.getvalue()))
    assert max(hi for _, hi in diff.getextrema()) <= 2, diff.getextrema()


def test_a_band_that_is_not_a_plain_baseline_jpeg_is_refused() -> None:
    with pytest.raises(jpegbands.JpegLayoutError, match="no SOI or EOI"):
        jpegbands.split(b"not a jpeg")


@pytest.fixture
def resized(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The width of every piece of the frame a scaled view resamples."""
    widths: list[int] = []
    real = screen._rgb

    def rgb(frame, y0, y1, x0=0, x1=None):
        image = real(frame, y0, y1, x0, x1)
        widths.append(image.width)
        return image

    monkeypatch.setattr(screen, "_rgb", rgb)
    return widths


def off_pixels(shot: bytes, image: Image.Image, size: tuple[int, int]) -> int:
    """Pixels of the decoded shot more than 1 level off a full BOX resize of `image`."""
    diff = ImageChops.difference(decoded(shot), image.resize(size, Image.Resampling.BOX))
    return sum(diff.convert("L").point(lambda v: 255 if v > 1 else 0).histogram()[255:])


# A part resampled from a box of the frame is a full resize's pixels where the scale is a binary
# fraction (1920 -> 1280, 1080 -> 720: 1.5); elsewhere (1080 -> 800: 1.35) a tap that falls on a
# pixel boundary can round the other way, so an edge row or column of a redone part may average
# one more source row, and stays so until redone: at most the parts' outlines, never a part's
# inside (a stale part would be).
@pytest.mark.parametrize(
    ("size", "exact"), [((1280, 720), True), ((640, 360), True), ((1280, 800), False)]
)
def test_a_scaled_view_redoes_only_the_columns_damage_drew_in(
    size: tuple[int, int], exact: bool, resized: list[int]
) -> None:
    x = FakeX(desktop())
    x.use_damage, x.damage = True, Drawn()
    jpeg, png = ShotSpec("jpeg", 95, *size), ShotSpec("png", None, *size)
    x.grab(png)
    x.full_check_at = math.inf  # no full check on a slow run: DAMAGE's boxes only
    rng = random.Random(11)
    outline = 0
    for step in range(12):  # boxes at the edges and inside; the PNG after a JPEG grab or two
        x0 = rng.choice([0, 1, 2, 299, 300, 1000, 1900])
        y0 = rng.choice([0, 23, 24, 485, 1070])
        x1, y1 = min(1920, x0 + rng.choice([1, 9, 20, 300])), min(1080, y0 + rng.choice([1, 13]))
        x.image.paste((rng.randrange(256), rng.randrange(256), 200), (x0, y0, x1, y1))
        x.damage.box = (x0, y0, x1, y1)
        outline += 2 * ((x1 - x0) * size[0] // 1920 + (y1 - y0) * size[1] // 1080 + 4)
        resized.clear()
        shot = x.grab(png if step % 3 else jpeg)
        assert resized and max(resized) <= (x1 - x0) + 8, f"resampled {resized} for {x1 - x0}"
        if step % 3:
            off = off_pixels(shot.data, x.image, size)
            assert off == 0 if exact else off <= outline, f"{off} pixels off at step {step}"
    x.image.paste((9, 9, 9), (0, 0, 1920, 1))  # not reported, then its band drawn on elsewhere
    x.damage.box = (500, 0, 501, 1)
    x.grab(png)
    x.damage.box, x.damage.rows = None, None
    x.full_check_at = -math.inf  # the full check redoes that band's whole width
    assert off_pixels(x.grab(png).data, x.image, size) <= (0 if exact else outline + size[0])


@pytest.mark.parametrize("size", [(1280, 720), (1024, 768), (1000, 555), (640, 360)])
def test_a_scaled_view_kept_band_by_band_equals_a_full_resize(size: tuple[int, int]) -> None:
    x = FakeX(desktop())
    spec = ShotSpec("png", None, *size)
    x.grab(spec)
    rng = random.Random(7)
    for _ in range(4):  # changes at band edges and inside bands
        y = rng.choice([0, 23, 24, 500, 1079 - 12, 1070])
        x.image.paste((rng.randrange(256), 0, 200), (100, y, 900, min(1080, y + 13)))
        shot = x.grab(spec)
        full = x.image.resize(size, Image.Resampling.BOX)
        diff = ImageChops.difference(decoded(shot.data), full)
        assert max(hi for _, hi in diff.getextrema()) <= 1, "scaled rows drifted from a full resize"


def test_each_format_takes_its_encoder_and_decodes_to_the_size_asked() -> None:
    x = FakeX(desktop())
    png = x.grab(PNG_FULL).data
    idat = png.index(b"IDAT") + 4
    assert png[idat : idat + 2] == pngbands.ZLIB_HEADER, "the full PNG is the banded encoder's"
    legacy = x.grab(PNG_FULL, fresh=True)
    assert legacy.method == "legacy" and same_pixels(decoded(legacy.data), decoded(png))
    for spec, fmt, size in [
        (ShotSpec("jpeg", 80, 1280, 720), "JPEG", (1280, 720)),
        (ShotSpec("jpeg", 60), "JPEG", (1920, 1080)),
        (ShotSpec("webp", 70, 960), "WEBP", (960, 540)),
        (ShotSpec("png", None, 1280, 800), "PNG", (1280, 800)),
        (ShotSpec("png", region=(100, 200, 500, 400)), "PNG", (400, 200)),
    ]:
        shot = x.grab(spec)
        out = decoded(shot.data)
        assert (out.format, out.size, (shot.width, shot.height)) == (fmt, size, size), spec
        reference = decoded(x.grab(spec, fresh=True).data)
        diff = ImageChops.difference(out.convert("RGB"), reference.convert("RGB"))
        assert max(hi for _, hi in diff.getextrema()) <= (0 if fmt == "PNG" else 24), spec


def test_a_zoom_is_the_region_at_full_resolution() -> None:
    x = FakeX(desktop())
    shot = x.grab(ShotSpec("png", region=(10, 20, 330, 260)))
    assert same_pixels(decoded(shot.data), x.image.crop((10, 20, 330, 260)))


def test_without_a_framebuffer_segment_the_grab_falls_back_to_getimage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    image = desktop(64, 48)
    s = screen.Screen(":0")

    @contextmanager
    def missing() -> Iterator[Frame]:
        raise FramebufferMissing("no segment")
        yield  # pragma: no cover

    @contextmanager
    def xcb(display: str) -> Iterator[Frame]:
        yield Frame(64, 48, 256, "xcb", buffer=image.tobytes("raw", "BGRX"))

    monkeypatch.setattr(s.framebuffer, "frame", missing)
    monkeypatch.setattr(screen, "xcb_frame", xcb)
    shot = s.grab(PNG_FULL)
    assert shot.method == "xcb" and not s.use_shm and same_pixels(decoded(shot.data), image)


# ---------------------------------------------------------------- the framebuffer segment


def xwd_header(width: int = 1920, height: int = 1080, depth: int = 24, bpp: int = 32) -> bytes:
    fields = [0] * 25
    fields[0], fields[3], fields[4], fields[5] = 160, depth, width, height
    fields[11], fields[12], fields[14], fields[19] = bpp, width * bpp // 8, 0xFF0000, 256
    return struct.pack(">25I", *fields)


def test_the_xwd_header_gives_the_pixels_offset_and_stride() -> None:
    size = 160 + 256 * 12 + 1920 * 1080 * 4  # what Xvfb -shmem allocates (8297632 bytes)
    layout = framebuffer.parse_xwd_header(xwd_header(), size)
    assert layout == framebuffer.Layout(3232, 1920, 1080, 7680)


@pytest.mark.parametrize(
    ("header", "size", "words"),
    [
        (xwd_header(depth=16, bpp=16), 10**8, "24-bit BGRX only"),
        (xwd_header(), 1000, "overruns"),
        (b"\0" * 10, 10, "too small"),
    ],
)
def test_an_unexpected_framebuffer_is_refused_saying_why(
    header: bytes, size: int, words: str
) -> None:
    with pytest.raises(FramebufferMissing, match=words):
        framebuffer.parse_xwd_header(header, size)


def test_candidate_segments_are_world_readable_and_screen_sized() -> None:
    table = (
        "       key      shmid perms                  size  cpid  lpid nattch   uid\n"
        "         0      65555   777               8297632  1730  1988      1     0\n"
        "         0      65556   600               8297632  1731  1988      4     0\n"
        "         0      65557   644                  4096  1731  1988      4     0\n"
    )
    assert framebuffer.candidate_segments(table) == [(65555, 8297632)]
    look_alike = (
        table + "         0      65558   777               9000000  1999  1988      1     0\n"
    )
    assert framebuffer.candidate_segments(look_alike)[0] == (65558, 9000000), "largest first"
    names = {1730: "Xvfb", 1999: "python3"}
    assert framebuffer.candidate_segments(look_alike, names.get) == [
        (65555, 8297632),
        (65558, 9000000),
    ], "the segment Xvfb created comes before a larger look-alike"
