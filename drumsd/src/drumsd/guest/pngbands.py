"""PNG from bands of rows deflated independently, so a frame that changed in a few bands costs the
deflate of those bands only.

Each band is a raw deflate stream of its filtered rows ended by a sync flush (byte-aligned, no
final block) from a fresh compressor: its bytes depend on its own rows only, and the bands of the
rows that did not change are reused as they are. The image's zlib stream is a header, the bands
in order, an empty final block and the Adler-32 of all rows, combined from the bands' own.

Filter type 0 (none) on every row and zlib level 1: on desktop frames (flat colour, text) this is
~3x faster than Pillow's PNG at level 1 (which tries all five filters on every row) for ~10-20%
more bytes, measured on 1920x1080 screens in docs/screenshots.md. Stdlib only (runs in the guest).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, "fastest" level hint; (0x7801 % 31 == 0)
FINAL_EMPTY_BLOCK = b"\x03\x00"  # BFINAL=1, fixed Huffman, end-of-block
ADLER_BASE = 65521
LEVEL = 1


@dataclass(frozen=True)
class Band:
    """One band's deflated rows and what the stream's checksum needs from them."""

    deflated: bytes
    adler: int  # Adler-32 of the band's filtered rows
    length: int  # bytes of filtered rows


def adler32_combine(first: int, second: int, second_length: int) -> int:
    """The Adler-32 of two byte strings joined, from each one's and the second's length.
    A = 1 + sum of bytes and B = sum of A over every prefix, both mod 65521: joining adds the
    second's sums, less its initial 1, and shifts B by the first's (A - 1) once per byte."""
    a1, b1 = first & 0xFFFF, first >> 16
    a2, b2 = second & 0xFFFF, second >> 16
    a = (a1 + a2 - 1) % ADLER_BASE
    b = (b1 + b2 + second_length * (a1 - 1)) % ADLER_BASE
    return (b << 16) | a


def filtered_rows(rgb: bytes | memoryview, width: int) -> bytes:
    """RGB rows (3 bytes a pixel) each preceded by PNG filter type 0."""
    stride = width * 3
    view = memoryview(rgb)
    rows = [view[i : i + stride] for i in range(0, len(view), stride)]
    return b"\0" + b"\0".join(rows)


def deflate_band(rgb: bytes | memoryview, width: int) -> Band:
    """A band of RGB rows as an independent piece of the image's zlib stream."""
    raw = filtered_rows(rgb, width)
    compressor = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
    deflated = compressor.compress(raw) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return Band(deflated, zlib.adler32(raw), len(raw))


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (
        struct.pack(">I", len(data))
        + kind
        + data
        + struct.pack(">I", zlib.crc32(data, zlib.crc32(kind)))
    )


def assemble(width: int, height: int, bands: list[Band]) -> bytes:
    """The PNG file (8-bit RGB, not interlaced) of the bands, top to bottom."""
    adler = 1
    for band in bands:
        adler = adler32_combine(adler, band.adler, band.length)
    stream = b"".join(
        [ZLIB_HEADER, *(b.deflated for b in bands), FINAL_EMPTY_BLOCK, struct.pack(">I", adler)]
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"".join(
        [PNG_SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", stream), _chunk(b"IEND", b"")]
    )


def encode_rgb(rgb: bytes | memoryview, width: int, height: int, band_rows: int) -> bytes:
    """A whole image at once (no band reuse): the same stream as the banded path."""
    stride = width * 3
    bands = [
        deflate_band(memoryview(rgb)[y * stride : min(height, y + band_rows) * stride], width)
        for y in range(0, height, band_rows)
    ]
    return assemble(width, height, bands)
