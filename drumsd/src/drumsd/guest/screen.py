"""The guest's screen: reads the X framebuffer and encodes only what changed since the last grab.

Answered in the agent's own process (no worker trip); the memory runtime reuses `encode`.
"""

from __future__ import annotations

import dataclasses
import io
import math
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from . import jpegbands, pngbands, protocol
from .damage import EVERYTHING, DamageWatch
from .framebuffer import Frame, Framebuffer, FramebufferMissing, xcb_frame

# Rows per band, both for the change check (a CRC32 per band of the raw frame) and for the PNG's
# independently deflated bands. 24 rows of 1920 px: a typed character dirties one or two of 45;
# a multiple of 3, so a band maps to whole rows at the common 1920 -> 1280 scale.
BAND_ROWS = 24
# The net under DAMAGE: every band is checksummed once FULL_CHECK_S and FULL_CHECK_GRABS grabs have
# both passed since the last full check, or FULL_CHECK_MAX_S has. Time alone would make every grab
# a full check (2.4 ms of CRC and 8 MiB read) when an agent thinks for seconds between steps.
FULL_CHECK_S = 2.0
FULL_CHECK_GRABS = 16
FULL_CHECK_MAX_S = 60.0
COLUMN_HISTORY = 4  # per band, the columns of its last changes (older ones merged)


@dataclass
class Shot:
    data: bytes
    width: int
    height: int
    cached: bool  # the screen had not changed since the last grab: no encode was done
    grab_s: float
    encode_s: float
    method: str = ""  # how the frame was read: shm, xcb, or legacy (the path before banding)


@dataclass
class View:
    """What is kept for one output size between grabs: the scaled frame (None at the screen's
    own size: the frame itself is read), its PNG bands, and the frame generation they show."""

    width: int
    height: int
    image: Any = None  # PIL.Image.Image at (width, height) when scaled
    png: list[pngbands.Band | None] = field(default_factory=list)
    # per JPEG quality: the first band's headers and each band's scan data (None: to encode)
    jpeg: dict[int, tuple[bytes, list[bytes | None]]] = field(default_factory=dict)
    generation: int = -1


