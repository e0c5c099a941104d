"""CRIU's image framing, read and written without CRIU (pure): two 4-byte magics, then protobuf
messages each after a little-endian u32 size; fields as protobuf varints."""

from __future__ import annotations

from collections.abc import Iterable, Iterator


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


def message_fields(message: bytes, what: str) -> Iterator[tuple[int, int | bytes]]:
    """A protobuf message's fields in order: (number, value), a varint as an int and a
    length-delimited field as its bytes. CRIU's images use no other wire type here: ValueError."""
    at = 0
    while at < len(message):
        key, at = read_varint(message, at)
        kind = key & 7
        if kind == 0:
            value, at = read_varint(message, at)
            yield key >> 3, value
        elif kind == 2:
            size, at = read_varint(message, at)
            yield key >> 3, message[at : at + size]
            at += size
        else:
            raise ValueError(f"{what}: unexpected wire type {kind}")


# CRIU's criu/include/magic.h: most images start with the common magic, then their own
IMG_COMMON_MAGIC = 0x54564319
PAGEMAP_MAGIC = 0x56084025


def varint_bytes(value: int) -> bytes:
    """`value` as a protobuf varint (what `read_varint` reads)."""
    if value < 0:
        raise ValueError(f"a varint is unsigned: {value}")
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def varint_message(fields: Iterable[tuple[int, int]]) -> bytes:
    """A protobuf message of varint fields, (field number, value) in the order given."""
    return b"".join(varint_bytes(number << 3) + varint_bytes(value) for number, value in fields)


def image_bytes(magic: int, messages: Iterable[bytes]) -> bytes:
    """A CRIU image `image_messages` reads: the common magic, `magic`, the size-prefixed
    `messages`."""
    out = bytearray(IMG_COMMON_MAGIC.to_bytes(4, "little") + magic.to_bytes(4, "little"))
    for message in messages:
        out += len(message).to_bytes(4, "little") + message
    return bytes(out)
