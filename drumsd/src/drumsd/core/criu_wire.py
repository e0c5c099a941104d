"""CRIU's image framing, read without CRIU (pure): two 4-byte magics, then protobuf messages each
after a little-endian u32 size; fields as protobuf varints."""

from __future__ import annotations

from collections.abc import Iterator


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """A protobuf varint of `data` at `at`: (value, the offset after it). CRIU's images."""
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def image_messages(data: bytes, what: str) -> Iterator[bytes]:
    """The protobuf messages of a CRIU image: two 4-byte magics, then u32-size-prefixed ones."""
    if len(data) < 8:
        raise ValueError(f"{what} is {len(data)} bytes: not a CRIU image")
    at = 8
    while at < len(data):
        if at + 4 > len(data):
            raise ValueError(f"{what}: truncated entry size")
        size = int.from_bytes(data[at : at + 4], "little")
        at += 4
        if at + size > len(data):
            raise ValueError(f"{what}: truncated entry")
        yield data[at : at + size]
        at += size
