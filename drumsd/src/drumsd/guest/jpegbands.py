"""JPEG from bands of rows encoded independently and joined with restart markers, so a frame
that changed in a few bands costs the encode of those bands only.

A restart marker resets the decoder's DC predictors and starts the entropy coder byte-aligned:
exactly the state at the start of a scan. A band encoded on its own by Pillow's libjpeg-turbo
(same quality, 4:2:0, the standard Huffman tables: the same DQT and DHT every time) is therefore,
between its SOS and EOI, the segment that follows a restart marker in the whole image. The file is
the first band's headers with the SOF's height set to the image's, a DRI segment (one restart
interval per band), then the bands' segments separated by RST0..RST7 in turn. Decoded, it gives
the same pixels as the whole image encoded at once (tests/test_screen_encoders.py checks this).

Bands are one MCU row (16 at 4:2:0): a typed character re-encodes one or two 16-row bands of
the image's width (at 1280 wide ~0.05 ms each; a band of 48 rows cost 0.12 ms).
"""

from __future__ import annotations

import io
import math
import struct
from typing import Any

MCU = 16  # pixels per MCU side at 4:2:0
BAND_ROWS = 16
SUBSAMPLING_420 = 2  # Pillow's code for 4:2:0


class JpegLayoutError(ValueError):
    """A band's JPEG is not laid out as the joiner expects (a Pillow it was not written for)."""


def encode_band(image: Any, quality: int) -> bytes:
    """One band (a Pillow RGB image, BAND_ROWS high except the last) as its own JPEG."""
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality, subsampling=SUBSAMPLING_420)
    return buf.getvalue()


def split(jpeg: bytes) -> tuple[bytes, bytes]:
    """(the headers up to and including the SOS segment, the entropy-coded data before EOI)."""
    if jpeg[:2] != b"\xff\xd8" or jpeg[-2:] != b"\xff\xd9":
        raise JpegLayoutError("not a whole baseline JPEG (no SOI or EOI)")
    i = 2
    while i + 4 <= len(jpeg):
        if jpeg[i] != 0xFF:
            raise JpegLayoutError(f"no marker at byte {i}")
        marker = jpeg[i + 1]
        length = struct.unpack_from(">H", jpeg, i + 2)[0]
        if marker == 0xDA:  # SOS: the scan's data follows its header
            end = i + 2 + length
            return jpeg[:end], jpeg[end:-2]
        if marker == 0xDD:
            raise JpegLayoutError("the band already has restart markers")
        i += 2 + length
    raise JpegLayoutError("no SOS segment")


def join(header: bytes, width: int, height: int, scans: list[bytes]) -> bytes:
    """The image of `height` rows from the first band's headers and every band's scan data."""
    sof = header.find(b"\xff\xc0")
    sos = header.rfind(b"\xff\xda")
    if sof < 0 or sos < 0:
        raise JpegLayoutError("no baseline SOF0 or SOS in the band's headers")
    interval = math.ceil(width / MCU) * (BAND_ROWS // MCU)
    patched = bytearray(header)
    struct.pack_into(">H", patched, sof + 5, height)  # FF C0, length, precision, then height
    dri = b"\xff\xdd\x00\x04" + struct.pack(">H", interval)
    parts = [bytes(patched[:sos]), dri, bytes(patched[sos:]), scans[0]]
    for n, scan in enumerate(scans[1:]):
        parts.append(bytes((0xFF, 0xD0 + n % 8)))
        parts.append(scan)
    parts.append(b"\xff\xd9")
    return b"".join(parts)