class Screen:
    """Grabs the X screen and encodes it per spec (PNG, JPEG or WebP, scaled or a region).

    A grab reads Xvfb's framebuffer in place (framebuffer.py; Pillow's GetImage when there is no
    segment) and takes a CRC32 of each band of rows X DAMAGE says were drawn on (damage.py; every
    band when it cannot say, and as a net: FULL_CHECK_*): bands whose CRC is unchanged keep their
    work from the last grab (their rows of each scaled view, their deflated PNG bands, their JPEG
    bands joined by restart markers: jpegbands.py; WebP has no such seam and is encoded whole).
    Without DAMAGE the CRCs of the whole frame cost ~2.5-3.5 ms at 1080p. A scaled view redoes
    only the columns DAMAGE drew in of a changed band (a typed character: ~20 of 1920); a full
    check redoes the whole width of every band changed since the last one, so a change DAMAGE did
    not report is in every view after the next full check. An encoded image is returned again as
    it is while no band changed.

    `fresh` grabs take the path before this (Pillow's GetImage, a full-frame resize and Pillow's
    encoder, no cache): `drumsd bench --screenshots` measures both in one run."""

    MAX_CACHED_SPECS = 4
    MAX_VIEWS = 3

    def __init__(self, display: str) -> None:
        self.display = display
        self.framebuffer = Framebuffer()
        self.use_shm = True
        self.damage = DamageWatch(display)
        self.use_damage = True
        self.full_check_at = 0.0
        self.full_checks = 0
        self.grabs_since_full_check = 0
        self.band_crcs: list[int] = []
        self.band_generation: list[int] = []
        # per band, (generation, x0, x1) of its recent changes, oldest first: a view behind by
        # several generations redoes the union of the columns changed since it was made
        self.band_columns: list[list[tuple[int, int, int]]] = []
        self.since_full_check: set[int] = set()  # bands changed by DAMAGE's columns
        self.frame_size: tuple[int, int] = (0, 0)
        self.generation = 0
        self.views: dict[tuple[int, int], View] = {}
        self.encoded: dict[protocol.ShotSpec, tuple[bytes, int, int, int]] = {}
        self.grabs = 0
        self.encodes = 0

    # ------------------------------------------------ frames

    @contextmanager
    def _frame(self) -> Iterator[Frame]:
        if self.use_shm:
            try:
                with self.framebuffer.frame() as frame:
                    yield frame
                    return
            except FramebufferMissing:
                self.use_shm = False  # this Xvfb has no segment; it will not grow one
        with xcb_frame(self.display) as frame:
            yield frame

    def _legacy_image(self) -> Any:
        from PIL import Image

        size, data = Image.core.grabscreen_x11(self.display)
        return Image.frombytes("RGB", size, data, "raw", "BGRX", size[0] * 4, 1)

    def _bands_to_check(self, frame: Frame) -> tuple[range, tuple[int, int] | None]:
        """The bands X DAMAGE says were drawn on and the columns it drew in (no band and (0, 0)
        when nothing was drawn; all bands and None when it cannot say, the frame's size changed,
        or the net's time and grabs passed since the last full check: FULL_CHECK_*)."""
        bands = math.ceil(frame.height / BAND_ROWS)
        drawn = self.damage.take() if self.use_damage else EVERYTHING
        now = time.monotonic()
        self.grabs_since_full_check += 1
        since = now - self.full_check_at
        if (
            drawn == EVERYTHING
            or (frame.width, frame.height) != self.frame_size
            or (since > FULL_CHECK_S and self.grabs_since_full_check >= FULL_CHECK_GRABS)
            or since > FULL_CHECK_MAX_S
        ):
            self.full_check_at = now
            self.full_checks += 1
            self.grabs_since_full_check = 0
            return range(bands), None
        if drawn is None:
            return range(0), (0, 0)
        assert isinstance(drawn, tuple)
        x0, y0, x1, y1 = drawn
        rows = range(y0 // BAND_ROWS, min(bands, math.ceil(y1 / BAND_ROWS)))
        columns = (min(x0, frame.width), min(x1, frame.width))
        return rows, columns if columns[0] < columns[1] else (0, frame.width)

    def _note_changes(self, frame: Frame) -> None:
        """CRC the bands drawn on; bands that differ from the last grab get the new generation."""
        size = (frame.width, frame.height)
        check, columns = self._bands_to_check(frame)
        crcs = list(self.band_crcs) if size == self.frame_size else []
        if columns is None:
            crcs = [
                zlib.crc32(frame.rows(y, min(frame.height, y + BAND_ROWS)))
                for y in range(0, frame.height, BAND_ROWS)
            ]
        else:
            for i in check:
                crcs[i] = zlib.crc32(
                    frame.rows(i * BAND_ROWS, min(frame.height, (i + 1) * BAND_ROWS))
                )
        if size != self.frame_size:
            self.frame_size = size
            self.views.clear()
            self.generation += 1
            self.band_generation = [self.generation] * len(crcs)
            self.band_columns = [[(self.generation, 0, frame.width)] for _ in crcs]
            self.since_full_check.clear()
            self.band_crcs = crcs
            return
        changed = {
            i for i, (new, old) in enumerate(zip(crcs, self.band_crcs, strict=True)) if new != old
        }
        if columns is None:  # a full check: the width of every band changed since the last one
            changed |= self.since_full_check
            self.since_full_check.clear()
        else:
            self.since_full_check |= changed
        if changed:
            self.generation += 1
            for i in changed:
                self.band_generation[i] = self.generation
                self._note_columns(i, columns or (0, frame.width))
        self.band_crcs = crcs

    def _note_columns(self, band: int, columns: tuple[int, int]) -> None:
        history = self.band_columns[band]
        history.append((self.generation, *columns))
        if len(history) > COLUMN_HISTORY:  # the two oldest as one: their union, the newer's mark
            (_, a0, a1), (g, b0, b1) = history[0], history[1]
            history[:2] = [(g, min(a0, b0), max(a1, b1))]

    def _columns_since(self, band: int, generation: int) -> tuple[int, int]:
        """The columns of the band changed after `generation` (a superset)."""
        spans = [(x0, x1) for g, x0, x1 in self.band_columns[band] if g > generation]
        if not spans:
            return 0, self.frame_size[0]
        return min(x0 for x0, _ in spans), max(x1 for _, x1 in spans)

    # ------------------------------------------------ grabs

    def grab(self, spec: protocol.ShotSpec = protocol.PNG_FULL, fresh: bool = False) -> Shot:
        t0 = time.monotonic()
        if fresh:
            image = self._legacy_image()
            t1 = time.monotonic()
            data, w, h = encode_legacy(image, spec)
            self.grabs += 1
            self.encodes += 1
            return Shot(data, w, h, False, t1 - t0, time.monotonic() - t1, "legacy")
        with self._frame() as frame:
            self._note_changes(frame)
            self.grabs += 1
            t1 = time.monotonic()
            hit = self.encoded.get(spec)
            if hit is not None and hit[3] == self.generation:
                return Shot(hit[0], hit[1], hit[2], True, t1 - t0, 0.0, frame.method)
            data, w, h = self._encode(frame, spec)
        self.encodes += 1
        self.encoded.pop(spec, None)
        if len(self.encoded) >= self.MAX_CACHED_SPECS:
            self.encoded.pop(next(iter(self.encoded)))
        self.encoded[spec] = (data, w, h, self.generation)
        return Shot(data, w, h, False, t1 - t0, time.monotonic() - t1, frame.method)

    def _encode(self, frame: Frame, spec: protocol.ShotSpec) -> tuple[bytes, int, int]:
        if spec.region is not None:  # a zoom: the region at the screen's own resolution, once
            x0, y0, x1, y1 = spec.region
            image = _rgb(frame, y0, y1).crop((x0, 0, x1, y1 - y0))
            return encode(image, dataclasses.replace(spec, region=None))
        view = self._view(spec.size_for(frame.width, frame.height))
        for j0, j1 in self._update(view, frame):
            for i in range(j0 // BAND_ROWS, (j1 - 1) // BAND_ROWS + 1):
                view.png[i] = None
            for _, scans in view.jpeg.values():
                for i in range(j0 // jpegbands.BAND_ROWS, (j1 - 1) // jpegbands.BAND_ROWS + 1):
                    scans[i] = None
        if spec.format == "jpeg":
            assert spec.quality is not None
            return self._jpeg(view, frame, spec.quality), view.width, view.height
        if spec.format == "png":
            for i, band in enumerate(view.png):
                if band is None:
                    y0, y1 = i * BAND_ROWS, min(view.height, (i + 1) * BAND_ROWS)
                    if view.image is None:
                        rgb = _rgb(frame, y0, y1).tobytes()
                    else:
                        rgb = view.image.crop((0, y0, view.width, y1)).tobytes()
                    view.png[i] = pngbands.deflate_band(rgb, view.width)
            bands = [b for b in view.png if b is not None]
            return pngbands.assemble(view.width, view.height, bands), view.width, view.height
        image = view.image if view.image is not None else _rgb(frame, 0, frame.height)
        return encode(image, spec)

    def _jpeg(self, view: View, frame: Frame, quality: int) -> bytes:
        """The view as a JPEG of restart-joined bands, encoding only bands not kept."""
        rows = jpegbands.BAND_ROWS
        if quality not in view.jpeg:
            if len(view.jpeg) >= 2:
                view.jpeg.pop(next(iter(view.jpeg)))
            view.jpeg[quality] = (b"", [None] * math.ceil(view.height / rows))
        header, scans = view.jpeg[quality]
        for i, scan in enumerate(scans):
            if scan is None:
                y0, y1 = i * rows, min(view.height, (i + 1) * rows)
                if view.image is None:
                    band = _rgb(frame, y0, y1)
                else:
                    band = view.image.crop((0, y0, view.width, y1))
                band_header, scans[i] = jpegbands.split(jpegbands.encode_band(band, quality))
                if i == 0:
                    header = band_header
        view.jpeg[quality] = (header, scans)
        return jpegbands.join(header, view.width, view.height, [s for s in scans if s is not None])

    def _view(self, size: tuple[int, int]) -> View:
        view = self.views.pop(size, None)
        if view is None:
            view = View(*size, png=[None] * math.ceil(size[1] / BAND_ROWS))
            if len(self.views) >= self.MAX_VIEWS:
                self.views.pop(next(iter(self.views)))
        self.views[size] = view  # most recently used last
        return view

    def _update(self, view: View, frame: Frame) -> list[tuple[int, int]]:
        """Bring the view to the frame's generation; returns the view's rows that changed."""
        changed = [i for i, g in enumerate(self.band_generation) if g > view.generation]
        since, view.generation = view.generation, self.generation
        if not changed:
            return []
        if (view.width, view.height) == (frame.width, frame.height):
            return _runs(changed, frame.height)  # same rows, same bands
        from PIL import Image

        if view.image is None:
            view.image = Image.new("RGB", (view.width, view.height))
        sx, sy = view.width / frame.width, view.height / frame.height
        dirty: list[tuple[int, int]] = []
        for y0, y1 in _runs(changed, frame.height):
            spans = [self._columns_since(i, since) for i in range(y0 // BAND_ROWS, _band_end(y1))]
            x0, x1 = min(a for a, _ in spans), max(b for _, b in spans)
            # BOX resampling: output pixel (k, j) reads the source box [k / sx, (k + 1) / sx) x
            # [j / sy, (j + 1) / sy), so only the output pixels over the changed source box are
            # redone, from that box (+1 pixel of margin).
            j0, j1 = math.floor(y0 * sy), min(view.height, math.ceil(y1 * sy))
            k0, k1 = math.floor(x0 * sx), min(view.width, math.ceil(x1 * sx))
            r0 = max(0, math.floor(j0 / sy) - 1)
            r1 = min(frame.height, math.ceil(j1 / sy) + 1)
            c0 = max(0, math.floor(k0 / sx) - 1)
            c1 = min(frame.width, math.ceil(k1 / sx) + 1)
            box = (k0 / sx - c0, j0 / sy - r0, k1 / sx - c0, j1 / sy - r0)
            part = _rgb(frame, r0, r1, c0, c1).resize(
                (k1 - k0, j1 - j0), Image.Resampling.BOX, box=box
            )
            view.image.paste(part, (k0, j0))
            dirty.append((j0, j1))
        return dirty


def _band_end(y1: int) -> int:
    return math.ceil(y1 / BAND_ROWS)


def _runs(bands: list[int], height: int) -> list[tuple[int, int]]:
    """Changed band indexes as row ranges, neighbours merged."""
    runs: list[tuple[int, int]] = []
    for i in bands:
        y0, y1 = i * BAND_ROWS, min(height, (i + 1) * BAND_ROWS)
        if runs and runs[-1][1] == y0:
            runs[-1] = (runs[-1][0], y1)
        else:
            runs.append((y0, y1))
    return runs


def _rgb(frame: Frame, y0: int, y1: int, x0: int = 0, x1: int | None = None) -> Any:
    """Rows y0..y1 (columns x0..x1) of the frame as an RGB image (the BGRX -> RGB conversion in
    Pillow's C, reading the frame in place)."""
    from PIL import Image

    width = (frame.width if x1 is None else x1) - x0
    return Image.frombytes(
        "RGB", (width, y1 - y0), frame.rows(y0, y1, x0), "raw", "BGRX", frame.stride, 1
    )


def encode(image: Any, spec: protocol.ShotSpec) -> tuple[bytes, int, int]:
    """Scale `image` to the spec's size and encode it with the fast encoders; returns (bytes,
    width, height). PNG: pngbands (filter none, zlib level 1); JPEG: Pillow's libjpeg-turbo;
    WebP: libwebp at its fastest method."""
    from PIL import Image

    if spec.region is not None:
        image = image.crop(spec.region)
    size = spec.size_for(image.width, image.height)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BOX)
    if spec.format == "png":
        rgb = image.convert("RGB") if image.mode != "RGB" else image
        return pngbands.encode_rgb(rgb.tobytes(), *rgb.size, BAND_ROWS), image.width, image.height
    buf = io.BytesIO()
    if spec.format == "jpeg":
        image.save(buf, "JPEG", quality=spec.quality)
    else:
        # method 0: the fastest of libwebp's effort levels (the default, 4, costs ~5x more).
        image.save(buf, "WEBP", quality=spec.quality, method=0)
    return buf.getvalue(), image.width, image.height


def encode_legacy(image: Any, spec: protocol.ShotSpec) -> tuple[bytes, int, int]:
    """The encoder before pngbands (the bench's baseline): Pillow's PNG at level 1."""
    from PIL import Image

    if spec.region is not None:
        image = image.crop(spec.region)
    size = spec.size_for(image.width, image.height)
    if size != image.size:
        image = image.resize(size, Image.Resampling.BOX)
    buf = io.BytesIO()
    if spec.format == "png":
        image.save(buf, "PNG", compress_level=1)
    elif spec.format == "jpeg":
        image.save(buf, "JPEG", quality=spec.quality)
    else:
        image.save(buf, "WEBP", quality=spec.quality, method=0)
    return buf.getvalue(), image.width, image.height


def shot_header(spec: protocol.ShotSpec, shot: Shot) -> dict[str, Any]:
    return {
        "content_type": spec.content_type,
        "width": shot.width,
        "height": shot.height,
        "cached": shot.cached,
        "grab_s": round(shot.grab_s, 4),
        "encode_s": round(shot.encode_s, 4),
        "grab_method": shot.method,
    }
