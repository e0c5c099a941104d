"""The guest's screen: grabs the X screen and encodes it once per frame and spec.

Answered in the agent's own process (no worker trip); the memory runtime reuses `encode`.
"""

from __future__ import annotations

import io
import time
import zlib
from dataclasses import dataclass
from typing import Any

from . import protocol


@dataclass
class Shot:
    data: bytes
    width: int
    height: int
    cached: bool  # the screen had not changed since the last grab: no encode was done
    grab_s: float
    encode_s: float


class Screen:
    """Grabs the X screen and encodes it once per frame and spec (PNG, JPEG or WebP, scaled).

    Pillow's XCB grab (GetImage in C) on a fresh connection per grab: ~10 ms for 1920x1080 on
    Xvfb, and no X connection stays open in the agent between requests (none may be open when CRIU
    dumps the slot). X damage events would need one, so a change check stands in for them: the
    raw frame's CRC32 (a few ms) is compared with the last grab's, and while it is the same the
    image already encoded for a spec is returned as it is."""

    MAX_CACHED_SPECS = 4

    def __init__(self, display: str) -> None:
        self.display = display
        self.frame_crc: int | None = None
        self.encoded: dict[protocol.ShotSpec, tuple[bytes, int, int]] = {}
        self.grabs = 0
        self.encodes = 0

    def _grab_raw(self, checksum: bool = True) -> tuple[Any, int | None]:
        """The screen as a Pillow image (or a function making one) and a checksum of its raw
        pixels (None without `checksum`)."""
        from PIL import Image, ImageGrab

        grab_x11 = getattr(Image.core, "grabscreen_x11", None)
        if grab_x11 is None:  # a Pillow without the raw call: checksum the decoded pixels
            image = ImageGrab.grab(xdisplay=self.display)
            return image, zlib.crc32(image.tobytes()) if checksum else None
        size, data = grab_x11(self.display)
        crc = zlib.crc32(data, size[0] * 65536 + size[1]) if checksum else None
        return (lambda: Image.frombytes("RGB", size, data, "raw", "BGRX", size[0] * 4, 1)), crc

    def grab(self, spec: protocol.ShotSpec = protocol.PNG_FULL, fresh: bool = False) -> Shot:
        """`fresh`: encode even if the screen is unchanged (what a grab cost before the cache;
        `drumsd bench --screenshots` compares the two in one run)."""
        t0 = time.monotonic()
        raw, crc = self._grab_raw(checksum=not fresh)
        self.grabs += 1
        t1 = time.monotonic()
        if crc is not None and crc == self.frame_crc and spec in self.encoded:
            data, w, h = self.encoded[spec]
            return Shot(data, w, h, True, t1 - t0, 0.0)
        image = raw() if callable(raw) else raw
        data, w, h = encode(image, spec)
        self.encodes += 1
        if crc is None:  # fresh: the cache is left as it was
            return Shot(data, w, h, False, t1 - t0, time.monotonic() - t1)
        if crc != self.frame_crc:
            self.frame_crc = crc
            self.encoded.clear()
        if len(self.encoded) >= self.MAX_CACHED_SPECS:
            self.encoded.pop(next(iter(self.encoded)))
        self.encoded[spec] = (data, w, h)
        return Shot(data, w, h, False, t1 - t0, time.monotonic() - t1)


def encode(image: Any, spec: protocol.ShotSpec) -> tuple[bytes, int, int]:
    """Scale `image` to the spec's size and encode it; returns (bytes, width, height)."""
    from PIL import Image

    if spec.region is not None:  # a zoom: the region at the screen's own resolution
        image = image.crop(spec.region)
    size = spec.size_for(image.width, image.height)
    if size != image.size:
        # BOX (area averaging): antialiased for downscaling and ~30% cheaper than BILINEAR,
        # which costs more than the encode at 1920x1080 -> 1280x720.
        image = image.resize(size, Image.Resampling.BOX)
    buf = io.BytesIO()
    if spec.format == "png":
        # Level 1: desktops are mostly flat colour, so this is small and 3-5x faster than 6.
        image.save(buf, "PNG", compress_level=1)
    elif spec.format == "jpeg":
        image.save(buf, "JPEG", quality=spec.quality)
    else:
        # method 0: the fastest of libwebp's effort levels (the default, 4, costs ~5x more).
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
    }
